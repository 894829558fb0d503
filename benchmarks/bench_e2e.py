"""End to end: a Qwen3-30B-A3B-shaped model, Strata against transformers, and an expert-offload sweep.

    python benchmarks/bench_e2e.py --out benchmarks/results/e2e_DATE.json                  # resident
    python benchmarks/bench_e2e.py --formats "" --offload bf16 --pools 0,0.25,0.5,1.0 \\
        --depths 0,1,2 --tokens 24 --out benchmarks/results/offload_DATE.json              # offload sweep
    python benchmarks/bench_e2e.py --smoke --offload bf16                                  # CPU check

The model (48 layers, 128 experts, top-8, hidden 2048, expert FFN 768, 30.5 B parameters) is built
in memory by transformers in bf16 on the GPU with random N(0, std) weights, std = 0.02 at hidden
2048 (0.02 * sqrt(2048 / hidden) elsewhere, so a normalised input meets the same pre-activation
scale at every width).

Sections, in order:

* correctness: a tiny fp32 model on the GPU, Strata (Triton kernels, CUDA graphs) against
  transformers (greedy tokens, logits), and an offloaded pool against every expert resident.
* resident (``--formats``, empty: skip): transformers decodes greedily with its grouped_mm experts;
  Strata loads the same tensors quantised at load to each format, every expert resident. Each speed
  is reported against its roofline: bytes read per token over the measured device-copy bandwidth.
* offload (``--offload FMT``): one engine per routing, retuned live between rows (expert pool share
  x prefetch depth x batch). Decoding samples at temperature 1.0 with fixed seeds, so tokens and
  routing change every step. The 100% pool row of a batch is the compute-only time per token C.
  Per row: tok/s, hit rate, prefetch hits/wasted, H2D bytes per token, bus utilisation (H2D bytes
  over decode wall time: the engine does not time its copies), copy_wait_ms per token (compute
  stalled on copies), the bus limit M = H2D bytes per token / pinned H2D bandwidth (measured in the
  same run), C + M (copies not overlapped) and max(C, M) (perfectly overlapped), the ideal depth>0
  speed-up over depth 0, (C + M0) / max(C, M0), and the peak of torch.cuda.max_memory_allocated
  above what was allocated before the engine, against the gpu_memory_budget passed to it.

Routing (``--routing``, default both, one block of offload rows each):

* uniform: the plain random model. Routers see random inputs: expert popularity is near-uniform.
* trained-like: the same random model reshaped in the two properties that decide offload behaviour
  in trained models. (a) A residual-dominated stream: every o_proj and expert down_proj (shared
  experts too, if any) is scaled so that each sub-layer adds an update of rms ``update_ratio`` x the
  embedding rms (calibrated over a few forward passes), so consecutive hidden states stay similar.
  (b) Skewed popularity: every embedding row gets a common component ``mean_share`` x its own
  random norm along a fixed random direction m (trained residual streams carry a large mean
  direction); router rows are made orthogonal to m and then given a bias along m, scaled per layer
  by the measured mean projection of the router input on m, that adds -s * ln(rank) logit standard
  deviations to expert of popularity rank ``rank`` (random order per layer); s is solved by
  simulating top-k over Gaussian logits so the top 10% of experts take ``top10_share`` of
  assignments from the bias alone (the random model's own skew comes on top: 0.3 gives a measured
  0.41 on the smoke shape and 0.52 at 128 experts, top-8, 12 layers). Every parameter is a ratio, so the construction carries from the ``--smoke`` shape to
  the full one. Both blocks record, measured in the run: the cosine between consecutive layers'
  hidden states, how much of layer l+d's top-k its router applied to layer l's input finds
  (d = 1, 2: what prefetch can get), and the top-10% share, from transformers on the calibration
  prompts and from the engine's activation counts over the sweep.

``--smoke``: a tiny shape, the whole offload sweep on the CPU in float32 (no correctness or
transformers rows) in seconds; "pinned bandwidth" is then a host memcpy.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import h2d_bandwidth_gbs, write_result  # noqa: E402
from engine.checkpoint.memory import DictSource  # noqa: E402
from engine.checkpoint.plan import params_by_category  # noqa: E402
from engine.checkpoint.spec import spec_from_config  # noqa: E402
from engine.config import EngineConfig, parse_size  # noqa: E402
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
SMOKE = dict(QWEN3_30B, vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
             num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=32,
             num_experts_per_tok=4, max_position_embeddings=512)


@dataclasses.dataclass(frozen=True)
class TrainedLike:
    """Ratios that shape a random model's routing like a trained one (see the module docstring)."""

    update_ratio: float = 0.4        # rms of each sub-layer's update / rms of the embeddings
    mean_share: float = 1.0          # norm of the common embedding component / norm of the random part
    top10_share: float = 0.3         # share of assignments the top 10% of experts take, per layer
    calibration_passes: int = 3
    seed: int = 1234


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The offload grid and how each row is measured."""

    fmt: str
    pools: tuple[float, ...]         # shares of all routed experts held in the GPU pool
    depths: tuple[int, ...]
    batches: tuple[int, ...]
    tokens: int                      # timed decode tokens per sequence
    warmup: int                      # decode tokens per sequence before the clock starts
    device: str
    dtype: str
    kv_cache_size: str
    budget: int | None               # gpu_memory_budget passed to the engine (None on the CPU)
    repeat: int = 1                  # rounds over the grid; a row reports its median round


def base_std(shape: dict) -> float:
    return 0.02 * math.sqrt(2048 / shape["hidden_size"])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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


def build_hf(shape: dict, dtype: torch.dtype, std: float, device: str = "cuda"):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    cfg = Qwen3MoeConfig(**shape)
    if device.startswith("cuda"):
        try:
            cfg._experts_implementation = "grouped_mm"
        except Exception:   # older releases: the default path
            pass
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, std)
    return model, cfg


# ---- routing shape: capture, measure, reshape --------------------------------------------------
def _capture(hf, ids: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """One forward over ``ids [B, S]``: per layer the attention update, the MoE input and update,
    and the residual stream at each layer's start (``hidden[L]`` is the final normed state), as
    float32 ``[N, D]``."""
    got: dict[str, list[torch.Tensor]] = {"attn": [], "moe_in": [], "moe": []}
    flat = lambda t: (t[0] if isinstance(t, tuple) else t).reshape(-1, t.shape[-1] if not isinstance(t, tuple)  # noqa: E731
                                                                   else t[0].shape[-1]).float()
    hooks = []
    for layer in hf.model.layers:
        hooks.append(layer.self_attn.register_forward_hook(lambda m, a, out: got["attn"].append(flat(out))))
        hooks.append(layer.mlp.register_forward_pre_hook(lambda m, a: got["moe_in"].append(flat(a[0]))))
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, out: got["moe"].append(flat(out))))
    try:
        with torch.no_grad():
            out = hf(ids, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    got["hidden"] = [h.reshape(-1, h.shape[-1]).float() for h in out.hidden_states]
    return got


def _rms(t: torch.Tensor) -> float:
    return float(t.pow(2).mean().sqrt())


def _topk_mask(x: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    """``x [N, D]`` routed by ``w [E, D]``: a 0/1 mask ``[N, E]`` of each token's top-k experts."""
    ids = (x @ w.float().t()).topk(k, dim=-1).indices                     # [N, k]
    return torch.zeros(x.shape[0], w.shape[0], device=x.device).scatter_(1, ids, 1.0)


