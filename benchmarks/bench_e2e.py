"""End to end on the GPU: a Qwen3-30B-A3B-shaped model, Strata against transformers, same weights, same run.

    python benchmarks/bench_e2e.py --out benchmarks/results/e2e_DATE.json

The model (48 layers, 128 experts, top-8, hidden 2048, expert FFN 768, 30.5 B parameters) is built
in memory by transformers in bf16 on the GPU with random N(0, 0.02) weights (routing: random
routers on random inputs, near-uniform). transformers decodes with its grouped_mm experts; Strata
loads the same tensors from that model's state_dict, quantised at load to each --formats entry,
every expert resident, decode steps replayed from CUDA graphs. Each speed is reported against its
roofline: bytes read per token (resident weights + k routed experts per layer + LM head) over the
measured device-copy bandwidth. A correctness section first checks a tiny fp32 model on the GPU
(greedy tokens and logits against transformers).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402
from engine.checkpoint.memory import DictSource  # noqa: E402
from engine.checkpoint.plan import params_by_category  # noqa: E402
from engine.checkpoint.spec import spec_from_config  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.experts.layout import ExpertLayout  # noqa: E402
from engine.loading import LoadedModel  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

QWEN3_30B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                 num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                 num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=4096,
                 tie_word_embeddings=False, rms_norm_eps=1e-6)
TINY = dict(QWEN3_30B, vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
            num_experts_per_tok=2, max_position_embeddings=512)


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


def build_hf(shape: dict, dtype: torch.dtype, std: float):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    cfg = Qwen3MoeConfig(**shape)
    try:
        cfg._experts_implementation = "grouped_mm"
    except Exception:   # older releases: the default path
        pass
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, std)
    return model, cfg


def strata_engine(hf, cfg, fmt: str, max_batch: int, dtype: str, **options) -> tuple[LLMEngine, float]:
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    config = EngineConfig(model="in-memory", device="cuda", dtype=dtype, weight_format=fmt, max_batch=max_batch,
                          max_model_len=1024, kv_cache_size="4G", **options)
    t0 = time.perf_counter()
    engine = LLMEngine(config, LoadedModel(config, spec, DictSource(hf.state_dict()), None))
    torch.cuda.synchronize()
    return engine, time.perf_counter() - t0


def strata_decode(engine: LLMEngine, prompts: list[list[int]], n: int) -> float:
    """Aggregate decode tok/s: (time for n tokens - time for 1 token) over the n - 1 decode steps."""
    def run(k: int) -> float:
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(f"r{time.perf_counter_ns()}-{i}", p, SamplingParams(max_tokens=k, temperature=0.0,
                                                                                 ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    run(4)
    one, full = min(run(1) for _ in range(2)), min(run(n) for _ in range(2))
    return len(prompts) * (n - 1) / (full - one)


def hf_decode(hf, prompts: list[list[int]], n: int) -> float:
    ids = torch.tensor(prompts, device="cuda")
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)

        def run(k):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            hf.generate(ids, max_new_tokens=k, min_new_tokens=k, **kw)
            torch.cuda.synchronize()
            return time.perf_counter() - t0
        one, full = min(run(1) for _ in range(2)), min(run(n) for _ in range(2))
    return len(prompts) * (n - 1) / (full - one)


def bytes_per_token(spec, fmt: str) -> int:
    c = params_by_category(spec)
    resident = (c["attention"] + c["norms"] + c["router"] + c["dense_mlp"] + c["shared_experts"]) * 2
    lm_head = spec.vocab_size * spec.hidden * 2
    expert = ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, 128).nbytes
    return resident + lm_head + spec.hidden * 2 + spec.num_moe_layers * spec.top_k * expert


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


def offload_rows(hf, cfg, fmt: str, pools: list[float], depths: list[int], batches: list[int],
                 prompts: dict, tokens: int) -> list[dict]:
    """The full model with an offloaded expert pool, retuned live between measurements (pool size, depth)."""
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    expert = ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, 128).nbytes
    total = expert * spec.num_moe_layers * spec.num_experts
    engine, load_s = strata_engine(hf, cfg, fmt, max(batches), "bfloat16", expert_pool_size=int(total * pools[0]),
                                   prefetch_depth=depths[0])
    rows = []
    for pool in pools:
        for depth in depths:
            engine.reconfigure(expert_pool_size=int(total * pool), prefetch_depth=depth)
            for b in batches:
                before = engine.stats().experts
                tok_s = strata_decode(engine, prompts[b], tokens)
                after = engine.stats().experts
                looked = (after.hits + after.misses) - (before.hits + before.misses)
                rows.append({"system": f"strata {fmt} offload", "pool_fraction": pool, "depth": depth, "batch": b,
                             "tok_s": tok_s, "hit_rate": (after.hits - before.hits) / max(looked, 1),
                             "h2d_gb": (after.h2d_bytes - before.h2d_bytes) / 1e9,
                             "copy_wait_ms": after.copy_wait_ms - before.copy_wait_ms, "load_s": load_s})
    engine.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4,fp8")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--offload", default="", help="expert format of an offload sweep (e.g. int4); empty: none")
    ap.add_argument("--pools", default="0.5,0.25")
    ap.add_argument("--depths", default="0,2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    result: dict = {"benchmark": "e2e_qwen3_30b_a3b_shape", "model": QWEN3_30B, "routing": "random N(0,0.02) "
                    "weights: near-uniform routing", "tokens": args.tokens, "prompt_len": args.prompt_len}
    try:
        result["correctness"] = correctness()
    except Exception as e:   # keep measuring; the error is in the result file
        result["correctness"] = {"error": "".join(traceback.format_exception(e))[-2000:]}
    torch.cuda.empty_cache()
    result["copy_ceiling_gbs"] = ceiling = copy_ceiling_gbs()
    hf, cfg = build_hf(QWEN3_30B, torch.bfloat16, 0.02)
    gen = torch.Generator().manual_seed(1)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = {b: torch.randint(10, 150000, (b, args.prompt_len), generator=gen).tolist() for b in batches}
    rows = []
    for b in batches:
        rows.append({"system": "transformers grouped_mm bf16", "batch": b, "tok_s": hf_decode(hf, prompts[b],
                                                                                               args.tokens)})
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    for fmt in args.formats.split(","):
        try:
            engine, load_s = strata_engine(hf, cfg, fmt, max(batches), "bfloat16")
            for b in batches:
                tok_s = strata_decode(engine, prompts[b], args.tokens)
                roof = ceiling * 1e9 / bytes_per_token(spec, fmt)
                rows.append({"system": f"strata {fmt}", "batch": b, "tok_s": tok_s, "load_s": load_s,
                             "bytes_per_token": bytes_per_token(spec, fmt), "roofline_tok_s": roof,
                             "fraction_of_roofline": tok_s / roof if b == 1 else None,
                             "cuda_graphs_active": engine.stats().cuda_graphs_active})
            engine.close()
            del engine
        except Exception as e:
            rows.append({"system": f"strata {fmt}", "error": "".join(traceback.format_exception(e))[-3000:]})
        torch.cuda.empty_cache()
    if args.offload:
        try:
            result["offload"] = offload_rows(hf, cfg, args.offload, [float(p) for p in args.pools.split(",")],
                                             [int(d) for d in args.depths.split(",")], batches, prompts, args.tokens)
        except Exception as e:
            result["offload"] = [{"error": "".join(traceback.format_exception(e))[-3000:]}]
    base = {r["batch"]: r["tok_s"] for r in rows if r["system"].startswith("transformers")}
    for r in rows:
        if "tok_s" in r:
            r["vs_transformers"] = r["tok_s"] / base[r["batch"]]
    result["results"] = rows
    result["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
    if args.out:
        write_result(args.out, result)
    print(json.dumps(result["correctness"])[:600])
    print(f"copy ceiling {ceiling:.0f} GB/s")
    print(f"{'system':<30}{'batch':>6}{'tok/s':>10}{'x HF':>8}{'roofline':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['system']:<30} ERROR {r['error'][-300:]}")
            continue
        roof = f"{100 * r['fraction_of_roofline']:.1f}%" if r.get("fraction_of_roofline") else ""
        print(f"{r['system']:<30}{r['batch']:>6}{r['tok_s']:>10.1f}{r['vs_transformers']:>8.2f}{roof:>10}")
    for r in result.get("offload", []):
        if "error" in r:
            print("offload ERROR", r["error"][-600:])
            continue
        print(f"offload {r['system']:<22} pool {100 * r['pool_fraction']:3.0f}% depth {r['depth']} batch {r['batch']}: "
              f"{r['tok_s']:7.1f} tok/s  hit {100 * r['hit_rate']:5.1f}%  H2D {r['h2d_gb']:.2f} GB")


if __name__ == "__main__":
    main()
