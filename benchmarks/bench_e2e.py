"""End to end: a Qwen3-30B-A3B-shaped model, Strata against transformers, and an expert-offload sweep.

    python benchmarks/bench_e2e.py --out benchmarks/results/e2e_DATE.json                  # resident
    python benchmarks/bench_e2e.py --formats "" --offload bf16 --pools 0,0.25,0.5,1.0 \\
        --depths 0,1,2 --tokens 24 --out benchmarks/results/offload_DATE.json              # offload sweep
    python benchmarks/bench_e2e.py --smoke --offload bf16                                  # CPU check

The model (48 layers, 128 experts, top-8, hidden 2048, expert FFN 768, 30.5 B parameters) is built
in memory by transformers in bf16 on the GPU with random weights (benchmarks/synthetic_moe.py).

Sections, in order:

* correctness: a tiny fp32 model on the GPU, Strata (Triton kernels, CUDA graphs) against
  transformers (greedy tokens, logits), and an offloaded pool against every expert resident.
* resident (``--formats``, empty: skip): transformers decodes greedily with its grouped_mm experts;
  Strata loads the same tensors quantised at load to each format, every expert resident. Each speed
  is reported against its roofline: bytes read per token over the measured device-copy bandwidth.
* offload (``--offload FMT``): one engine per routing, retuned live between rows (expert pool share
  x prefetch depth x batch), each row beside its copy and compute limits (benchmarks/offload_sweep.py).

Routing (``--routing``, default both, one block of offload rows each): uniform, the plain random
model, and trained-like, the same model reshaped like a trained one (benchmarks/synthetic_moe.py).
Both blocks record, measured in the run: the cosine between consecutive layers' hidden states, how
much of layer l+d's top-k its router applied to layer l's input finds (d = 1, 2: what prefetch can
get), and the top-10% share, from transformers on the calibration prompts and from the engine's
activation counts over the sweep.

``--smoke``: a tiny shape, the whole offload sweep on the CPU in float32 (no correctness or
transformers rows) in seconds; "pinned bandwidth" is then a host memcpy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import h2d_bandwidth_gbs, write_result  # noqa: E402
from benchmarks.offload_sweep import Sweep, add_limits, offload_sweep, summarise  # noqa: E402
from benchmarks.synthetic_moe import (QWEN3_30B, SMOKE, TINY, TrainedLike, base_std, build_hf,  # noqa: E402
                                      strata_engine)
from engine.checkpoint.plan import resident_bytes  # noqa: E402
from engine.checkpoint.spec import spec_from_config  # noqa: E402
from engine.config import parse_size  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from kernels.expert_layout import ExpertLayout  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


def copy_ceiling_gbs() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (time.perf_counter() - t0) / 1e9


# ---- resident Strata against transformers --------------------------------------------------------
def strata_sample(engine: LLMEngine, prompts: list[list[int]], n: int) -> float:
    """One decode tok/s sample: (time for n tokens - time for 1 token) over the n - 1 decode steps."""
    def run(k: int) -> float:
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(f"r{time.perf_counter_ns()}-{i}", p, SamplingParams(max_tokens=k, temperature=0.0,
                                                                                 ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    return len(prompts) * (n - 1) / (run(n) - run(1))


def hf_sample(hf, prompts: list[list[int]], n: int) -> float:
    """The same sample for transformers' ``generate`` (greedy, fixed length)."""
    ids = torch.tensor(prompts, device="cuda")
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)

    def run(k: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=k, min_new_tokens=k, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    with torch.inference_mode():
        return len(prompts) * (n - 1) / (run(n) - run(1))


def bytes_per_token(spec, fmt: str, resident: str = "bf16") -> int:
    """Weight bytes one decoded token reads: the resident weights it uses (bf16, or 8-bit matrices with
    ``resident`` fp8 / int8) and k experts per MoE layer in ``fmt``."""
    expert = ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, 128).nbytes
    return resident_bytes(spec, 2, resident, active=True) + spec.num_moe_layers * spec.top_k * expert