def top_share(counts: torch.Tensor, frac: float = 0.1) -> float:
    """Mean over layers of the share of assignments that the top ``frac`` of experts take; counts [L, E]."""
    counts = counts.float()
    top = math.ceil(frac * counts.shape[1])
    per = counts.sort(dim=1, descending=True).values[:, :top].sum(1) / counts.sum(1).clamp(min=1)
    return float(per.mean())


@torch.no_grad()
def routing_profile(hf, ids: torch.Tensor) -> dict:
    """What offload meets in this model, measured with transformers on ``ids``."""
    got, layers = _capture(hf, ids), hf.model.layers
    k, hs = hf.config.num_experts_per_tok, got["hidden"]
    cos = [float(torch.nn.functional.cosine_similarity(hs[i], hs[i + 1], dim=-1).mean()) for i in range(len(layers))]
    actual = [_topk_mask(x, layer.mlp.gate.weight, k) for x, layer in zip(got["moe_in"], layers)]   # [N, E] each
    overlap = {}
    for d in (1, 2):
        # the predictor folds layer l+d's norm weight into its router and applies it to layer l's residual
        found = [(_topk_mask(hs[i], layers[i + d].mlp.gate.weight * layers[i + d].post_attention_layernorm.weight, k)
                  * actual[i + d]).sum(1).mean() / k for i in range(len(layers) - d)]
        overlap[f"depth{d}"] = float(torch.stack(found).mean()) if found else None
    return {"consecutive_cos_mean": sum(cos) / len(cos), "consecutive_cos_by_layer": [round(c, 3) for c in cos],
            "topk_found_by_prediction": overlap, "chance_overlap": k / hf.config.num_experts,
            "top10_share": top_share(torch.stack([a.sum(0) for a in actual]))}


