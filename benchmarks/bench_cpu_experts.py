"""Cold experts on the CPU: GB/s of expert bytes the CPU kernels stream, against the host's memory
bandwidth measured in the same run.

    python benchmarks/bench_cpu_experts.py [--out FILE] [--threads N] [--store-mib 512] [--cell-s 0.15]

Shapes: Qwen3-30B-A3B's expert (D=2048, F=768, top-8) and gpt-oss's (D=2880, F=2880, top-4, biases,
clamped SwiGLU). Formats bf16, fp8, int4 (g128; g64 for gpt-oss, whose 2880 has no 128) and mxfp4; T in {1, 2, 4, 8} tokens, every token
routed to each of the call's top-k experts (the per-expert cost at T tokens that the scheduler's cost
model needs); threads 1 and all. Each call reads top-k distinct rows of a store of --store-mib MiB
(several times the last-level cache), moving on to the next rows every call, so weights come from
DRAM as a cold expert's do. The bandwidth is a parallel sum over a 1 GiB buffer (reads only; the
kernels only read), and torch's copy of it (read + write bytes) for comparison.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402
from kernels.cpu import CpuExpertWork, cpu_expert_forward, set_cpu_expert_threads  # noqa: E402
from kernels.expert_layout import ExpertAct, ExpertLayout  # noqa: E402
from kernels.quant import quantize_expert  # noqa: E402

SHAPES = {"qwen3-30b-a3b": dict(hidden=2048, ffn=768, top_k=8, bias=False, act=None),
          "gpt-oss": dict(hidden=2880, ffn=2880, top_k=4, bias=True, act=ExpertAct("swiglu_oai"))}
FORMATS = ("bf16", "fp8", "int4", "mxfp4")
TOKENS = (1, 2, 4, 8)


@njit(parallel=True, fastmath=True, cache=True)
def _sum(a):
    s = np.int64(0)
    for i in prange(a.size):
        s += a[i]
    return s


def read_bandwidth_gbs(buf: np.ndarray, repeats: int = 5) -> float:
    """Best of ``repeats`` parallel sums over ``buf`` (int64), in GB/s of its bytes."""
    _sum(buf[:1024])
    best = min(_timed(lambda: _sum(buf)) for _ in range(repeats))
    return buf.nbytes / best / 1e9


def copy_bandwidth_gbs(buf: np.ndarray, repeats: int = 3) -> float:
    src = torch.from_numpy(buf)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * buf.nbytes / min(_timed(lambda: dst.copy_(src)) for _ in range(repeats)) / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_store(fmt: str, shape: dict, store_bytes: int) -> tuple[ExpertLayout, torch.Tensor]:
    """One quantised random expert copied into every row of a store of about ``store_bytes``."""
    g = torch.Generator().manual_seed(0)
    d, f = shape["hidden"], shape["ffn"]
    group = next(g for g in (128, 64, 32) if d % g == 0 and f % g == 0)   # gpt-oss: 2880 = 45 * 64
    layout = ExpertLayout.make(fmt, d, f, group, bias=shape["bias"], act=shape["act"])
    rows = max(3 * shape["top_k"], store_bytes // layout.nbytes)
    store = torch.empty(rows, layout.nbytes, dtype=torch.uint8)
    w13 = torch.randn(2 * f, d, generator=g) / d ** 0.5
    w2 = torch.randn(d, f, generator=g) / f ** 0.5
    b13, b2 = (torch.randn(2 * f, generator=g), torch.randn(d, generator=g)) if shape["bias"] else (None, None)
    layout.pack(quantize_expert(w13, w2, layout, b13, b2), store[0])
    store[1:] = store[0]
    return layout, store


def time_cell(store, layout, top_k: int, tokens: int, cell_s: float) -> float:
    """Median seconds per call of ``top_k`` experts at ``tokens`` tokens, rows advancing every call."""
    rows = store.shape[0]
    x = torch.randn(tokens, layout.hidden)
    out = torch.empty(tokens, layout.hidden)
    works = [CpuExpertWork.from_pairs([((c * top_k + j) % rows, range(tokens), [1.0] * tokens)
                                       for j in range(top_k)]) for c in range(rows)]
    cpu_expert_forward(store, layout, works[0], x, out)
    times, start, c = [], time.perf_counter(), 1
    while len(times) < 3 or (time.perf_counter() - start < cell_s and len(times) < 200):
        times.append(_timed(lambda: cpu_expert_forward(store, layout, works[c % rows], x, out)))
        c += 1
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--store-mib", type=int, default=512)
    ap.add_argument("--cell-s", type=float, default=0.15, help="seconds of timed calls per cell")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--threads", type=int, help="the many-thread count (default: every core this process may use)")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    thread_counts = sorted({1, min(args.threads or cores, numba.config.NUMBA_NUM_THREADS)})
    buf = np.ones((1 << 30) // 8, dtype=np.int64)
    bandwidth = {}
    for th in thread_counts:
        set_cpu_expert_threads(th)
        torch.set_num_threads(th)
        bandwidth[th] = dict(read_gbs=read_bandwidth_gbs(buf), torch_copy_gbs=copy_bandwidth_gbs(buf))
        print(f"host bandwidth, {th} thread(s): read {bandwidth[th]['read_gbs']:.1f} GB/s, "
              f"torch copy {bandwidth[th]['torch_copy_gbs']:.1f} GB/s (read + write)")
    del buf
    cells = []
    print(f"{'shape':14} {'fmt':6} {'MB/exp':>7} {'thr':>3} {'T':>2} {'us/expert':>10} {'GB/s':>7} {'of bw':>6}")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for fmt in args.formats.split(","):
            layout, store = make_store(fmt, shape, args.store_mib << 20)
            for th in thread_counts:
                set_cpu_expert_threads(th)
                for t in TOKENS:
                    sec = time_cell(store, layout, shape["top_k"], t, args.cell_s)
                    gbs = shape["top_k"] * layout.nbytes / sec / 1e9
                    ratio = gbs / bandwidth[th]["read_gbs"]
                    cells.append(dict(shape=name, fmt=fmt, threads=th, tokens=t, expert_bytes=layout.nbytes,
                                      top_k=shape["top_k"], seconds_per_call=sec,
                                      seconds_per_expert=sec / shape["top_k"], gbs=gbs, of_bandwidth=ratio))
                    print(f"{name:14} {fmt:6} {layout.nbytes / 1e6:7.2f} {th:3d} {t:2d} "
                          f"{sec / shape['top_k'] * 1e6:10.1f} {gbs:7.1f} {ratio:6.0%}", flush=True)
            del store
    if args.out:
        write_result(args.out, dict(benchmark="cpu_experts", cores=cores, cpu_capability=torch.backends.cpu.get_cpu_capability(),
                                    threading_layer=numba.threading_layer(), bandwidth={str(k): v for k, v in bandwidth.items()},
                                    config=vars(args), cells=cells))


if __name__ == "__main__":
    main()