def _greedy(engine: LLMEngine, prompts: list[list[int]], n: int = 24) -> dict[str, list[int]]:
    outs: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.add_request(f"c{i}", p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        for d in engine.step():
            outs.setdefault(d.request_id, []).extend(d.new_token_ids)
    return outs


def correctness() -> dict:
    """Tiny fp32 model on the GPU: Strata (Triton kernels, CUDA graphs) against transformers, and an
    offloaded expert pool (half the experts, prefetch depth 0 and 2) against every expert resident."""
    hf, cfg = build_hf(TINY, torch.float32, 0.08)
    engine, _ = strata_engine(hf, cfg, "auto", 4, "float32")
    prompts = [[1, 5, 77, 300, 12, 9], [1, 99, 4], [1, 250, 251, 252]]
    outs = _greedy(engine, prompts)
    offload = {}
    for depth in (0, 2):
        half = engine.loaded.layout.nbytes * cfg.num_experts * cfg.num_hidden_layers // 2
        off, _ = strata_engine(hf, cfg, "auto", 4, "float32", expert_pool_size=half, prefetch_depth=depth)
        got = _greedy(off, prompts)
        s = off.stats().experts
        offload[f"depth{depth}"] = {"greedy_equal_resident": got == outs, "hit_rate": s.hit_rate,
                                    "prefetch_hits": s.prefetch_hits, "h2d_bytes": s.h2d_bytes}
        off.close()
    with torch.no_grad():
        ref = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
        diff = (engine.score(prompts[0]).to(hf.device) - hf(torch.tensor([prompts[0]], device="cuda")).logits[0]).abs().max()
    stats = engine.stats()
    return {"greedy_equal": [outs[f"c{i}"] == r for i, r in enumerate(ref)], "max_abs_logit_diff": float(diff),
            "cuda_graphs_active": stats.cuda_graphs_active, "host_syncs": stats.host_syncs, "offload": offload}


def resident_rows(hf, cfg, formats: list[str], batches: list[int], prompts: dict, tokens: int,
                  ceiling: float, rounds: int = 3) -> list[dict]:
    """transformers and Strata (every expert resident, one engine per format), greedy decode.

    Every system is loaded at once and sampled in interleaved rounds (transformers, then each
    format, ``rounds`` times per batch size), so a slow spell of the host hits all of them alike;
    rows report the median and every sample.
    """
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    systems: dict[str, object] = {"transformers grouped_mm bf16": hf}
    rows, loads = [], {}
    for fmt in formats:            # "int4", or "int4/fp8": int4 experts, resident matrices in fp8
        experts, _, res = fmt.partition("/")
        try:
            systems[f"strata {fmt}"], loads[fmt] = strata_engine(hf, cfg, experts, max(batches), "bfloat16",
                                                                 resident_weights=res or "auto")
        except Exception as e:
            rows.append({"system": f"strata {fmt}", "error": "".join(traceback.format_exception(e))[-3000:]})
    for b in batches:
        hf.generate(torch.tensor(prompts[b], device="cuda"), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                    eos_token_id=None, pad_token_id=0)
        for name, sys_ in systems.items():
            if name != "transformers grouped_mm bf16":
                strata_sample(sys_, prompts[b], 4)                      # warm-up: graphs, compiles
        samples: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(rounds):
            for name, sys_ in systems.items():
                fn = hf_sample if name.startswith("transformers") else strata_sample
                samples[name].append(fn(sys_, prompts[b], tokens))
        for name, got in samples.items():
            row = {"system": name, "batch": b, "tok_s": statistics.median(got), "samples": got}
            if name.startswith("strata"):
                fmt = name.split()[1]
                experts, _, res = fmt.partition("/")
                nbytes = bytes_per_token(spec, experts, res or "bf16")
                roof = ceiling * 1e9 / nbytes
                row.update(load_s=loads[fmt], bytes_per_token=nbytes, roofline_tok_s=roof,
                           fraction_of_roofline=row["tok_s"] / roof if b == 1 else None,
                           cuda_graphs_active=systems[name].stats().cuda_graphs_active)
            rows.append(row)
    for name, sys_ in systems.items():
        if not name.startswith("transformers"):
            sys_.close()
    systems.clear()
    torch.cuda.empty_cache()
    base = {r["batch"]: r["tok_s"] for r in rows if r["system"].startswith("transformers")}
    for r in rows:
        if "tok_s" in r:
            r["vs_transformers"] = r["tok_s"] / base[r["batch"]]
    return rows


def print_tables(result: dict) -> None:
    for r in result.get("results", []):
        if "error" in r:
            print(f"{r['system']:<30} ERROR {r['error'][-300:]}")
            continue
        roof = f"{100 * r['fraction_of_roofline']:.1f}%" if r.get("fraction_of_roofline") else ""
        print(f"{r['system']:<30}{r['batch']:>6}{r['tok_s']:>10.1f}{r['vs_transformers']:>8.2f}{roof:>10}")
    if "offload" not in result:
        return
    print(f"pinned H2D {result['pinned_h2d_gbs']:.1f} GB/s; ms are per generated token; C = compute-only (100% pool), "
          "M = H2D bytes / pinned bandwidth; bus = H2D bytes / decode wall time")
    print(f"{'routing':<13}{'pool':>5}{'d':>2}{'rd':>3}{'cl':>3}{'B':>3}{'tok/s':>9}{'ms':>8}{'C+M':>8}{'max':>8}{'hit%':>6}{'pred%':>6}"
          f"{'pf+':>6}{'pf-':>6}{'MB/tok':>8}{'busGB/s':>8}{'wait':>7}{'hostw':>7}{'end':>6}{'x d0':>6}{'ideal':>6}{'peak/budget GB':>16}")
    for routing, block in result["offload"].items():
        if "error" in block:
            print(f"{routing}: ERROR {block['error'][-600:]}")
            continue
        for r in block["rows"]:
            mem = f"{r['engine_peak_gb']:.1f}/{r['budget_gb']:.1f}" if "engine_peak_gb" in r else "-"
            f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"   # noqa: E731
            rd = "D" if r.get("direct_reads") else "C"       # misses read directly / copied in
            cl = "-" if r.get("claims_per_layer") is None else str(r["claims_per_layer"])   # claims cap
            cl += "t" if r.get("predict") == "torch" else ""
            cl += "v" if r.get("claim_votes") == "gate" else ""      # claims gated by votes
            cl += "a" if r.get("policy") == "adaptive" else ""       # the adaptive LFU policy
            print(f"{routing:<13}{100 * r['pool_fraction']:>4.0f}%{r['depth']:>2}{rd:>3}{cl:>3}{r['batch']:>3}{r['tok_s']:>9.1f}"
                  f"{r['ms_per_token']:>8.2f}{f('serial_limit_ms', '8.2f'):>8}{f('overlap_limit_ms', '8.2f'):>8}"
                  f"{100 * r['hit_rate']:>6.1f}{f('misses_predicted', '6.0%'):>6}{r['prefetch_hits']:>6}{r['prefetch_wasted']:>6}"
                  f"{r['h2d_bytes_per_token'] / 1e6:>8.1f}{r['bus_gb_s']:>8.2f}{r['copy_wait_ms_per_token']:>7.2f}"
                  f"{r.get('host_wait_ms_per_token', 0.0):>7.2f}{r.get('step_end_ms_per_token', 0.0):>6.2f}"
                  f"{f('speedup_vs_depth0', '6.2f'):>6}{f('ideal_speedup_vs_depth0', '6.2f'):>6}{mem:>16}")
    for routing, block in result["offload"].items():
        if "error" not in block:
            hf = block["measured_hf"]
            print(f"{routing}: consecutive-layer cos {hf['consecutive_cos_mean']:.3f}, top-k found by prediction "
                  f"d1 {hf['topk_found_by_prediction']['depth1'] or 0:.2f} d2 {hf['topk_found_by_prediction']['depth2'] or 0:.2f}"
                  f" (chance {hf['chance_overlap']:.2f}), top-10% share {hf['top10_share']:.2f} (transformers), "
                  f"{block['engine_top10_share']:.2f} (engine, whole sweep)")
    for s in result["summary"]:
        line = f"{s['routing']} batch {s['batch']}" + (f", policy {s['policy']}" if s.get("policy") else "") + ":"
        if "pool50_depth2_over_depth0" in s:
            ideal = s["pool50_ideal"]
            line += (f" pool 50% depth2/depth0 {s['pool50_depth2_over_depth0']:.2f}x (ideal overlap "
                     f"{ideal:.2f}x, target 1.5x);" if ideal else "")
        if "pool50_depth2_over_depth0_by_variant" in s:
            line += " by variant " + ", ".join(f"{c}: {x:.2f}x" for c, x in
                                               s["pool50_depth2_over_depth0_by_variant"].items()) + ";"
        if "pool50_depth2_copy_over_depth0" in s:
            line += f" depth2 copying misses {s['pool50_depth2_copy_over_depth0']:.2f}x;"
        if "pool0_bus_gb_s" in s:
            line += (f" pool 0% vs pinned {s['pinned_gb_s']:.1f} GB/s (target 85%): bus {s['pool0_bus_gb_s']:.1f} GB/s "
                     f"({100 * s['pool0_bus_fraction_of_pinned']:.0f}%), depth-0 copies {s['pool0_serial_copy_gb_s']:.1f} "
                     f"GB/s ({100 * s['pool0_serial_copy_fraction_of_pinned']:.0f}%, bytes / (time - C));")
        if "within_budget" in s:
            line += f" engine peak {s['max_engine_peak_gb']:.1f} GB, within budget: {s['within_budget']}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4,fp8", help="resident Strata formats against transformers, e.g. int4,int4/fp8 (experts/resident "
                    "matrices); empty: none")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=None, help="decode tokens per sequence timed (64; --smoke 8)")
    ap.add_argument("--warmup", type=int, default=4, help="offload: sampled tokens per sequence before timing")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--offload", default="", help="expert format of an offload sweep (e.g. bf16); empty: none")
    ap.add_argument("--pools", default="0,0.25,0.5,1.0", help="pool shares of all experts; 1.0 gives C")
    ap.add_argument("--depths", default="0,1,2")
    ap.add_argument("--reads", default="auto", help="expert_reads of depth > 0 rows, e.g. auto,copy")
    ap.add_argument("--claims", default="", help="offload: most GPU-side prefetch claims per layer of depth > 0 "
                    "rows, e.g. 1,4 (empty: the engine's)")
    ap.add_argument("--predict", default="kernel", help="offload: how depth > 0 decode steps predict, e.g. "
                    "kernel,torch (one kernel; matmul + routing)")
    ap.add_argument("--claim-votes", default="off", help="offload: GPU-side claims gated by votes (gate) or "
                    "not (off, the engine's default), e.g. off,gate")
    ap.add_argument("--policies", default="adaptive", help="offload: eviction policies, each over the whole grid of a "
                    "round, e.g. lfu,adaptive")
    ap.add_argument("--routing", choices=("uniform", "trained-like", "both"), default="both")
    ap.add_argument("--budget", default="64G", help="gpu_memory_budget given to the offload engine")
    ap.add_argument("--repeat", type=int, default=1, help="offload: rounds over the grid (rows report medians)")
    ap.add_argument("--update-ratio", type=float, default=TrainedLike.update_ratio)
    ap.add_argument("--mean-share", type=float, default=TrainedLike.mean_share)
    ap.add_argument("--top10-share", type=float, default=TrainedLike.top10_share)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU: the offload sweep only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape, device = (SMOKE, "cpu") if args.smoke else (QWEN3_30B, "cuda")
    args.tokens = args.tokens or (8 if args.smoke else 64)
    std = base_std(shape)
    knobs = TrainedLike(update_ratio=args.update_ratio, mean_share=args.mean_share, top10_share=args.top10_share)
    result: dict = {"benchmark": "e2e_qwen3_30b_a3b_shape" + ("_smoke" if args.smoke else ""), "model": shape,
                    "init_std": std, "tokens": args.tokens, "warmup": args.warmup, "prompt_len": args.prompt_len}
    if not args.smoke:
        try:
            result["correctness"] = correctness()
        except Exception as e:   # keep measuring; the error is in the result file
            result["correctness"] = {"error": "".join(traceback.format_exception(e))[-2000:]}
        torch.cuda.empty_cache()
        result["copy_ceiling_gbs"] = copy_ceiling_gbs()
    hf, cfg = build_hf(shape, torch.float32 if args.smoke else torch.bfloat16, std, device)
    gen = torch.Generator().manual_seed(1)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = {b: torch.randint(10, cfg.vocab_size, (b, args.prompt_len), generator=gen).tolist() for b in batches}
    formats = [f for f in args.formats.split(",") if f]
    if not args.smoke and formats:
        result["results"] = resident_rows(hf, cfg, formats, batches, prompts, args.tokens, result["copy_ceiling_gbs"])
    if args.offload:
        sweep = Sweep(args.offload, tuple(float(p) for p in args.pools.split(",")),
                      tuple(int(d) for d in args.depths.split(",")), tuple(batches), args.tokens, args.warmup,
                      device, "float32" if args.smoke else "bfloat16", "64M" if args.smoke else "4G",
                      None if args.smoke else parse_size(args.budget, "budget"), args.repeat,
                      tuple(args.reads.split(",")),
                      tuple(int(c) for c in args.claims.split(",")) if args.claims else (None,),
                      tuple(args.predict.split(",")), tuple(args.claim_votes.split(",")),
                      tuple(args.policies.split(",")))
        result["pinned_h2d_gbs"] = pinned = h2d_bandwidth_gbs(device, 1 << (26 if args.smoke else 30))
        routings = ["uniform", "trained-like"] if args.routing == "both" else [args.routing]
        result["offload"] = offload_sweep(hf, cfg, sweep, routings, knobs, prompts, std)
        rows = [r for b in result["offload"].values() for r in b.get("rows", [])]
        add_limits(rows, pinned)
        result["summary"] = summarise(rows, pinned)
    if device == "cuda":
        result["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
    if args.out:
        write_result(args.out, result)
    if "correctness" in result:
        print(json.dumps(result["correctness"])[:600])
        print(f"copy ceiling {result['copy_ceiling_gbs']:.0f} GB/s")
    print_tables(result)


if __name__ == "__main__":
    main()
