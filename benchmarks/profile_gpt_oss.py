"""Where a gpt-oss decode step spends its GPU time: the kernels of a few batch-1 steps of the 20b
shape (every expert resident) and of the 120b shape under the budget, by total CUDA time.

    python benchmarks/profile_gpt_oss.py --out benchmarks/results/profile_gpt_oss_DATE.json   # H200

CUDA graphs are off while profiling, so each kernel shows by name (a replayed graph runs the
same kernels). The table groups kernels by name and prints their share of the profiled time.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gpt_oss import Run, build, device_copy_gbs, parse, prompts  # noqa: E402
from benchmarks.common import environment, h2d_bandwidth_gbs, write_result  # noqa: E402
from benchmarks.gpt_oss_shapes import HostRows  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


def kernel_table(prof, steps: int) -> list[dict]:
    """CUDA kernels of ``prof`` grouped by name: total µs per step and calls per step, largest first."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            calls[e.name] += 1
    whole = sum(total.values()) or 1.0
    rows = [{"kernel": k[:90], "us_per_step": v / steps, "calls_per_step": calls[k] / steps, "share": v / whole}
            for k, v in total.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def profile_shape(shape: str, resident: bool, args, run: Run, steps: int) -> dict:
    engine, facts = build(shape, "uniform", args, run, max_batch=1, resident=resident)
    try:
        engine.reconfigure(cuda_graphs=False)
        p = prompts(engine.loaded.spec.vocab_size, 1, 64, 3)[0]
        engine.add_request(None, p, SamplingParams(max_tokens=8 + steps + 4, temperature=0.0, ignore_eos=True))
        for _ in range(8):                                   # prefill and warm-up decode steps
            engine.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                engine.step()
            torch.cuda.synchronize()
        while engine.has_unfinished():
            engine.step()
        rows = kernel_table(prof, steps)
        return {"shape": shape, "resident": resident, "steps": steps, "kernels": rows,
                "gpu_us_per_step": sum(r["us_per_step"] for r in rows), "build": facts}
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="20b,120b")
    a = ap.parse_args()
    args = parse([])
    run = Run("cuda", h2d_bandwidth_gbs("cuda", 1 << 30), device_copy_gbs("cuda", 1 << 30), HostRows(torch.device("cuda")))
    result = {"benchmark": "profile_gpt_oss", "environment": environment(), "profiles": []}
    for shape in a.shapes.split(","):
        prof = profile_shape(shape, shape == "20b", args, run, a.steps)
        result["profiles"].append(prof)
        print(f"\n{shape} ({'resident' if prof['resident'] else 'budget ' + args.budget}): "
              f"{prof['gpu_us_per_step']:.0f} us of kernels per step")
        for r in prof["kernels"][:14]:
            print(f"  {r['us_per_step']:8.1f} us {r['share']:6.1%} x{r['calls_per_step']:5.1f}  {r['kernel']}")
    run.host.close()
    if a.out:
        write_result(a.out, result)


if __name__ == "__main__":
    main()
