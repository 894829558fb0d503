"""Where a one-token call of the int4 CPU expert kernel spends its time, by phase and thread count:
the whole call, each of its passes on its own (gate/up with the activations' quantisation, down), the
quantisation of the token on the calling thread, that of the activations on their own (serial), and
an empty parallel pass (what entering and leaving a parallel region costs).

    python benchmarks/cpu_phases.py [--threads 1,8,16] [--out FILE]

Qwen3-30B-A3B's expert (D=2048, F=768, int4 g128), top-8, one token; each call reads the next 8 rows
of a 256 MiB store, so weights come from DRAM. Median of many calls per cell. The sum of the phases
against the whole call, and the bytes each pass reads against the host's bandwidth, say whether a
call is bound by the memory, the arithmetic or the fixed cost of its parallel regions.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_cpu_experts import SHAPES, make_store, read_bandwidth_gbs  # noqa: E402
from benchmarks.common import write_result  # noqa: E402
from kernels.cpu import CpuExpertWork, set_cpu_expert_threads  # noqa: E402
from kernels.cpu import packed  # noqa: E402
from kernels.cpu.driver import M_ACT, M_B2, M_B13, M_FMT, M_S2, M_S13, M_W2, M_W13, M_Z2, M_Z13  # noqa: E402
from kernels.cpu.forward import CpuExpertRunner, _meta  # noqa: E402


@njit(parallel=True, cache=True)
def _empty_pass(out):
    for i in prange(out.size):
        out[i] += 1.0


def _median_us(fn, calls: int, gap_s: float = 0.0) -> float:
    """Median time of ``fn`` over ``calls`` calls; ``gap_s``: the calling thread first waits that long
    before each, yielding as the engine's host thread does while it follows a step (the kernel's
    worker threads may fall asleep meanwhile, as they do between the layers of a step)."""
    fn()
    times = []
    for _ in range(calls):
        if gap_s:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < gap_s:
                time.sleep(0)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def phases(store: torch.Tensor, layout, threads: int, calls: int, gaps_us: list[float]) -> dict:
    set_cpu_expert_threads(threads)
    runner = CpuExpertRunner(store, layout, threads, one_region=False)
    one = CpuExpertRunner(store, layout, threads, one_region=True)     # gate/up and down in one region
    meta = _meta(layout)
    b = store.numpy()
    h, f = b.view(np.uint16), b.view(np.float32)
    rows_total, k = store.shape[0], 8
    d_, f_, grp = layout.hidden, layout.ffn, layout.group_size
    x = np.random.default_rng(0).standard_normal((1, d_)).astype(np.float32)
    out = np.zeros((1, d_), np.float32)
    state = {"c": 0}

    def work() -> CpuExpertWork:
        c = state["c"] = state["c"] + 1
        return CpuExpertWork.from_pairs([((c * k + j) % rows_total, [0], [0.125]) for j in range(k)])

    works = [work() for _ in range(64)]
    it = {"i": 0}

    def nxt() -> CpuExpertWork:
        it["i"] += 1
        return works[it["i"] % len(works)]

    q = np.empty((1, 2 * d_), np.int8)
    s = np.empty((1, d_ // grp), np.float32)
    qs = np.empty((1, d_ // 8), np.int32)
    bad = np.empty(1, np.bool_)
    packed.quantize_rows_serial(x, grp, q, s, qs, bad)
    a = np.random.default_rng(1).standard_normal((k, f_)).astype(np.float32) * 0.1
    qa = np.empty((k, 2 * f_), np.int8)
    sa = np.empty((k, f_ // grp), np.float32)
    qsa = np.empty((k, f_ // 8), np.int32)
    bad_a = np.empty(k, np.bool_)
    packed.quantize_rows_serial(a, grp, qa, sa, qsa, bad_a)
    a_out = np.empty_like(a)
    fmt = meta[M_FMT]

    def gate_up():
        w = nxt()
        packed.gate_up(fmt, b, h, f, d_, f_, grp, meta[M_W13], meta[M_S13], meta[M_Z13], meta[M_B13], meta[M_ACT],
                       np.float32(1.702), np.float32(7.0), w.rows, w.starts, w.tokens, q, s, qs, a_out, qa, sa, qsa,
                       bad_a, threads)

    def down():
        w = nxt()
        packed.down(fmt, b, h, f, d_, f_, grp, meta[M_W2], meta[M_S2], meta[M_Z2], meta[M_B2], w.rows, w.starts,
                    w.tokens, w.weights, qa, sa, qsa, out, threads)

    pad = np.zeros(threads * 64, np.float64)
    got = {"threads": threads,
           "call_us": _median_us(lambda: runner.run(nxt(), x, out), calls),
           "one_region_call_us": _median_us(lambda: one.run(nxt(), x, out), calls),
           "gate_up_us": _median_us(gate_up, calls),
           "down_us": _median_us(down, calls),
           "quantize_x_us": _median_us(lambda: packed.quantize_rows_serial(x, grp, q, s, qs, bad), calls),
           "quantize_a_us": _median_us(lambda: packed.quantize_rows_serial(a, grp, qa, sa, qsa, bad_a), calls),
           "empty_pass_us": _median_us(lambda: _empty_pass(pad), calls)}
    got["call_after_gap_us"] = {str(g): _median_us(lambda: runner.run(nxt(), x, out), calls, g * 1e-6) for g in gaps_us}
    got["one_region_after_gap_us"] = {str(g): _median_us(lambda: one.run(nxt(), x, out), calls, g * 1e-6)
                                      for g in gaps_us}
    w13 = 2 * f_ * d_ // 2 * k
    w2 = d_ * f_ // 2 * k
    got["gate_up_gbs"] = w13 / got["gate_up_us"] / 1e3
    got["down_gbs"] = w2 / got["down_us"] / 1e3
    got["call_gbs"] = k * layout.nbytes / got["call_us"] / 1e3
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,8,16")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--store-mib", type=int, default=256)
    ap.add_argument("--gaps-us", default="200,1000",
                    help="also time the whole call after the calling thread waited this long (comma-separated "
                         "microseconds; the engine's host waits about 100-200 us between layers)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    layout, store = make_store("int4", SHAPES["qwen3-30b-a3b"], a.store_mib << 20)
    most = numba.config.NUMBA_NUM_THREADS
    counts = [min(int(t), most) for t in a.threads.split(",")]
    buf = np.ones(1 << 27, np.int64)
    bandwidth = {}
    rows = []
    for t in dict.fromkeys(counts):
        set_cpu_expert_threads(t)
        bandwidth[t] = read_bandwidth_gbs(buf)
        got = phases(store, layout, t, a.calls, [float(g) for g in a.gaps_us.split(",") if g])
        got["read_gbs"] = bandwidth[t]
        rows.append(got)
        print(f"threads {t:3}: call {got['call_us']:7.1f} us ({got['call_gbs']:5.1f} GB/s of {bandwidth[t]:5.1f}) | "
              f"gate/up {got['gate_up_us']:7.1f} us ({got['gate_up_gbs']:5.1f} GB/s) | down {got['down_us']:6.1f} us "
              f"({got['down_gbs']:5.1f} GB/s) | quantize x {got['quantize_x_us']:5.1f} a {got['quantize_a_us']:5.1f} "
              f"us | empty pass {got['empty_pass_us']:5.1f} us | after a gap: "
              + ", ".join(f"{g} us: {v:.1f}" for g, v in got["call_after_gap_us"].items())
              + f" | one region: call {got['one_region_call_us']:7.1f} us, after a gap: "
              + ", ".join(f"{g} us: {v:.1f}" for g, v in got["one_region_after_gap_us"].items()), flush=True)
    if a.out:
        write_result(a.out, {"benchmark": "cpu_phases", "what": (
            "One-token int4 CPU expert call (Qwen3-30B-A3B expert, top-8) split into its phases per thread count: "
            "whole call, gate/up pass (quantising the activations inside), down pass, the serial "
            "quantisations on their own, an empty parallel pass; and the whole call with gate/up and down in one "
            "parallel region (kernels.cpu.packed.gate_up_down)"),
            "config": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
