"""Where a resident batch-1 decode step spends its time: the kernels of replayed CUDA-graph steps on
the llama.cpp kit's shape (Qwen3-30B-A3B, 12 layers, random weights, every expert on the GPU), per
expert format and resident-weight format.

    python benchmarks/step_profile.py --out benchmarks/results/step_profile_DATE.json    # GPU

For each engine: the step's wall time (median of timed steps after a 512-token prompt), then CUPTI
kernel records of a few replayed steps (torch.profiler sees the kernels inside a graph) grouped by
name, the GPU's busy time per step (the union of its kernel intervals) and the idle rest: a step
whose idle share is large is bound by the chain of launches, not by the bytes it reads.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import interval_union, write_result  # noqa: E402
from benchmarks.synthetic_moe import kit_model, profiled_steps, strata_engine, sync  # noqa: E402
from engine import LLM  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


def _kernels(prof) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every GPU kernel the profiler recorded, in start order."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((float(e.time_range.start), float(e.time_range.end), e.name))
    return sorted(out)


def _by_name(spans: list[tuple[float, float, str]]) -> tuple[dict[str, float], dict[str, int]]:
    """Microseconds and launches of the kernels of ``spans``, by name."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for s, e, name in spans:
        total[name] += e - s
        calls[name] += 1
    return total, calls


def profile_engine(engine, vocab: int, prompt: int, timed: int, profiled: int, device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (prompt,), generator=g).tolist()
    engine.add_request(None, ids, SamplingParams(max_tokens=16 + timed + profiled + 8, temperature=0.0,
                                                 ignore_eos=True))
    for _ in range(16):                                   # prefill, then graph capture and warm-up
        engine.step()
    sync(device)
    ms = []
    for _ in range(timed):
        t0 = time.perf_counter()
        engine.step()
        sync(device)
        ms.append((time.perf_counter() - t0) * 1e3)
    prof, wall_prof = profiled_steps(engine, profiled, device)
    spans = _kernels(prof)
    total, calls = _by_name(spans)
    rows = sorted(({"kernel": k[:90], "us_per_step": v / profiled, "calls_per_step": calls[k] / profiled}
                   for k, v in total.items()), key=lambda r: -r["us_per_step"])
    busy = interval_union([(s, e) for s, e, _ in spans]) / profiled
    step_ms = statistics.median(ms)
    return {"step_ms": step_ms, "tok_s": 1e3 / step_ms, "step_ms_samples": ms, "profiled_step_ms": wall_prof,
            "gpu_busy_us_per_step": busy, "kernels_per_step": len(spans) / profiled,
            "kernel_us_per_step": sum(r["us_per_step"] for r in rows),
            "idle_share": max(0.0, 1 - busy / (wall_prof * 1e3)) if spans else None, "kernels": rows,
            "cuda_graphs_active": engine.stats().cuda_graphs_active}


