"""Where an eager decode step with a CPU share spends its host time (cProfile), against an eager step
on the bus alone and a replayed one, on the 12-layer Qwen3-30B-A3B shape (CUDA):

    python benchmarks/cold_profile.py --format int4 --batch 1 --out prof.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.synthetic_moe import QWEN3_30B, base_std, build_hf, strata_engine  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


def steps(engine, n: int) -> float:
    """Seconds per decode step over ``n`` steps (the requests were started by the caller)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="int4")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    shape = dict(QWEN3_30B, num_hidden_layers=args.layers)
    hf, cfg = build_hf(shape, torch.bfloat16, base_std(shape), "cuda")
    engine, _ = strata_engine(hf, cfg, args.format, args.batch, "bfloat16", "cuda", "4G",
                              expert_pool_size="0%", prefetch_depth=args.depth, cold_experts="bus")
    params = SamplingParams(max_tokens=4000, temperature=1.0, seed=1, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(None, list(range(10 + i, 42 + i)), params)
    report, rows = [], {}
    for label, opts in [("replayed, bus", dict(cold_experts="bus", cuda_graphs=True)),
                        ("eager, bus", dict(cold_experts="bus", cuda_graphs=False)),
                        ("eager, cpu", dict(cold_experts="cpu", cuda_graphs=True))]:
        engine.reconfigure(**opts)
        steps(engine, 8)
        rows[label] = 1e3 * steps(engine, 24)
        report.append(f"{label}: {rows[label]:.2f} ms per step")
        print(report[-1], flush=True)
    prof = cProfile.Profile()
    prof.enable()
    steps(engine, 16)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    write_result(args.out, {"benchmark": "cold_profile", "model": shape, "format": args.format, "batch": args.batch,
                            "depth": args.depth, "pool": "0%", "ms_per_step": rows,
                            "profile_16_eager_cpu_steps": s.getvalue()})
    print(s.getvalue()[:6000])


if __name__ == "__main__":
    main()
