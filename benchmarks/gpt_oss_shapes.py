"""gpt-oss-shaped models with random weights, built in memory with their experts as MXFP4 bytes.

The shapes are the published models' (``SHAPES``): 120b (36 layers, 128 experts, top-4) and 20b
(24 layers, 32 experts), both hidden 2880, expert FFN 2880, 64 query / 8 KV heads of 64, vocab
201088, sliding-window (128) layers alternating with full ones; ``tiny-*`` keep that layout at CPU
size. ``config_dict`` is transformers' own ``GptOssConfig`` with an MXFP4 ``quantization_config``, so
the engine plans MXFP4 experts, as for the shipped checkpoints.

:class:`RandomGptOss` is the tensor source the engine loads from. Resident tensors are drawn on the
device in the engine's dtype when the loader asks for them (never held twice): N(0, std) matrices,
std = ``synthetic_moe.base_std`` (0.02 at hidden 2048), RMSNorm weights 1, sinks 0, biases 0 but the
router's (a bias is common to every token: random ones would route all tokens alike, skewing the
"uniform" model). Routed experts never exist as floats: ``read_experts`` (the loader's hook for
experts packed already) draws each MoE layer's rows ``uint8 [E, nbytes]`` on the device and copies
them into the host store's rows: uniformly random e2m1 bytes (every code is a valid value; their
rms is ``FP4_RMS``), e8m0 scale bytes of 2^e or 2^(e+1), mixed so that each matrix's weights have
rms std, and zero biases.

Routing (:func:`make_routing`):

* uniform: the plain random model; embeddings N(0, std), so every sub-layer's update outweighs the
  residual stream and routing is near-uniform.
* trained-like: the two properties of synthetic_moe's construction that decide offload behaviour,
  with gpt-oss's router bias doing the skew directly. (a) A residual-dominated stream: embeddings of
  rms ``U / update_ratio`` and o_proj of an std that gives one position's attention update rms U,
  where U is the MoE update's rms, measured on one such expert with normed random inputs (the output
  rms of one expert / sqrt(k), as for k equally weighted experts). (b) Skewed popularity: router bias
  ``-s * ln(rank) * sigma`` with sigma = std * sqrt(D), the router logits' spread over normed inputs,
  ranks a random order per layer, s from ``synthetic_moe.zipf_exponent`` for ``top10_share``.

Legend: E experts, D hidden, F expert FFN, H query heads, hd head dim, V vocab.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from pathlib import Path

import torch

from benchmarks.synthetic_moe import TrainedLike, base_std, zipf_exponent
from engine.checkpoint import families as fn
from engine.checkpoint.plan import router_bias_name, tensor_plan
from engine.checkpoint.reader import TensorSource, dtype_name
from engine.checkpoint.spec import ModelSpec, spec_from_config
from kernels.expert_layout import ExpertLayout
from engine.experts.store import HostExpertStore, host_rows
from engine.loading import LoadedModel
from kernels.quant.mxfp4 import FP4_VALUES
from kernels.fused_moe import fused_moe_ref

_WIDTHS = {"hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 64, "vocab_size": 201088, "sliding_window": 128, "num_experts_per_tok": 4}
_TINY = {"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "vocab_size": 256, "sliding_window": 8, "num_experts_per_tok": 2}
SHAPES = {
    "120b": {**_WIDTHS, "num_hidden_layers": 36, "num_local_experts": 128},
    "20b": {**_WIDTHS, "num_hidden_layers": 24, "num_local_experts": 32},
    "tiny-120b": {**_TINY, "num_hidden_layers": 4, "num_local_experts": 16},
    "tiny-20b": {**_TINY, "num_hidden_layers": 4, "num_local_experts": 8},
}
TRAINED_LIKE = TrainedLike()
FP4_RMS = math.sqrt(sum(v * v for v in FP4_VALUES) / len(FP4_VALUES))   # of uniformly random e2m1 codes


def config_dict(shape: str) -> dict:
    """config.json of a gpt-oss model of ``shape`` whose experts ship as MXFP4."""
    from transformers import GptOssConfig
    kw = SHAPES[shape]
    n = kw["num_hidden_layers"]
    cfg = GptOssConfig(**kw, layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)])
    keep = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    return {**cfg.to_dict(), "architectures": ["GptOssForCausalLM"],
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": keep}}


def model_spec(shape: str) -> ModelSpec:
    return spec_from_config(config_dict(shape), Path(f"gpt-oss-{shape}-shape"))


@dataclasses.dataclass(frozen=True)
class Routing:
    """How the random weights are shaped (see the module docstring)."""

    name: str                     # "uniform" | "trained-like"
    weight_std: float             # every random matrix but the embeddings and o_proj
    emb_std: float
    o_std: float
    bias_scale: float             # router bias of the expert of popularity rank r: -bias_scale * ln(r)
    knobs: TrainedLike = TRAINED_LIKE
    moe_update_rms: float | None = None

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def make_routing(name: str, spec: ModelSpec, layout: ExpertLayout, device: torch.device,
                 knobs: TrainedLike = TRAINED_LIKE) -> Routing:
    """``uniform`` or ``trained-like`` weights for ``spec`` (the MoE update is measured on ``device``)."""
    std = base_std({"hidden_size": spec.hidden})
    if name == "uniform":
        return Routing(name, std, std, std, 0.0, knobs)
    if name != "trained-like":
        raise ValueError(f"routing {name!r}: choose uniform or trained-like")
    u = moe_update_rms(layout, std, spec.top_k, device, knobs.seed)
    o_std = u / (std * math.sqrt(spec.hidden) * math.sqrt(spec.num_heads * spec.head_dim))
    s = zipf_exponent(spec.num_experts, spec.top_k, knobs.top10_share)
    return Routing(name, std, u / knobs.update_ratio, o_std, s * std * math.sqrt(spec.hidden), knobs, u)


def scale_bytes(shape: tuple[int, ...], std: float, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """e8m0 bytes of 2^e or 2^(e+1) (shares chosen so uniformly random e2m1 values get rms ``std``)."""
    e = math.floor(math.log2(std / FP4_RMS))
    p = ((std / FP4_RMS) ** 2 / 4.0 ** e - 1.0) / 3.0        # share of 2^(e+1): p*4 + (1-p) = (std/rms)^2 / 4^e
    up = torch.rand(shape, generator=gen, device=device) < p
    return (127 + e + up.to(torch.int32)).to(torch.uint8)


def expert_rows(layout: ExpertLayout, n: int, std: float, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``n`` random MXFP4 experts of ``layout``: ``uint8 [n, nbytes]`` on ``device``."""
    if layout.fmt != "mxfp4":
        raise ValueError(f"random experts are drawn as MXFP4 bytes; the layout is {layout.fmt}")
    rows = torch.randint(0, 256, (n, layout.nbytes), dtype=torch.uint8, device=device, generator=gen)
    views = layout.views(rows)
    for m in ("w13", "w2"):
        views[f"{m}_scale"].copy_(scale_bytes(tuple(views[f"{m}_scale"].shape), std, gen, device))
    if layout.bias:
        views["w13_bias"].zero_()
        views["w2_bias"].zero_()
    return rows


