"""The synthetic Qwen3-MoE model the end-to-end benchmark measures, and its "trained-like" routing.

The model is built in memory by transformers with random N(0, std) weights, std = 0.02 at hidden
2048 (0.02 * sqrt(2048 / hidden) elsewhere, so a normalised input meets the same pre-activation
scale at every width); ``strata_engine`` loads the same tensors into Strata.

Routing:

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
  0.41 on the smoke shape and 0.52 at 128 experts, top-8, 12 layers). Every parameter is a ratio, so
  the construction carries from the ``--smoke`` shape to the full one.

``routing_profile`` describes either model as offload meets it: the cosine between consecutive
layers' hidden states, how much of layer l+d's top-k its router applied to layer l's input finds
(d = 1, 2: what prefetch can get), and the top-10% share.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from engine.checkpoint.memory import DictSource
from engine.checkpoint.spec import spec_from_config
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.loading import LoadedModel

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


def base_std(shape: dict) -> float:
    return 0.02 * math.sqrt(2048 / shape["hidden_size"])


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so host clocks time it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profiled_steps(engine, steps: int, device: str):
    """``steps`` engine steps under torch.profiler (CPU and CUDA activity), then the rest of the engine's
    work run out: (the profile, wall milliseconds per profiled step)."""
    import time

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync(device)
        wall = (time.perf_counter() - t0) * 1e3 / steps
    while engine.has_unfinished():
        engine.step()
    return prof, wall


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


# ---- the same weights in Strata ----------------------------------------------------------------
def strata_engine(hf, cfg, fmt: str, max_batch: int, dtype: str, device: str = "cuda", kv_cache_size: str = "4G",
                  max_model_len: int = 1024, **options) -> tuple[LLMEngine, float]:
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    config = EngineConfig(model="in-memory", device=device, dtype=dtype, weight_format=fmt, max_batch=max_batch,
                          max_model_len=max_model_len, kv_cache_size=kv_cache_size, **options)
    t0 = time.perf_counter()
    engine = LLMEngine(config, LoadedModel(config, spec, DictSource(hf.state_dict()), None))
    sync(device)
    return engine, time.perf_counter() - t0



def kit_model(layers: int, smoke: bool):
    """The llama.cpp kit's shape (Qwen3-30B-A3B, ``layers`` layers) in bf16 on the GPU, or with ``smoke``
    the small shape in float32 on the CPU (a check of a script, not a measurement): (hf, cfg, shape, device)."""
    device = "cpu" if smoke else "cuda"
    shape = dict(SMOKE if smoke else QWEN3_30B, num_hidden_layers=layers)
    hf, cfg = build_hf(shape, torch.float32 if smoke else torch.bfloat16, base_std(shape), device=device)
    return hf, cfg, shape, device
