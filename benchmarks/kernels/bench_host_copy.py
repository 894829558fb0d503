"""Experts over the bus by the SMs against the copy engine: the gather kernel's host-to-device rate.

    python benchmarks/kernels/bench_host_copy.py [--out FILE]

A direct-read step of several tokens copies each missing expert that two or more of its tokens use
once, with a kernel that reads the mapped host store (kernels/publish_ids.gather_copy, the same chunked
row copy as the GPU-side prefetch's claims). This times that kernel for a layer's worth of experts at
the expert sizes of the llama.cpp kit's shape (Qwen3-30B-A3B, bf16 and int4 g128) and gpt-oss-120b
(MXFP4), over a sweep of its launch (programs, block), against the copy engine moving the same rows
(``copy_`` from page-locked memory, one call per row) and against the pinned bus ceiling of
benchmarks/common.h2d_bandwidth_gbs. Each figure is a CUDA graph of the copies, median of 5 replays
(benchmarks/kernels/bench_moe.time_graph).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import h2d_bandwidth_gbs, write_result  # noqa: E402
from benchmarks.kernels.bench_moe import time_graph  # noqa: E402
from kernels.expert_claim import CHUNK_WORDS, COPY_BLOCK, COPY_PROGRAMS  # noqa: E402
from kernels.publish_ids import gather_copy  # noqa: E402

EXPERT_BYTES = {  # one expert's bytes in the host store
    "qwen3 bf16": 3 * 2048 * 768 * 2,
    "qwen3 int4 g128": 3 * 2048 * 768 // 2 + 3 * 2048 * 768 // 128 * 4,
    "gpt-oss mxfp4": 2880 * 5760 * 17 // 32 + 2880 * 2880 * 17 // 32,
}
LAUNCHES = ((COPY_PROGRAMS, COPY_BLOCK), (16, 4096), (64, 4096), (132, 4096), (132, 2048), (264, 2048))


def rows_for(name: str, nbytes: int, n: int, device: torch.device) -> list[dict]:
    nbytes -= nbytes % 4
    host = torch.empty(2 * n, nbytes, dtype=torch.uint8, pin_memory=True)
    host.copy_((torch.arange(2 * n) % 251).to(torch.uint8)[:, None].expand(-1, nbytes))   # each row its own byte
    pool = torch.empty(n, nbytes, dtype=torch.uint8, device=device)
    work = torch.tensor([n] + [v for j in range(n) for v in (j, 2 * j + 1)], dtype=torch.int64, device=device)
    total = n * nbytes
    out = []
    engine_us = 1e3 * time_graph(lambda: [pool[j].copy_(host[2 * j + 1], non_blocking=True) for j in range(n)], 5)
    out.append({"expert": name, "expert_bytes": nbytes, "experts": n, "how": "copy engine (copy_ per row)",
                "us": engine_us, "gb_s": total / engine_us / 1e3})
    for programs, block in LAUNCHES:
        us = 1e3 * time_graph(lambda p=programs, b=block: gather_copy(work, host, pool, CHUNK_WORDS, b, p), 5)
        out.append({"expert": name, "expert_bytes": nbytes, "experts": n, "how": "gather kernel",
                    "programs": programs, "block": block, "us": us, "gb_s": total / us / 1e3,
                    "default": (programs, block) == (COPY_PROGRAMS, COPY_BLOCK)})
    pool.zero_()
    gather_copy(work, host, pool)
    torch.cuda.synchronize()
    if not torch.equal(pool.cpu(), host[1::2]):
        raise RuntimeError("the gather kernel's copies differ from the host rows they name")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", default="4,16,48", help="experts per copy (a layer's shared missing experts)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_host_copy.py times CUDA copies; this machine has no CUDA device")
    device = torch.device("cuda")
    ceiling = h2d_bandwidth_gbs(device)
    rows = []
    for name, nbytes in EXPERT_BYTES.items():
        for n in (int(x) for x in args.experts.split(",")):
            rows += rows_for(name, nbytes, n, device)
    for r in rows:
        r["of_bus_ceiling"] = r["gb_s"] / ceiling
    print(f"pinned bus ceiling {ceiling:.1f} GB/s")
    print(f"{'expert':18} {'n':>3} {'how':28} {'progs':>5} {'block':>5} {'GB/s':>6} {'of bus':>6}")
    for r in rows:
        print(f"{r['expert']:18} {r['experts']:3d} {r['how']:28} {r.get('programs', ''):>5} {r.get('block', ''):>5} "
              f"{r['gb_s']:6.1f} {r['of_bus_ceiling']:6.0%}")
    if args.out:
        write_result(args.out, {"benchmark": "host_copy", "gpu": torch.cuda.get_device_name(device),
                                "pinned_h2d_gb_s": ceiling, "rows": rows})


if __name__ == "__main__":
    main()