def moe_update_rms(layout: ExpertLayout, std: float, top_k: int, device: torch.device, seed: int) -> float:
    """rms of a MoE layer's output on normed random inputs: one random expert's, over sqrt(k)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = expert_rows(layout, 1, std, gen, device)                        # [1, nbytes]
    x = torch.randn(256, layout.hidden, generator=gen, device=device)      # [T, D]
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    one = torch.zeros(256, 1, dtype=torch.int64, device=device)            # [T, 1] every token to expert 0
    y = fused_moe_ref(x, one, torch.ones(256, 1, device=device), torch.zeros(1, dtype=torch.int32, device=device),
                      layout.views(rows), layout)                          # [T, D]
    return float(y.float().pow(2).mean().sqrt()) / math.sqrt(top_k)


def _seed(name: str, seed: int) -> int:
    return (zlib.crc32(name.encode()) + 7919 * seed) % (1 << 62)


class RandomGptOss(TensorSource):
    """The resident tensors of a random gpt-oss model, drawn when asked for, and its MXFP4 experts
    written straight into the host store's rows (``read_experts``)."""

    def __init__(self, spec: ModelSpec, layout: ExpertLayout, routing: Routing, device: torch.device,
                 dtype: torch.dtype, seed: int = 0) -> None:
        self.spec, self.layout, self.routing = spec, layout, routing
        self.device, self.weight_dtype, self.seed = torch.device(device), dtype, seed
        self._plan = {t.name: t for t in tensor_plan(spec) if t.category != "routed_experts"}
        self._router_bias = {router_bias_name(spec, i): i for i in range(spec.num_layers) if spec.moe_layers[i]}

    def names(self) -> set[str]:
        return set(self._plan)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._plan[name].shape

    def dtype(self, name: str) -> str:
        return dtype_name(self.weight_dtype)

    def get(self, name: str) -> torch.Tensor:
        entry, r = self._plan[name], self.routing
        if entry.category == "norms":
            return torch.ones(entry.shape, dtype=self.weight_dtype, device=self.device)
        if name in self._router_bias:
            return self._router_bias_of(self._router_bias[name]).to(self.weight_dtype)
        if name.endswith((".sinks", ".bias")):
            return torch.zeros(entry.shape, dtype=self.weight_dtype, device=self.device)
        std = r.emb_std if name == fn.EMBED else r.o_std if name.endswith("o_proj.weight") else r.weight_std
        gen = torch.Generator(device=self.device).manual_seed(_seed(name, self.seed))
        return torch.randn(entry.shape, generator=gen, device=self.device, dtype=self.weight_dtype) * std

    def _router_bias_of(self, layer: int) -> torch.Tensor:
        """``[E]`` -bias_scale * ln(rank), the ranks a random order of layer ``layer``'s experts."""
        E = self.spec.num_experts
        gen = torch.Generator().manual_seed(_seed(f"rank{layer}", self.routing.knobs.seed))
        rank = (torch.randperm(E, generator=gen) + 1).float()
        return (-self.routing.bias_scale * rank.log()).to(self.device)

    def read_experts(self, moe_index: int, out: torch.Tensor) -> None:
        """MoE layer ``moe_index``'s experts into ``out`` ``uint8 [E, nbytes]`` (host rows)."""
        gen = torch.Generator(device=self.device).manual_seed(_seed(f"experts{moe_index}", self.seed))
        rows = expert_rows(self.layout, out.shape[0], self.routing.weight_std, gen, self.device)   # [E, nbytes]
        out.copy_(rows)


