"""Where the decode MoE kernels lose time on one shape: each kernel's own time, launch-setting sweeps
of each kernel with the other fixed, the compiled programs' registers and spills, and the read
ceiling of the same work split (a kernel that only reads the rows each program reads).

    python benchmarks/kernels/lab_moe_decode.py --shape gpt-oss-20b --format mxfp4 --out $OUT/lab.json \
        [--configs-out NVIDIA_H200.json]

Times are CUDA-graph replays of ``--layers`` layers (own pools and routings, so L2 never holds the
next layer's weights), per layer; per-kernel times come from the profiler over eager calls. The
bytes are the packed bytes of the distinct experts a layer touches. ``--configs-out`` writes the
shipped launch table with this format's decode entries replaced by the best pair found (each
kernel's best setting, timed together).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernels.bench_moe import (SHAPES, build_layers, copy_ceiling_gbs, environment,  # noqa: E402
                                          expert_bytes, rel_err, routing, time_graph)
from kernels._triton import jit, tl  # noqa: E402
from kernels.fused_moe import fused_moe, fused_moe_ref  # noqa: E402
from kernels.moe_config import MoeLaunchConfig, TileConfig, moe_launch_config  # noqa: E402

# (block_n, block_k, num_warps[, num_stages, preload]); dense and fp8 kernels, then the 4-bit ones
UP = [(2, 1024, 2), (4, 1024, 2), (4, 1024, 4), (8, 1024, 4), (16, 1024, 4), (4, 2048, 4), (8, 2048, 8),
      (4, 512, 2), (8, 512, 4), (2, 2048, 4), (4, 4096, 8), (8, 256, 2), (1, 4096, 4)]
DOWN = [(1, 1024, 4), (2, 512, 4), (2, 1024, 4), (4, 256, 4), (4, 512, 4), (1, 2048, 4), (2, 256, 2),
        (8, 256, 8), (4, 1024, 8), (1, 512, 2), (2, 2048, 8)]
UP4 = [(16, 512, 4), (16, 1024, 8), (8, 512, 4), (32, 512, 8), (8, 1024, 4), (16, 256, 4), (8, 256, 2),
       (16, 512, 8), (32, 256, 4), (16, 512, 4, 3, 2), (8, 512, 2)]
DOWN4 = [(2, 256, 2), (4, 256, 2), (2, 512, 4), (4, 512, 4), (1, 256, 2), (2, 256, 2, 3, 3), (4, 256, 4),
         (8, 256, 4), (2, 1024, 4), (4, 256, 2, 3, 2), (1, 512, 2)]


@jit
def _read_kernel(ids_ptr, slot_ptr, w_ptr, sw_s, sw_n, out_ptr, F, KW, TOP_K: tl.constexpr, HALVES: tl.constexpr,
                 BN: tl.constexpr, BKW: tl.constexpr):
    """Reads what a decode program reads (``HALVES`` x ``BN`` rows of ``KW`` int32 words of one expert,
    up kernel: pair ``program_id(0)``; down kernel: ``TOP_K`` experts of token ``program_id(0)``) and
    writes one word per program: the bandwidth this split of the work allows."""
    p = tl.program_id(0)
    r = tl.arange(0, HALVES * BN)
    n = tl.program_id(1) * BN + r % BN
    acc = tl.zeros([HALVES * BN, BKW], dtype=tl.int32)
    cols = tl.arange(0, BKW)
    if HALVES == 2:                                             # up: gate rows, then up rows of one expert
        e = tl.load(ids_ptr + p)
        rows = (tl.load(slot_ptr + e).to(tl.int64) * sw_s + (n + (r // BN) * F) * sw_n)
    else:                                                       # down: BN rows of each of k experts
        j = r // (BN // TOP_K)
        nn = tl.program_id(1) * (BN // TOP_K) + r % (BN // TOP_K)
        e = tl.load(ids_ptr + p * TOP_K + j)
        rows = tl.load(slot_ptr + e).to(tl.int64) * sw_s + nn * sw_n
    words = w_ptr.to(tl.pointer_type(tl.int32))
    for k0 in range(0, KW, BKW):
        ok = (k0 + cols < KW)[None, :]
        acc ^= tl.load(words + rows[:, None] // 4 + k0 + cols[None, :], mask=ok, other=0)
    tl.store(out_ptr + p * tl.num_programs(1) + tl.program_id(1), tl.sum(tl.sum(acc, axis=1), axis=0))


def read_ceiling(views, slots, routes, shape, layers: int, t: int) -> list[dict]:
    """Per-layer µs of :func:`_read_kernel` over each layer's w13 (up split) and w2 (down split)."""
    rows = []
    kw13, kw2 = shape.hidden // 8, shape.ffn // 8
    for what, name, halves, kw, grid_n in (("up", "w13", 2, kw13, shape.ffn), ("down", "w2", 1, kw2, shape.hidden)):
        for bn, bkw, warps in ((8, 128, 4), (4, 128, 4), (16, 64, 4), (8, 256, 8), (4, 512, 8), (16, 128, 8)):
            if what == "down" and bn % shape.top_k:
                continue
            rb = bn if what == "up" else bn // shape.top_k
            out = torch.empty(t * shape.top_k * (grid_n // rb + 1), dtype=torch.int32, device="cuda")
            p = t * shape.top_k if what == "up" else t

            def go(i):
                w = views[i][name]
                _read_kernel[(p, -(-grid_n // rb))](routes[i][1], slots[i], w, w.stride(0), w.stride(1), out,
                                                   shape.ffn, kw, TOP_K=shape.top_k, HALVES=halves, BN=bn, BKW=bkw,
                                                   num_warps=warps)
            ms = time_graph(lambda: [go(i) for i in range(layers)]) / layers
            rows.append({"kernel": what, "bn": bn, "bkw": bkw, "warps": warps, "us": 1000 * ms})
    return rows


def kernel_times(fn, calls: int) -> dict[str, float]:
    """µs per call of every CUDA kernel ``fn`` launches (profiler, eager), by name."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    tot: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[e.name[:40]] += e.device_time_total
    return {k: v / calls for k, v in tot.items()}


def compiled_stats() -> list[dict]:
    """Registers and spills of every compiled variant of the decode kernels."""
    from kernels import moe_decode, moe_decode_4bit
    out = []
    for fn in (moe_decode._up_decode_kernel, moe_decode._down_decode_kernel, moe_decode_4bit._up_kernel,
               moe_decode_4bit._down_kernel):
        for cache in getattr(fn, "device_caches", {}).values():
            for key, k in cache[0].items():
                md = k.metadata
                out.append({"kernel": fn.__name__, "regs": getattr(k, "n_regs", None),
                            "spills": getattr(k, "n_spills", None), "warps": md.num_warps,
                            "shared": getattr(md, "shared", None), "key": str(key)[-160:]})
    return out


def write_table(path: str, fmt: str, cases: list[dict]) -> None:
    """The shipped launch table (kernels/configs/) with ``fmt``'s decode entries set to each case's best."""
    from kernels.moe_config import config_file_name
    src = Path(__file__).resolve().parents[2] / "kernels" / "configs" / config_file_name(torch.cuda.get_device_name())
    table = json.loads(src.read_text())
    for c in cases:
        if c.get("best"):
            b = c["best"]
            entry = {"variant": "decode", "block_m": 16, "pdl": b["pdl"]}
            for which in ("up", "down"):
                entry[which] = {k: v for k, v in vars(TileConfig(*b[which])).items()}
            table.setdefault(fmt, {})[str(c["tokens"])] = entry
    Path(path).write_text(json.dumps(table, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="gpt-oss-20b", choices=sorted(SHAPES))
    ap.add_argument("--format", default="mxfp4")
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs-out", default=None, help="the launch table with this format's best decode pairs")
    a = ap.parse_args()
    shape = SHAPES[a.shape]
    res = {**environment(a.commit, a.shape), "format": a.format, "ceiling_gbs": copy_ceiling_gbs(), "cases": []}
    layout, views, slots = build_layers(shape, a.format, a.layers)
    x = [torch.randn(64, shape.hidden, device="cuda", dtype=torch.bfloat16) for _ in range(a.layers)]
    shipped = moe_launch_config(torch.cuda.get_device_name(), a.format, 1)
    for t in (int(s) for s in a.tokens.split(",")):
        routes = routing(shape, t, a.layers)
        touched = statistics.mean(int(torch.unique(ids).numel()) for _, ids in routes)
        nbytes = touched * expert_bytes(layout)
        ref = fused_moe_ref(x[0][:t], routes[0][1], routes[0][0], slots[0], views[0], layout)

        def run(cfg):
            return [fused_moe(x[i][:t], routes[i][1], routes[i][0], slots[i], views[i], layout, cfg)
                    for i in range(a.layers)]
        case = {"tokens": t, "bytes": nbytes, "sweep": []}
        base = moe_launch_config(torch.cuda.get_device_name(), a.format, t)
        case["shipped"] = {"up": vars(base.up), "down": vars(base.down), "pdl": base.pdl}
        case["kernel_us"] = kernel_times(lambda: run(base), 10)
        case["kernel_us"] = {k: v / a.layers for k, v in case["kernel_us"].items()}
        four_bit = a.format in ("int4", "mxfp4")
        pdl = four_bit and torch.cuda.get_device_capability()[0] >= 9
        for which, tiles in (("up", UP4 if four_bit else UP), ("down", DOWN4 if four_bit else DOWN)):
            for tile in tiles:
                up = TileConfig(*tile) if which == "up" else base.up
                down = TileConfig(*tile) if which == "down" else base.down
                cfg = MoeLaunchConfig("decode", up, down, pdl=pdl)
                try:
                    err = rel_err(run(cfg)[0], ref)
                    us = 1000 * time_graph(lambda: run(cfg)) / a.layers
                except Exception as ex:  # noqa: BLE001 - one failing setting must not end the sweep
                    case["sweep"].append({"vary": which, "tile": tile, "error": f"{type(ex).__name__}: {ex}"[:200]})
                    continue
                case["sweep"].append({"vary": which, "tile": tile, "us": us, "err": err,
                                      "pct": 100 * nbytes / us / 1e3 / res["ceiling_gbs"]})
        best = {w: min((s for s in case["sweep"] if s["vary"] == w and "us" in s and s["err"] < 2e-2),
                       key=lambda s: s["us"], default=None) for w in ("up", "down")}
        if best["up"] and best["down"]:
            cfg = MoeLaunchConfig("decode", TileConfig(*best["up"]["tile"]), TileConfig(*best["down"]["tile"]), pdl=pdl)
            case["best"] = {"up": best["up"]["tile"], "down": best["down"]["tile"], "pdl": pdl,
                            "us": 1000 * time_graph(lambda: run(cfg)) / a.layers, "err": rel_err(run(cfg)[0], ref),
                            "shipped_us": 1000 * time_graph(lambda: run(base)) / a.layers}
            case["best"]["pct"] = 100 * nbytes / case["best"]["us"] / 1e3 / res["ceiling_gbs"]
            case["kernel_us_best"] = {k: v / a.layers for k, v in kernel_times(lambda: run(cfg), 10).items()}
        case["read_ceiling"] = read_ceiling(views, slots, routes, shape, a.layers, t)
        res["cases"].append(case)
        Path(a.out).write_text(json.dumps(res, indent=1))
    res["compiled"] = compiled_stats()
    Path(a.out).write_text(json.dumps(res, indent=1))
    if a.configs_out:
        write_table(a.configs_out, a.format, res["cases"])
    print(f"ceiling {res['ceiling_gbs']:.0f} GB/s, shipped t=1 {shipped}")
    for c in res["cases"]:
        if c.get("best"):
            b = c["best"]
            top = sorted(c["kernel_us_best"].items(), key=lambda kv: -kv[1])[:3]
            print(f"T={c['tokens']} best {b['up']} / {b['down']} pdl={b['pdl']}: {b['us']:.1f} us ({b['pct']:.0f}% of "
                  f"the copy ceiling, err {b['err']:.1e}) against {b['shipped_us']:.1f} us shipped; kernels "
                  + ", ".join(f"{k} {v:.1f}" for k, v in top))
        print(f"T={c['tokens']} {c['bytes'] / 1e6:.1f} MB/layer; kernels (us/layer): "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(c["kernel_us"].items(), key=lambda kv: -kv[1])[:4]))
        for which in ("up", "down"):
            rows = sorted((s for s in c["sweep"] if s["vary"] == which and "us" in s), key=lambda s: s["us"])
            print(f"  vary {which}: " + "; ".join(f"{s['tile']} {s['us']:.1f}us {s['pct']:.0f}%" for s in rows[:5]))
        for which in ("up", "down"):
            rows = sorted((r for r in c["read_ceiling"] if r["kernel"] == which), key=lambda r: r["us"])
            print(f"  read-only {which}: " + "; ".join(f"bn{r['bn']} bkw{r['bkw']} w{r['warps']} {r['us']:.1f}us"
                                                     for r in rows[:4]))
    for s in res["compiled"]:
        print(f"  {s['kernel']}: regs {s['regs']} spills {s['spills']} warps {s['warps']} shared {s['shared']}")


if __name__ == "__main__":
    main()
