"""What each compiled kernel costs the card's memory outside torch's allocator.

A Strata process on the kit's no-pool int4 run held about 148 MiB beyond its CUDA context and torch's
reserved bytes once its engine had run (benchmarks/results/memory_gap_2026-12-07.json), and its run
compiled 82 Triton kernels, each loaded as a module of its own. This script compiles and launches
``--kernels`` distinct tiny Triton kernels one after another (the same source, another constexpr each,
so another module each) and records the card's used memory (NVML) and torch's reserved bytes after
every ``--every`` of them: the slope is what one more module costs.

    python benchmarks/module_memory.py --kernels 48 --out module_memory.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment, write_result  # noqa: E402
from benchmarks.memory_gap import MIB, CardMemory  # noqa: E402
from kernels._triton import jit, tl  # noqa: E402


@jit
def _add_kernel(x, N: tl.constexpr, C: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(x + offs, tl.load(x + offs) + C)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=48)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    card = CardMemory()
    dev = torch.device("cuda")
    x = torch.zeros(64, device=dev)
    torch.cuda.synchronize()
    rows = []

    def record(n: int) -> None:
        torch.cuda.synchronize()
        used = card.used()
        reserved = torch.cuda.memory_reserved() / MIB
        rows.append({"kernels": n, "card_mib": None if used is None else used / MIB, "reserved_mib": reserved,
                     "outside_torch_mib": None if used is None else used / MIB - reserved})
        print(f"{n:4d} kernels  card {rows[-1]['card_mib']:.1f} MiB  outside torch "
              f"{rows[-1]['outside_torch_mib']:.1f} MiB")

    record(0)
    for i in range(args.kernels):
        _add_kernel[(1,)](x, N=64, C=i + 1)
        if (i + 1) % args.every == 0:
            record(i + 1)
    first, last = rows[0], rows[-1]
    per = None
    if first["card_mib"] is not None and last["kernels"] > first["kernels"]:
        per = (last["outside_torch_mib"] - first["outside_torch_mib"]) / (last["kernels"] - first["kernels"])
        print(f"about {per:.2f} MiB outside torch per compiled kernel")
    if args.out:
        write_result(args.out, {"what": __doc__.splitlines()[0], "environment": environment(),
                                "benchmark": "module_memory", "rows": rows, "mib_per_kernel": per})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