def zipf_exponent(num_experts: int, top_k: int, share: float, tokens: int = 8192) -> float:
    """The s for which logits N(0, 1) - s ln(rank) put ``share`` of top-k picks on the top 10% of experts."""
    noise = torch.randn(tokens, num_experts, generator=torch.Generator().manual_seed(0))
    ln_rank = torch.arange(1, num_experts + 1).float().log()

    def got(s: float) -> float:
        ids = (noise - s * ln_rank).topk(top_k, dim=-1).indices
        return top_share(torch.bincount(ids.reshape(-1), minlength=num_experts)[None])
    lo, hi = 0.0, 10.0
    for _ in range(40):
        lo, hi = ((lo + hi) / 2, hi) if got((lo + hi) / 2) < share else (lo, (lo + hi) / 2)
    return (lo + hi) / 2


@torch.no_grad()
def make_trained_like(hf, std: float, knobs: TrainedLike, ids: torch.Tensor) -> dict:
    """Reshape ``hf``'s random weights in place (see the module docstring); returns what was chosen."""
    layers, D = hf.model.layers, hf.config.hidden_size
    gen = torch.Generator().manual_seed(knobs.seed)
    m = torch.randn(D, generator=gen)
    m = (m / m.norm()).to(hf.device)                                       # [D] the common direction
    emb = hf.model.embed_tokens.weight
    emb.add_((knobs.mean_share * std * math.sqrt(D) * m).to(emb.dtype))
    for layer in layers:
        w = layer.mlp.gate.weight.float()                                  # [E, D]
        layer.mlp.gate.weight.copy_(w - (w @ m)[:, None] * m[None])
    emb_rms = _rms(emb.float())
    o_scale, down_scale = [1.0] * len(layers), [1.0] * len(layers)
    for _ in range(knobs.calibration_passes):
        got = _capture(hf, ids)
        for i, layer in enumerate(layers):
            fa, fm = knobs.update_ratio * emb_rms / _rms(got["attn"][i]), knobs.update_ratio * emb_rms / _rms(got["moe"][i])
            layer.self_attn.o_proj.weight.mul_(fa)
            for name, p in layer.mlp.named_parameters():
                if "down_proj" in name:
                    p.mul_(fm)
            o_scale[i], down_scale[i] = o_scale[i] * fa, down_scale[i] * fm
    E, k = hf.config.num_experts, hf.config.num_experts_per_tok
    s = zipf_exponent(E, k, knobs.top10_share)
    got, proj = _capture(hf, ids), []
    for i, layer in enumerate(layers):
        x, w = got["moe_in"][i], layer.mlp.gate.weight.float()            # [N, D], [E, D]
        sigma, c = float((x @ w.t()).std()), float((x @ m).mean())        # logit spread, mean projection on m
        rank = (torch.randperm(E, generator=gen) + 1).float().to(hf.device)
        layer.mlp.gate.weight.copy_(w + (-s * rank.log() * sigma / c)[:, None] * m[None])
        proj.append(round(c, 3))
    return {**dataclasses.asdict(knobs), "zipf_exponent": s, "o_proj_scale": [round(f, 5) for f in o_scale],
            "down_proj_scale": [round(f, 5) for f in down_scale], "router_input_projection_on_m": proj}


