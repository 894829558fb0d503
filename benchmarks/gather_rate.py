"""How fast the GPU's own kernels read expert rows out of mapped host memory, against the copy engine.

A direct-read decode step moves its missing experts with the gather's copy kernel
(kernels/publish_ids.gather_copy): the ids are known only on the device, so the copy engine cannot
take them. The cost model measured that kernel at 20-24 GB/s on the H100 host, against 55 GB/s for
the copy engine; this benchmark times it, with more programs, smaller chunks and an unmasked wide
variant, on the same rows, to find whether the gap is the kernel's or the bus's.

The store can lie in three kinds of page-locked memory (--backings): "pinned" (PyTorch's pinned
allocator), "registered" (ordinary memory registered in place, as the engine's host store is) and
"thp" (the same, on transparent huge pages: 2 MiB pages, which the GPU and the CPU translate 512 times
less often than 4 KiB ones). For each, the CPU's expert kernel is timed on the same rows as well.

    python benchmarks/gather_rate.py --rows 8,64 --backings pinned,registered,thp --out gather_rate.json
"""
from __future__ import annotations

import argparse
import mmap
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import environment, write_result  # noqa: E402
from kernels._triton import cdiv, jit, tl  # noqa: E402
from kernels.publish_ids import gather_copy  # noqa: E402
from kernels.expert_layout import ExpertLayout  # noqa: E402
from engine.experts.store import huge_page_bytes  # noqa: E402

HUGE = 2 << 20

EXPERT_BYTES = 2469888          # one int4 expert of the kit's Qwen3 shape (hidden 2048, FFN 768)