class HostRows:
    """Host expert rows shared by a run's engines of one shape: allocated and page-locked once (57 GiB
    for 120b: pinning takes tens of seconds, and two such stores would not fit the host), filled again
    by every load. Rows of another shape replace them."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.store: HostExpertStore | None = None

    def rows(self, spec: ModelSpec, layout: ExpertLayout) -> torch.Tensor:
        """``uint8 [L_moe * E, nbytes]`` for ``spec``'s experts in ``layout``, page-locked on CUDA."""
        shape = (spec.num_moe_layers * spec.num_experts, layout.nbytes)
        if self.store is None or tuple(self.store.rows.shape) != shape:
            self.close()
            self.store = HostExpertStore.from_rows(host_rows(*shape), spec.num_experts, layout,
                                                   pin=self.device.type == "cuda", device=self.device)
        return self.store.rows

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


class ModelOnRows(LoadedModel):
    """A LoadedModel whose loader fills host rows the caller holds (:class:`HostRows`) instead of new ones."""

    def __init__(self, rows: torch.Tensor, *args, **kwargs) -> None:
        self._rows = rows
        super().__init__(*args, **kwargs)

    def _allocate_rows(self, rows: int, nbytes: int) -> torch.Tensor:
        if tuple(self._rows.shape) != (rows, nbytes):
            raise ValueError(f"the loader asks for host rows [{rows}, {nbytes}]; these are {list(self._rows.shape)}")
        return self._rows