# ---- Strata engines and decode timing ----------------------------------------------------------
def strata_engine(hf, cfg, fmt: str, max_batch: int, dtype: str, device: str = "cuda", kv_cache_size: str = "4G",
                  **options) -> tuple[LLMEngine, float]:
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    config = EngineConfig(model="in-memory", device=device, dtype=dtype, weight_format=fmt, max_batch=max_batch,
                          max_model_len=1024, kv_cache_size=kv_cache_size, **options)
    t0 = time.perf_counter()
    engine = LLMEngine(config, LoadedModel(config, spec, DictSource(hf.state_dict()), None))
    _sync(device)
    return engine, time.perf_counter() - t0


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
    for fmt in formats:
        try:
            systems[f"strata {fmt}"], loads[fmt] = strata_engine(hf, cfg, fmt, max(batches), "bfloat16")
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
                roof = ceiling * 1e9 / bytes_per_token(spec, fmt)
                row.update(load_s=loads[fmt], bytes_per_token=bytes_per_token(spec, fmt), roofline_tok_s=roof,
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


def sampled_decode(engine: LLMEngine, prompts: list[list[int]], sweep: Sweep, seed: int):
    """Sample (temperature 1, seeded) ``warmup + tokens`` tokens per prompt; time only the last
    ``tokens`` steps. Returns (tokens timed, seconds, expert stats before, after, host ms blocked on
    routing reads)."""
    ids = [engine.add_request(None, p, SamplingParams(max_tokens=sweep.warmup + sweep.tokens, temperature=1.0,
                                                      seed=seed + i, ignore_eos=True)) for i, p in enumerate(prompts)]
    made = dict.fromkeys(ids, 0)

    def step() -> None:
        for d in engine.step():
            made[d.request_id] += len(d.new_token_ids)

    def snapshot():
        engine.stats()                  # on CUDA a snapshot returns the device counts of the call before
        _sync(sweep.device)
        return engine.stats().experts
    while min(made.values()) < sweep.warmup:
        step()
    before, done = snapshot(), sum(made.values())
    experts = engine.loaded.experts
    sync0 = getattr(experts, "host_sync_ms", 0.0)
    t0 = time.perf_counter()
    while engine.has_unfinished():
        step()
    _sync(sweep.device)
    seconds = time.perf_counter() - t0
    after = snapshot()
    return sum(made.values()) - done, seconds, before, after, getattr(experts, "host_sync_ms", 0.0) - sync0


def _row(routing: str, pool: float, depth: int, batch: int, timed, base_bytes: int, budget: int | None) -> dict:
    n, secs, before, after, host_wait = timed
    d = lambda f: getattr(after, f) - getattr(before, f)   # noqa: E731
    looked = d("hits") + d("misses")
    row = {"routing": routing, "pool_fraction": pool, "depth": depth, "batch": batch, "tokens": n,
           "tok_s": n / secs, "ms_per_token": 1e3 * secs / n, "hit_rate": d("hits") / looked if looked else 1.0,
           "prefetch_hits": d("prefetch_hits"), "prefetch_wasted": d("prefetch_wasted"),
           "h2d_bytes_per_token": d("h2d_bytes") / n, "bus_gb_s": d("h2d_bytes") / secs / 1e9,
           "copy_wait_ms_per_token": d("copy_wait_ms") / n,
           # wall time the host spent blocked on routing reads (GPU busy); the rest is host work
           "host_wait_ms_per_token": host_wait / n}
    if torch.cuda.is_available() and budget is not None:
        peak = torch.cuda.max_memory_allocated()
        row.update(peak_allocated_gb=peak / 1e9, engine_peak_gb=(peak - base_bytes) / 1e9, budget_gb=budget / 1e9,
                   within_budget=peak - base_bytes <= budget)
    return row


def offload_block(hf, cfg, sweep: Sweep, prompts: dict, routing: str) -> dict:
    """One engine over ``hf``'s weights, retuned live for each (pool, depth), every batch size decoded."""
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    expert = ExpertLayout.make(sweep.fmt, spec.hidden, spec.moe_ffn, 128).nbytes
    total = expert * spec.num_moe_layers * spec.num_experts
    cuda = sweep.device.startswith("cuda")
    # what is not the engine's: transformers' model, which shares the GPU during the sweep
    base = sum(t.numel() * t.element_size() for t in [*hf.parameters(), *hf.buffers()]) if cuda else 0
    budget = {} if sweep.budget is None else {"gpu_memory_budget": sweep.budget}
    engine, load_s = strata_engine(hf, cfg, sweep.fmt, max(sweep.batches), sweep.dtype, sweep.device,
                                   sweep.kv_cache_size, expert_pool_size=int(total * sweep.pools[0]),
                                   prefetch_depth=sweep.depths[0], **budget)
    rows = []
    try:
        for _ in range(sweep.repeat):      # rounds: a slow spell of the host hits every setting alike
            for pool in sweep.pools:
                for depth in sweep.depths if pool < 1 else sweep.depths[:1]:   # a full pool never prefetches
                    for b in sweep.batches:
                        if cuda:
                            torch.cuda.reset_peak_memory_stats()
                        engine.reconfigure(expert_pool_size=int(total * pool), prefetch_depth=depth)
                        timed = sampled_decode(engine, prompts[b], sweep, seed=1000 * len(rows))
                        rows.append(_row(routing, pool, depth, b, timed, base, sweep.budget))
        rows = _medians(rows)
        acts = torch.tensor(engine.stats().experts.activations)                        # [L, E]
        plan_budget = engine.loaded.plan.budget_bytes
    finally:
        engine.close()
    return {"rows": rows, "engine_top10_share": top_share(acts), "load_s": load_s, "expert_bytes": expert,
            "gpu_memory_budget": sweep.budget, "engine_plan_budget": plan_budget}


def _medians(rows: list[dict]) -> list[dict]:
    """One row per setting: its median round by time per token, with every round's tok/s; the
    memory peak is the largest of any round."""
    out = []
    for key in dict.fromkeys((r["pool_fraction"], r["depth"], r["batch"]) for r in rows):
        mine = sorted((r for r in rows if (r["pool_fraction"], r["depth"], r["batch"]) == key),
                      key=lambda r: r["ms_per_token"])
        row = dict(mine[(len(mine) - 1) // 2])
        row["rounds_tok_s"] = [r["tok_s"] for r in mine]
        if "engine_peak_gb" in row:
            row["engine_peak_gb"] = max(r["engine_peak_gb"] for r in mine)
            row["within_budget"] = all(r["within_budget"] for r in mine)
        out.append(row)
    return out


def add_limits(rows: list[dict], pinned_gbs: float) -> None:
    """Each row against its physical limits (see the module docstring); ms are per generated token."""
    compute = {(r["routing"], r["batch"]): r["ms_per_token"] for r in rows if r["pool_fraction"] >= 1}
    depth0 = {(r["routing"], r["pool_fraction"], r["batch"]): r for r in rows if r["depth"] == 0}
    bus_ms = lambda r: r["h2d_bytes_per_token"] / pinned_gbs / 1e6   # noqa: E731
    for r in rows:
        r["bus_limit_ms"], r["bus_fraction_of_pinned"] = bus_ms(r), r["bus_gb_s"] / pinned_gbs
        c = compute.get((r["routing"], r["batch"]))
        if c is None:
            continue
        m = bus_ms(r)
        r.update(compute_ms=c, serial_limit_ms=c + m, overlap_limit_ms=max(c, m),
                 fraction_of_overlap_limit=max(c, m) / r["ms_per_token"])
        if r["depth"] == 0 and r["h2d_bytes_per_token"] and r["ms_per_token"] > c:
            # copies and compute do not overlap at depth 0: the time above C is the copies'
            r["serial_copy_gb_s"] = r["h2d_bytes_per_token"] / (r["ms_per_token"] - c) / 1e6
        z = depth0.get((r["routing"], r["pool_fraction"], r["batch"]))
        if r["depth"] > 0 and z is not None and r["pool_fraction"] < 1:
            m0 = bus_ms(z)
            r["speedup_vs_depth0"] = z["ms_per_token"] / r["ms_per_token"]
            r["ideal_speedup_vs_depth0"] = (c + m0) / max(c, m0)


def summarise(rows: list[dict], pinned_gbs: float) -> list[dict]:
    """Per (routing, batch): the issue's three targets next to their limits."""
    out = []
    for key in dict.fromkeys((r["routing"], r["batch"]) for r in rows):
        mine = [r for r in rows if (r["routing"], r["batch"]) == key]
        pick = lambda pool, depth: next((r for r in mine if r["pool_fraction"] == pool and r["depth"] == depth), None)  # noqa: E731
        s: dict = {"routing": key[0], "batch": key[1], "pinned_gb_s": pinned_gbs}
        d0, d2 = pick(0.5, 0), pick(0.5, 2)
        if d0 and d2:
            s.update(pool50_depth2_over_depth0=d0["ms_per_token"] / d2["ms_per_token"],
                     pool50_ideal=d2.get("ideal_speedup_vs_depth0"))
        empty = [r for r in mine if r["pool_fraction"] == 0]
        if empty:
            s["pool0_bus_gb_s"] = max(r["bus_gb_s"] for r in empty)
            s["pool0_serial_copy_gb_s"] = max((r.get("serial_copy_gb_s", 0.0) for r in empty), default=0.0)
            s["pool0_bus_fraction_of_pinned"] = s["pool0_bus_gb_s"] / pinned_gbs
            s["pool0_serial_copy_fraction_of_pinned"] = s["pool0_serial_copy_gb_s"] / pinned_gbs
        if any("within_budget" in r for r in mine):
            s["max_engine_peak_gb"] = max(r["engine_peak_gb"] for r in mine)
            s["within_budget"] = all(r["within_budget"] for r in mine)
        out.append(s)
    return out


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
    print(f"{'routing':<13}{'pool':>5}{'d':>2}{'B':>3}{'tok/s':>9}{'ms':>8}{'C+M':>8}{'max':>8}{'hit%':>6}"
          f"{'pf+':>6}{'pf-':>6}{'MB/tok':>8}{'busGB/s':>8}{'wait':>7}{'hostw':>7}{'x d0':>6}{'ideal':>6}{'peak/budget GB':>16}")
    for routing, block in result["offload"].items():
        if "error" in block:
            print(f"{routing}: ERROR {block['error'][-600:]}")
            continue
        for r in block["rows"]:
            mem = f"{r['engine_peak_gb']:.1f}/{r['budget_gb']:.1f}" if "engine_peak_gb" in r else "-"
            f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"   # noqa: E731
            print(f"{routing:<13}{100 * r['pool_fraction']:>4.0f}%{r['depth']:>2}{r['batch']:>3}{r['tok_s']:>9.1f}"
                  f"{r['ms_per_token']:>8.2f}{f('serial_limit_ms', '8.2f'):>8}{f('overlap_limit_ms', '8.2f'):>8}"
                  f"{100 * r['hit_rate']:>6.1f}{r['prefetch_hits']:>6}{r['prefetch_wasted']:>6}"
                  f"{r['h2d_bytes_per_token'] / 1e6:>8.1f}{r['bus_gb_s']:>8.2f}{r['copy_wait_ms_per_token']:>7.2f}"
                  f"{r.get('host_wait_ms_per_token', 0.0):>7.2f}"
                  f"{f('speedup_vs_depth0', '6.2f'):>6}{f('ideal_speedup_vs_depth0', '6.2f'):>6}{mem:>16}")
    for routing, block in result["offload"].items():
        if "error" not in block:
            hf = block["measured_hf"]
            print(f"{routing}: consecutive-layer cos {hf['consecutive_cos_mean']:.3f}, top-k found by prediction "
                  f"d1 {hf['topk_found_by_prediction']['depth1'] or 0:.2f} d2 {hf['topk_found_by_prediction']['depth2'] or 0:.2f}"
                  f" (chance {hf['chance_overlap']:.2f}), top-10% share {hf['top10_share']:.2f} (transformers), "
                  f"{block['engine_top10_share']:.2f} (engine, whole sweep)")
    for s in result["summary"]:
        line = f"{s['routing']} batch {s['batch']}:"
        if "pool50_depth2_over_depth0" in s:
            ideal = s["pool50_ideal"]
            line += (f" pool 50% depth2/depth0 {s['pool50_depth2_over_depth0']:.2f}x (ideal overlap "
                     f"{ideal:.2f}x, target 1.5x);" if ideal else "")
        if "pool0_bus_gb_s" in s:
            line += (f" pool 0% vs pinned {s['pinned_gb_s']:.1f} GB/s (target 85%): bus {s['pool0_bus_gb_s']:.1f} GB/s "
                     f"({100 * s['pool0_bus_fraction_of_pinned']:.0f}%), depth-0 copies {s['pool0_serial_copy_gb_s']:.1f} "
                     f"GB/s ({100 * s['pool0_serial_copy_fraction_of_pinned']:.0f}%, bytes / (time - C));")
        if "within_budget" in s:
            line += f" engine peak {s['max_engine_peak_gb']:.1f} GB, within budget: {s['within_budget']}"
        print(line)


def offload_sweep(hf, cfg, sweep: Sweep, routings: list[str], knobs: TrainedLike, prompts: dict, std: float) -> dict:
    """The offload blocks, uniform first: the trained-like reshaping changes ``hf`` in place."""
    calib = torch.randint(10, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(2)).to(hf.device)
    blocks: dict = {}
    for routing in [r for r in ("uniform", "trained-like") if r in routings]:
        try:
            block = {"construction": make_trained_like(hf, std, knobs, calib)} if routing == "trained-like" else {}
            block["measured_hf"] = routing_profile(hf, calib)
            block.update(offload_block(hf, cfg, sweep, prompts, routing))
        except Exception as e:   # keep measuring; the error is in the result file
            block = {"error": "".join(traceback.format_exception(e))[-3000:]}
        blocks[routing] = block
        if sweep.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4,fp8", help="resident Strata formats against transformers; empty: none")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=None, help="decode tokens per sequence timed (64; --smoke 8)")
    ap.add_argument("--warmup", type=int, default=4, help="offload: sampled tokens per sequence before timing")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--offload", default="", help="expert format of an offload sweep (e.g. bf16); empty: none")
    ap.add_argument("--pools", default="0,0.25,0.5,1.0", help="pool shares of all experts; 1.0 gives C")
    ap.add_argument("--depths", default="0,1,2")
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
                      None if args.smoke else parse_size(args.budget, "budget"), args.repeat)
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