@jit
def _wide_kernel(rows, pool, work, W, NCHUNK, NPROG, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # int64 words; every chunk but a row's last is whole, so its blocks load without a mask
    n = tl.load(work)
    offs = tl.arange(0, BLOCK)
    for u in range(tl.program_id(0), n * NCHUNK, NPROG):
        item = u // NCHUNK
        c = u % NCHUNK
        src = rows + tl.load(work + 2 + 2 * item) * W
        dst = pool + tl.load(work + 1 + 2 * item) * W
        start = c * CHUNK
        if start + CHUNK <= W:
            for w0 in range(start, start + CHUNK, BLOCK):
                o = tl.multiple_of(w0, BLOCK) + offs
                tl.store(dst + o, tl.load(src + o))
        else:
            for w0 in range(start, W, BLOCK):
                o = w0 + offs
                tl.store(dst + o, tl.load(src + o, mask=o < W), mask=o < W)


def wide_copy(work, rows, pool, chunk, block, programs, warps):
    rows64, pool64 = rows.view(torch.int64), pool.view(torch.int64)
    w = rows64.shape[1]
    _wide_kernel[(programs,)](rows64, pool64, work, w, cdiv(w, chunk), programs, CHUNK=chunk, BLOCK=block,
                              num_warps=warps)


def timed(fn, repeats: int, before) -> float:
    """Best of ``repeats`` runs of ``fn`` after one untimed one; ``before(i)`` (untimed) picks run i's rows."""
    before(0)
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for i in range(repeats):
        before(i + 1)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return best


def thp_settings() -> dict:
    out = {}
    for name in ("enabled", "defrag"):
        try:
            out[name] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError:
            out[name] = None
    return out


def make_store(backing: str, rows: int, keep: list) -> tuple[torch.Tensor, dict]:
    """``uint8 [rows, EXPERT_BYTES]`` page-locked in the way ``backing`` names, filled; and what it got."""
    nbytes = rows * EXPERT_BYTES
    if backing == "pinned":
        store = torch.empty(rows, EXPERT_BYTES, dtype=torch.uint8, pin_memory=True)
    else:
        if backing == "thp":
            m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:          # no transparent huge pages here: the row says how many it got (none)
                pass
            keep.append(m)
            flat = torch.frombuffer(m, dtype=torch.uint8)
            skip = -flat.data_ptr() % HUGE
            store = flat[skip:skip + nbytes].view(rows, EXPERT_BYTES)
        else:
            store = torch.empty(rows, EXPERT_BYTES, dtype=torch.uint8)
    store.view(torch.int32).random_()
    layout = ExpertLayout.make("int4", 2048, 768, 128)
    for sl in layout.tensors:               # finite scales, so the CPU kernel meets ordinary numbers
        if sl.dtype == torch.float16:
            store[:, sl.offset:sl.offset + sl.nbytes].view(torch.float16).fill_(0.01)
    got = {"backing": backing, "huge_pages_mib": huge_page_bytes(store) / 2**20}
    if backing != "pinned":
        err = torch.cuda.cudart().cudaHostRegister(store.data_ptr(), store.numel(), 1 | 2)
        code = int(err.value) if hasattr(err, "value") else int(err)
        if code:
            raise SystemExit(f"cudaHostRegister refused the {backing} store (error {code})")
        keep.append(store)
    return store, got


def cpu_rate(store: torch.Tensor) -> float:
    """GB/s of expert bytes the CPU's kernel streams over 32 distinct rows at one token (int4, the kit's shape)."""
    from kernels.cpu.calibrate import calibrate
    layout = ExpertLayout.make("int4", 2048, 768, 128)
    cost = calibrate(store, layout, list(range(0, min(store.shape[0], 64), 2)), tokens=(1,), repeats=5)
    return cost.gbps(1)


def copy_cells(args, store: torch.Tensor, dev: torch.device, backing: str) -> list[dict]:
    """Each copy variant's rate on ``store``'s rows, for each row count of ``--rows``."""
    cells = []
    for n in (int(v) for v in args.rows.split(",")):
        if n > args.store_rows // 2:
            raise SystemExit(f"--rows {n} needs a store of at least {2 * n} rows (--store-rows)")
        # each run reads rows the run before did not (no read can be served from the GPU's L2)
        perm, blocks = torch.randperm(args.store_rows, generator=torch.Generator().manual_seed(n)).tolist(), \
            args.store_rows // n
        runs = [perm[i % blocks * n:(i % blocks + 1) * n] for i in range(args.repeats + 1)]
        keys: list[int] = []
        work = torch.zeros(1 + 2 * n, dtype=torch.int64, device=dev)
        pool = torch.empty(n, EXPERT_BYTES, dtype=torch.uint8, device=dev)
        nbytes = n * EXPERT_BYTES

        def pick(i: int) -> None:
            keys[:] = runs[i]
            work.copy_(torch.tensor([n] + [v for j, k in enumerate(keys) for v in (j, k)], dtype=torch.int64))
        variants = {"copy engine, one copy per row": lambda: [pool[j].copy_(store[k], non_blocking=True)
                                                              for j, k in enumerate(keys)]}
        for programs in ((132,) if args.quick else (32, 66, 132, 264)):
            for chunk in ((1 << 16,) if args.quick else (1 << 16, 1 << 14)):
                variants[f"gather_copy p{programs} chunk{chunk * 4 // 1024}K"] = (
                    lambda p=programs, c=chunk: gather_copy(work, store, pool, chunk_words=c, programs=p))
        for programs in ((264,) if args.quick else (132, 264, 528)):
            for block, warps in (((1024, 4),) if args.quick else ((1024, 4), (2048, 8), (512, 4))):
                variants[f"wide p{programs} b{block} w{warps}"] = (
                    lambda p=programs, b=block, w=warps: wide_copy(work, store, pool, 1 << 13, b, p, w))
        for name, fn in variants.items():
            pool.zero_()
            try:
                s = timed(fn, args.repeats, pick)
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the rest still run
                print(f"{n:3d} rows  {name:36s} failed: {type(e).__name__}: {e}".splitlines()[0])
                continue
            ok = bool(torch.equal(pool, store[keys].to(dev)))              # the last run's rows
            cells.append({"backing": backing, "rows": n, "variant": name, "seconds": s, "gb_s": nbytes / s / 1e9,
                          "correct": ok})
            print(f"{backing:10s} {n:3d} rows  {name:36s} {nbytes / s / 1e9:6.1f} GB/s  {s * 1e6:8.1f} us  "
                  f"{'ok' if ok else 'WRONG'}")
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,64", help="rows moved per call (8: one layer at batch 1)")
    ap.add_argument("--store-rows", type=int, default=384, help="rows of the host store (a quarter of the kit's)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--backings", default="pinned", help="page-locked memory of the store: pinned, registered, thp")
    ap.add_argument("--quick", action="store_true", help="one variant of each copy kernel (and the copy engine)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    backings = args.backings.split(",")
    if set(backings) - {"pinned", "registered", "thp"}:
        ap.error(f"--backings takes pinned, registered and thp; got {args.backings}")
    dev = torch.device("cuda")
    cells, stores, keep = [], [], []
    print(f"transparent huge pages: {thp_settings()}")
    for backing in backings:
        store, got = make_store(backing, args.store_rows, keep)
        got["cpu_gb_s_1tok"] = cpu_rate(store)
        stores.append(got)
        print(f"{backing}: {got['huge_pages_mib']:.0f} MiB on huge pages; CPU kernel {got['cpu_gb_s_1tok']:.1f} GB/s")
        cells += copy_cells(args, store, dev, backing)
    for t in keep:                       # the registered stores: unregistered before they are freed
        if isinstance(t, torch.Tensor):
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    if args.out:
        write_result(args.out, {"what": __doc__.splitlines()[0], "environment": environment(),
                                "benchmark": "gather_rate", "expert_bytes": EXPERT_BYTES, "thp": thp_settings(),
                                "stores": stores, "cells": cells})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
