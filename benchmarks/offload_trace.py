"""Where an offloaded decode step's time goes, with no experts on the GPU: a trace of a few batch-1
steps of the llama.cpp kit's shape (Qwen3-30B-A3B, 12 layers, random weights, every expert in host
memory) per (expert format, prefetch depth, cold_experts mode), summarised as per-step times:

* wall: the step as the caller sees it;
* kernels: the GPU's busy time (the union of kernel intervals);
* copies: the union of host-to-device copy intervals, their bytes and the rate while they ran;
* overlap: the time kernels and copies ran together;
* host waits: the host's time in CUDA synchronisation calls (stream, event and device syncs).

    python benchmarks/offload_trace.py --out benchmarks/results/no_pool_trace_DATE.json [--traces DIR]

``--traces DIR`` also writes each Chrome trace (open in Perfetto) for a closer look.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import interval_union, write_result  # noqa: E402
from benchmarks.synthetic_moe import kit_model, profiled_steps, strata_engine, sync  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time both sets of intervals cover: |A| + |B| - |A u B|."""
    return interval_union(a) + interval_union(b) - interval_union(a + b)


def summarise(trace: dict, steps: int) -> dict:
    """Per-step figures from a Chrome trace (µs)."""
    kernels, copies, waits = [], [], 0.0
    copy_bytes = 0
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        cat, name, ts, dur = e.get("cat", ""), e.get("name", ""), float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat == "kernel":
            kernels.append((ts, ts + dur))
        elif cat == "gpu_memcpy" and "HtoD" in name:
            copies.append((ts, ts + dur))
            copy_bytes += int(e.get("args", {}).get("bytes", 0))
        elif cat == "cuda_runtime" and name in SYNCS:
            waits += dur
    copy_us = interval_union(copies)
    return {"kernels_us": interval_union(kernels) / steps, "kernel_count": len(kernels) / steps,
            "copies_us": copy_us / steps, "copy_count": len(copies) / steps, "copy_mb": copy_bytes / steps / 1e6,
            "copy_gbs_while_copying": copy_bytes / copy_us / 1e3 if copy_us else 0.0,
            "overlap_us": _overlap(kernels, copies) / steps, "host_sync_us": waits / steps}


def trace_cell(engine, vocab: int, steps: int, device: str, keep: Path | None, label: str) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (256,), generator=g).tolist()
    engine.add_request(None, ids, SamplingParams(max_tokens=16 + 32 + steps + 8, temperature=0.0, ignore_eos=True))
    for _ in range(16):
        engine.step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(32):
        engine.step()
    sync(device)
    wall = (time.perf_counter() - t0) * 1e3 / 32
    prof, wall_prof = profiled_steps(engine, steps, device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"{label}.json").write_text(path.read_text())
    stats = engine.stats()
    return {"step_ms": wall, "tok_s": 1e3 / wall, "profiled_step_ms": wall_prof, **summarise(trace, steps),
            "hit_rate": getattr(stats, "expert_hit_rate", None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--formats", default="int4,bf16")
    ap.add_argument("--depths", default="0,2")
    ap.add_argument("--modes", default="bus,auto")
    ap.add_argument("--reads", default="auto", help="expert_reads values: auto, copy, direct (comma-separated)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--traces", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="a small shape on the CPU: checks the script, measures nothing")
    a = ap.parse_args()
    hf, cfg, shape, device = kit_model(a.layers, a.smoke)
    result = {"benchmark": "offload_trace", "what": (
        f"Per-step time split of batch-1 decode with no experts on the GPU (Qwen3-30B-A3B shape, {a.layers} layers, "
        "random weights, 256-token prompt): wall, GPU kernel busy time, host-to-device copy time, bytes and rate, "
        "kernels and copies overlapping, host time in CUDA syncs (torch.profiler traces)"), "config": vars(a),
        "cells": []}
    keep = Path(a.traces) if a.traces else None
    for fmt in a.formats.split(","):
        try:
            engine, _ = strata_engine(hf, cfg, fmt, 1, "float32" if a.smoke else "bfloat16", device=device,
                                      kv_cache_size="64M" if a.smoke else "1G", expert_pool_size="0%", prefetch_depth=0)
        except Exception as e:
            result["cells"].append({"format": fmt, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"{fmt}: {type(e).__name__}: {e}")
            continue
        try:
            for depth, mode, reads in itertools.product((int(d) for d in a.depths.split(",")), a.modes.split(","),
                                                        a.reads.split(",")):
                engine.reconfigure(prefetch_depth=depth, cold_experts=mode, expert_reads=reads)
                label = f"{fmt}_d{depth}_{mode}" + ("" if reads == "auto" else f"_{reads}")
                try:
                    got = trace_cell(engine, shape["vocab_size"], a.steps, device, keep, label)
                except Exception as e:
                    result["cells"].append({"cell": label, "error": f"{type(e).__name__}: {e}"[:2000]})
                    print(f"{label}: {type(e).__name__}: {e}")
                    continue
                got.update(cell=label, format=fmt, depth=depth, mode=mode, reads=reads)
                result["cells"].append(got)
                print(f"{label:14} {got['step_ms'] * 1e3:7.0f} us/step ({got['tok_s']:5.0f} tok/s) | kernels "
                      f"{got['kernels_us']:6.0f} us x{got['kernel_count']:4.0f} | copies "
                      f"{got['copies_us']:6.0f} us x{got['copy_count']:4.0f} {got['copy_mb']:6.1f} MB at "
                      f"{got['copy_gbs_while_copying']:5.1f} GB/s | overlap {got['overlap_us']:5.0f} us | "
                      f"host syncs {got['host_sync_us']:6.0f} us", flush=True)
        finally:
            engine.close()
        if device == "cuda":
            torch.cuda.empty_cache()
    if a.out:
        write_result(a.out, result)


if __name__ == "__main__":
    main()