def profile_prefill(engine, vocab: int, prompt: int, reps: int, device: str) -> dict:
    """A ``prompt``-token prompt's prefill at batch 1 (submitted, stepped until its first token): wall time
    (median of ``reps`` after two untimed), then one under the profiler: its kernels grouped by name,
    the GPU's busy time, and the host's operators by their own time (syncs and Python loops show there)."""
    from torch.profiler import ProfilerActivity, profile
    g = torch.Generator().manual_seed(1)

    def once() -> float:
        ids = torch.randint(0, vocab, (prompt,), generator=g).tolist()
        engine.add_request(None, ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        sync(device)
        t0 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        sync(device)
        return (time.perf_counter() - t0) * 1e3

    for _ in range(2):
        once()
    ms = [once() for _ in range(reps)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = once()
    spans = _kernels(prof)
    total, calls = _by_name(spans)
    import cProfile
    import pstats
    py = cProfile.Profile()                      # the host's Python over three more prefills, by own time
    py.enable()
    py_ms = [once() for _ in range(3)]
    py.disable()
    st = pstats.Stats(py).stats                  # (file, line, name) -> (prim calls, calls, own, cum, callers)
    python = sorted(({"function": f"{Path(f).name}:{ln}({fn})", "calls": v[1] / 3, "own_us": v[2] * 1e6 / 3,
                      "cum_us": v[3] * 1e6 / 3} for (f, ln, fn), v in st.items()), key=lambda r: -r["own_us"])
    rows = sorted(({"kernel": k[:90], "us": v, "calls": calls[k]} for k, v in total.items()), key=lambda r: -r["us"])
    host = sorted(((e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()), key=lambda r: -r[1])
    median = statistics.median(ms)
    return {"prompt": prompt, "ms": median, "tok_s": prompt / median * 1e3, "ms_samples": ms, "profiled_ms": wall,
            "gpu_busy_us": interval_union([(s, e) for s, e, _ in spans]), "kernels_launched": len(spans),
            "kernels": rows[:40], "host_ops": [{"op": k[:90], "self_us": t, "calls": c} for k, t, c in host[:25]],
            "python_ms": py_ms, "python": python[:60],
            "python_cum": sorted(python, key=lambda r: -r["cum_us"])[:60]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--cells", default="int4/bf16,int4/int8,int4/fp8,bf16",
                    help="expert format[/resident-weight format][+nopdl][+apart][+perhead][+gemv][+nojoin][+palign]"
                         "[+alignwN][+gemv16], "
                         "comma-separated (no resident format: the engine's auto; +nopdl: no kernel, the MoE's "
                         "included, launches as a programmatic dependent; +apart: decode attention combines its "
                         "splits in a launch of its own; +perhead: its folded combining head after head; +gemv: "
                         "the router's GEMV and the routing in one launch; +nojoin: int4 prefill tiles of two "
                         "halves rather than joined nibbles; +palign: the prefill's alignment in parallel chunks; "
                         "+alignw8: its one program on 8 warps; +gemv16: one-token 16-bit matrices and routers "
                         "on the GEMV kernel rather than cuBLAS)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--timed", type=int, default=64)
    ap.add_argument("--profiled", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=0,
                    help="also profile the prefill of a prompt of this many tokens (0: none)")
    ap.add_argument("--hf", default=None,
                    help="a checkpoint folder (the llama.cpp kit's model) instead of this script's random one "
                         "(--layers then does not apply)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="a small shape on the CPU: checks the script, measures nothing")
    a = ap.parse_args()
    if a.hf:
        import json
        shape, device = json.loads((Path(a.hf) / "config.json").read_text()), "cpu" if a.smoke else "cuda"
        hf = cfg = None
    else:
        hf, cfg, shape, device = kit_model(a.layers, a.smoke)
    result = {"benchmark": "step_profile", "what": (
        "Kernels of replayed batch-1 decode steps, "
        + (f"the checkpoint {a.hf}, " if a.hf else f"Qwen3-30B-A3B shape with {a.layers} layers, random weights, ") +
        f"every expert on the GPU, after a {a.prompt}-token prompt: wall time per step, GPU busy time (union "
        "of kernel intervals), kernels grouped by name"), "config": vars(a), "cells": []}
    import kernels._triton as triton_glue
    import kernels.moe_align as moe_align
    import kernels.moe_prefill as moe_prefill
    import kernels.qlinear as qlinear
    import kernels.paged_attention as paged_attention
    import kernels.router as router
    for cell in a.cells.split(","):
        name, *flags = cell.split("+")
        fmt, _, res = name.partition("/")
        triton_glue.PDL_ENABLED = "nopdl" not in flags
        paged_attention.FOLD_REDUCE = "apart" not in flags
        paged_attention.GROUP_COMBINE = "perhead" not in flags
        moe_prefill.INT4_JOIN = "nojoin" not in flags
        moe_align.PARALLEL = "palign" in flags
        moe_align.ALIGN_WARPS = next((int(f[6:]) for f in flags if f.startswith("alignw")), 4)
        qlinear.GEMV16 = "gemv16" in flags
        router.FUSED_GEMV = "gemv" in flags
        try:
            options = dict(kv_cache_size="64M" if a.smoke else "4G", resident_weights=res or "auto",
                           max_model_len=max(a.prompt, a.prefill) + a.timed + a.profiled + 64)
            if a.hf:
                t0 = time.perf_counter()
                engine = LLM(a.hf, device=device, weight_format=fmt, max_batch=1,
                             dtype="float32" if a.smoke else "bfloat16", **options).engine
                sync(device)
                load_s = time.perf_counter() - t0
            else:
                engine, load_s = strata_engine(hf, cfg, fmt, 1, "float32" if a.smoke else "bfloat16", device=device,
                                               **options)
        except Exception as e:                           # one cell's failure is a row, not the run's end
            result["cells"].append({"cell": cell, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"{cell}: {type(e).__name__}: {e}")
            continue
        try:
            got = profile_engine(engine, shape["vocab_size"], a.prompt, a.timed, a.profiled, device)
            if a.prefill:
                got["prefill"] = profile_prefill(engine, shape["vocab_size"], a.prefill, 5, device)
        finally:
            engine.close()
        if device == "cuda":
            torch.cuda.empty_cache()
        got.update(cell=cell, load_s=load_s)
        result["cells"].append(got)
        print(f"\n{cell}: {got['tok_s']:.0f} tok/s, {got['step_ms'] * 1e3:.0f} us a step, GPU busy "
              f"{got['gpu_busy_us_per_step']:.0f} us ({got['kernels_per_step']:.0f} kernels), "
              f"idle {got['idle_share'] or 0:.0%}")
        for r in got["kernels"][:12]:
            print(f"  {r['us_per_step']:8.1f} us x{r['calls_per_step']:5.1f}  {r['kernel']}")
        pre = got.get("prefill")
        if pre:
            print(f"{cell} prefill of {pre['prompt']}: {pre['ms']:.2f} ms ({pre['tok_s']:.0f} tok/s), GPU busy "
                  f"{pre['gpu_busy_us'] / 1e3:.2f} ms, {pre['kernels_launched']} kernels")
            for r in pre["kernels"][:10]:
                print(f"  {r['us']:8.1f} us x{r['calls']:4d}  {r['kernel']}")
            for r in pre["host_ops"][:8]:
                print(f"  host {r['self_us']:8.1f} us x{r['calls']:4d}  {r['op']}")
            print(f"  python (cProfile, its cost included): {', '.join(f'{v:.1f}' for v in pre['python_ms'])} ms")
            for r in pre["python"][:25]:
                print(f"  py {r['own_us']:8.1f} us own {r['cum_us']:8.1f} cum x{r['calls']:6.1f}  {r['function']}")
    if a.out:
        write_result(a.out, result)


if __name__ == "__main__":
    main()
