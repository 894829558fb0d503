"""Load a checkpoint into resident weights (on the device) and packed routed experts (host rows)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from engine.checkpoint import families as fn
from engine.checkpoint.checks import FP8_DTYPES, check_cast, check_dtype, check_finite
from engine.checkpoint.fp8_blocks import SCALE_SUFFIX
from engine.checkpoint.mxfp4 import check_mxfp4_layer, has_mxfp4, pack_mxfp4_layer
from engine.checkpoint.plan import (TensorEntry, kept_in_float32, quantisable, routed_expert_entries, router_bias_name,
                                    score_bias_name, shared_expert_names, tensor_plan)
from engine.checkpoint.reader import TensorSource
from engine.checkpoint.spec import ModelSpec
from engine.errors import ModelLoadError
from kernels.expert_layout import ExpertLayout
from kernels.qlinear import QuantWeight, quantize_rows
from engine.models.weights import AttentionWeights, LayerWeights, MLPWeights, ModelWeights, MoEWeights

RowAllocator = Callable[[int, int], torch.Tensor]   # (rows, nbytes) -> uint8 [rows, nbytes]
QUANT_LOAD_BYTES = 64 << 20     # checkpoint bytes of a matrix's rows taken to the device and quantised at a time


class _Fetch:
    """Reads tensors by plan entry with shape checks, casting, a finiteness check and placement."""

    def __init__(self, source: TensorSource, device: torch.device, dtype: torch.dtype, resident: str = "bf16",
                 row_orders: dict[str, torch.Tensor] | None = None) -> None:
        self.source, self.device, self.dtype = source, device, dtype
        self.resident = resident       # bf16 (the dtype) | fp8 | int8: how quantisable matrices are kept
        self.names = source.names()
        self.row_orders = row_orders or {}   # name -> the order its rows (or elements) are kept in

    def where(self, name: str) -> str:
        return where_of(self.source, name)

    def raw(self, entry: TensorEntry) -> torch.Tensor:
        if entry.name not in self.names:
            raise ModelLoadError(f"tensor '{entry.name}' (shape {list(entry.shape)}) is missing from the checkpoint; "
                                 "the weights do not match config.json — re-download the model")
        shape = tuple(self.source.shape(entry.name))
        if shape != entry.shape:
            raise ModelLoadError(f"{self.where(entry.name)}: tensor '{entry.name}' has shape {list(shape)} but "
                                 f"config.json implies {list(entry.shape)}; the weights do not match the config")
        return self.source.get(entry.name)

    def __call__(self, entry: TensorEntry | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The tensor of ``entry`` on the device in ``dtype`` (default: the compute dtype); None for None."""
        if entry is None:
            return None
        raw = self.raw(entry)
        out = raw.to(device=self.device, dtype=dtype or self.dtype)
        check_cast(raw, out, entry.name, self.where(entry.name))   # once per resident tensor, at load
        return self._ordered(entry.name, out)

    def _ordered(self, name: str, t: torch.Tensor) -> torch.Tensor:
        order = self.row_orders.get(name)
        return t if order is None else t.index_select(0, order.to(t.device))

    def on_host(self, entry: TensorEntry) -> torch.Tensor:
        """The tensor of ``entry`` in the compute dtype in host memory: page-locked (and so mapped into
        the GPU's address space) when the device is a CUDA GPU."""
        raw = self.raw(entry)
        out = raw.to(device="cpu", dtype=self.dtype)
        check_cast(raw, out, entry.name, self.where(entry.name))
        return out.pin_memory() if self.device.type == "cuda" else out.contiguous()

    def matrix(self, entries: list[TensorEntry | None]) -> torch.Tensor | QuantWeight | None:
        """The row-wise concatenation of ``entries`` (q, k and v; gate and up), in 8 bits when they are
        quantisable and the load keeps resident weights so: taken as stored when the folder holds them in
        that format, else quantised on the device one matrix at a time. None when the first is None."""
        if entries[0] is None:
            return None
        if self.resident == "bf16" or not quantisable(entries[0]):
            parts = [self(e) for e in entries]
            return parts[0] if len(parts) == 1 else torch.cat(parts, 0)
        parts = []
        for e in entries:
            stored = self.source.stored_quant(e.name, self.resident)
            if stored is not None:
                self.raw(e)                                            # the name and shape checks
                parts.append(QuantWeight(self._ordered(e.name, stored.q.to(self.device)),
                                         self._ordered(e.name, stored.scale.to(self.device)), stored.fmt))
            else:
                parts.append(self._quantised(e))
        if len(parts) == 1:
            return parts[0]
        return QuantWeight(torch.cat([p.q for p in parts], 0), torch.cat([p.scale for p in parts], 0), self.resident)


    def _quantised(self, entry: TensorEntry) -> QuantWeight:
        """``entry`` quantised on the device a block of rows at a time: the card never holds the whole
        16-bit matrix beside its 8-bit copy (gpt-oss-120b's LM head is 1.2 GB in bf16), so a load's peak
        stays near what the model keeps."""
        raw, order = self.raw(entry), self.row_orders.get(entry.name)
        n = raw.shape[0]
        if n == 0:
            return quantize_rows(raw.to(device=self.device, dtype=self.dtype), self.resident)
        rows = max(1, QUANT_LOAD_BYTES // max(1, raw[0].numel() * raw.element_size()))
        q = scale = None
        for r in range(0, n, rows):
            part = raw[r:r + rows] if order is None else raw.index_select(0, order[r:r + rows].to(raw.device))
            cast = part.to(device=self.device, dtype=self.dtype)
            check_cast(part, cast, entry.name, self.where(entry.name))
            w = quantize_rows(cast, self.resident)
            if q is None:
                q = torch.empty((n, *w.q.shape[1:]), dtype=w.q.dtype, device=w.q.device)
                scale = torch.empty(n, dtype=w.scale.dtype, device=w.scale.device)
            q[r:r + rows], scale[r:r + rows] = w.q, w.scale
        return QuantWeight(q, scale, self.resident)


def where_of(source: TensorSource, name: str) -> str:
    f = source.file_of(name)
    return str(f) if f is not None else "checkpoint"


def _fused_experts(source: TensorSource, spec: ModelSpec, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    p = spec.family.moe_prefix.format(i=i)
    gu, dn = spec.family.fused_gate_up.format(p=p), spec.family.fused_down.format(p=p)
    names = source.names()
    if gu not in names or dn not in names:
        return None
    fused = source.get(gu), source.get(dn)   # [E, 2F, D], [E, D, F]
    for name, t in zip((gu, dn), fused):
        check_finite(t, name, where_of(source, name))
    return fused


# one expert as the layout packs it: w13 [2F, D] (gate rows, then up rows), w2 [D, F], biases [2F] / [D] or None
Expert = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _layer_experts(fetch: _Fetch, spec: ModelSpec, i: int) -> Iterator[Expert]:
    """Each routed expert of layer ``i`` in the layout's orientation, checked for NaN/Inf."""
    if spec.family.fused_kn:
        yield from _fused_kn_experts(fetch, spec, i)
        return
    fused = _fused_experts(fetch.source, spec, i)
    entries = routed_expert_entries(spec, i)
    for e in range(spec.num_experts):
        if fused is not None:
            yield fused[0][e], fused[1][e], None, None
        else:
            gate, up, down = (_finite(fetch, t) for t in entries[3 * e:3 * e + 3])
            yield torch.cat([gate, up], 0), down, None, None                  # [2F, D], [D, F]


def _fused_kn_experts(fetch: _Fetch, spec: ModelSpec, i: int) -> Iterator[Expert]:
    """gpt-oss's fused experts (x @ W: gate_up [E, D, 2F], down [E, F, D]) turned to [N, K] per expert,
    with interleaved gate/up outputs (even: gate, odd: up) sorted into gate rows then up rows."""
    gate_up, down, *bias = (_finite(fetch, t) for t in routed_expert_entries(spec, i))
    n = 2 * spec.moe_ffn
    rows = torch.arange(n).view(-1, 2).t().flatten() if spec.family.interleaved_gate_up else torch.arange(n)
    for e in range(spec.num_experts):
        b13, b2 = (bias[0][e][rows], bias[1][e]) if bias else (None, None)
        yield gate_up[e].t()[rows], down[e].t(), b13, b2


def pack_layer_experts(source: TensorSource, spec: ModelSpec, i: int, layout: ExpertLayout,
                       out: torch.Tensor) -> None:
    """Pack every routed expert of layer ``i`` of a Hugging Face checkpoint into ``out`` ``uint8 [E, nbytes]``.

    Each expert's weights are checked for NaN/Inf here, as they are read anyway to be packed. MXFP4
    experts (``*_blocks`` / ``*_scales``) go through :func:`engine.checkpoint.mxfp4.pack_mxfp4_layer`.
    """
    fetch = source if isinstance(source, _Fetch) else _Fetch(source, torch.device("cpu"), torch.float32)
    if _is_mxfp4(fetch.names, spec, i):
        pack_mxfp4_layer(fetch.source, spec, i, layout, out)
        return
    from kernels.quant import quantize_expert   # int4 / fp8 quantised once; dense formats cast
    for e, (w13, w2, b13, b2) in enumerate(_layer_experts(fetch, spec, i)):
        layout.pack(quantize_expert(w13.to(torch.float32), w2.to(torch.float32), layout, b13, b2), out=out[e])


def _finite(fetch: _Fetch, entry: TensorEntry) -> torch.Tensor:
    t = fetch.raw(entry)
    check_finite(t, entry.name, fetch.where(entry.name))
    return t


def load_weights(spec: ModelSpec, source: TensorSource, device: torch.device, dtype: torch.dtype,
                 layout: ExpertLayout, allocate_rows: RowAllocator,
                 resident: str = "bf16", embed_on_host: bool = False) -> tuple[ModelWeights, torch.Tensor]:
    """Resident weights on ``device`` and routed experts packed into host rows ``[L_moe * E, nbytes]``.

    ``resident`` fp8 / int8 keeps the quantisable matrices (:func:`quantisable`) in 8 bits.
    ``embed_on_host``: the (untied) embedding table stays in page-locked host memory."""
    fetch = _Fetch(source, device, dtype, resident, partial_rope_orders(spec))
    by_name = {t.name: t for t in tensor_plan(spec) if t.category != "routed_experts"}

    def get(name: str | None, dt: torch.dtype | None = None) -> torch.Tensor | None:
        entry = by_name.get(name)
        if entry is not None and kept_in_float32(spec, entry):
            dt = torch.float32
        return fetch(entry, dt)
    matrix = lambda *names: fetch.matrix([by_name.get(n) for n in names])   # noqa: E731  rows concatenated
    rows = allocate_rows(spec.num_moe_layers * spec.num_experts, layout.nbytes)
    layers, moe_index = [], 0
    for i in range(spec.num_layers):
        layer = LayerWeights(get(fn.INPUT_NORM.format(i=i)), get(fn.POST_NORM.format(i=i)), _attention(get, matrix, spec, i))
        if not spec.moe_layers[i]:
            layer.mlp = _mlp(matrix, fn.DENSE_MLP.format(i=i))
        else:
            p = spec.family.moe_prefix.format(i=i)
            shared_name, gate_name = shared_expert_names(spec, i)
            shared = _mlp(matrix, shared_name) if spec.shared_ffn else None
            layer.moe = MoEWeights(moe_index, get(spec.family.router.format(p=p)), shared,
                                   get(gate_name) if spec.shared_ffn and gate_name else None,
                                   get(router_bias_name(spec, i)), score_bias=get(score_bias_name(spec, i)))
            layer_rows = rows[moe_index * spec.num_experts:(moe_index + 1) * spec.num_experts]
            read_experts = getattr(source, "read_experts", None)     # a converted folder: packed already
            if read_experts is not None:
                read_experts(moe_index, layer_rows)
            else:
                pack_layer_experts(fetch, spec, i, layout, layer_rows)
            moe_index += 1
        layers.append(layer)
    host = embed_on_host and not spec.tie_word_embeddings
    embed = fetch.on_host(by_name[fn.EMBED]) if host else get(fn.EMBED)
    lm_head = embed if spec.tie_word_embeddings else matrix(fn.LM_HEAD)
    return ModelWeights(embed, get(fn.FINAL_NORM), lm_head, layers, embed_on_host=host), rows


def partial_rope_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """The order a head's dimensions are kept in when RoPE turns only its first ``rotary_dim`` (GLM):
    the turned halves and the passed-through halves side by side, ``[rot1, pass1, rot2, pass2]``, so
    that the rotate-half kernels, pairing dimension ``j`` with ``j + head_dim / 2``, pair each turned
    dimension with its partner and the passed ones with each other (the tables leave those as they
    are: engine/models/layers.Rope). q and k are kept so, which leaves every q.k product, and so the
    attention, unchanged; v and the output projection keep their own order."""
    r, p = rotary_dim // 2, (head_dim - rotary_dim) // 2
    ar = torch.arange
    return torch.cat([ar(r), rotary_dim + ar(p), r + ar(r), rotary_dim + p + ar(p)])


def latent_rope_orders(spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Row orders of a latent-attention model whose checkpoint keeps rotary pairs interleaved
    (``(2j, 2j + 1)``: DeepSeek-V2, V3 with rope_interleave): each head's rotary rows of the queries and
    the rotary key's rows of the latent projection, evens then odds, so that the rotate-half kernels
    pair them as the checkpoint does (dimension ``j`` with ``j + p / 2``). q.k products are unchanged."""
    m = spec.mla
    if not m.interleaved:
        return {}
    turned = torch.cat([torch.arange(0, m.qk_rope, 2), torch.arange(1, m.qk_rope, 2)])   # [p]
    qk = m.qk_nope + m.qk_rope
    head = torch.cat([torch.arange(m.qk_nope), m.qk_nope + turned])                    # [n + p]
    q_rows = (torch.arange(spec.num_heads)[:, None] * qk + head[None, :]).reshape(-1)   # [H (n + p)]
    latent_rows = torch.cat([torch.arange(m.kv_lora_rank), m.kv_lora_rank + turned])    # [r + p]
    out = {}
    for i in range(spec.num_layers):
        a = fn.ATTN.format(i=i)
        out[f"{a}.{'q_b_proj' if m.q_lora_rank else 'q_proj'}.weight"] = q_rows
        out[f"{a}.kv_a_proj_with_mqa.weight"] = latent_rows
    return out


def partial_rope_orders(spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Row orders of every q and k tensor (weights, biases, norms) of a partial-RoPE model, by name
    (of a latent-attention model: :func:`latent_rope_orders`)."""
    if spec.mla:
        return latent_rope_orders(spec)
    if spec.rope_dim == spec.head_dim:
        return {}
    head = partial_rope_order(spec.head_dim, spec.rope_dim)
    hd = spec.head_dim
    out = {}
    for i in range(spec.num_layers):
        a = fn.ATTN.format(i=i)
        for n, heads in (("q", spec.num_heads), ("k", spec.num_kv_heads)):
            rows = (torch.arange(heads)[:, None] * hd + head[None, :]).reshape(-1)       # [heads * hd]
            out[f"{a}.{n}_proj.weight"] = out[f"{a}.{n}_proj.bias"] = rows
            out[f"{a}.{n}_norm.weight"] = head if spec.qk_norm == "head" else rows
    return out


def _attention(get, matrix, spec: ModelSpec, i: int) -> AttentionWeights:
    """Layer ``i``'s attention; a tensor the family lacks is None (its plan has no such entry)."""
    a = fn.ATTN.format(i=i)
    if spec.mla:
        m = spec.mla
        first = f"{a}.q_a_proj.weight" if m.q_lora_rank else f"{a}.q_proj.weight"
        up = get(f"{a}.kv_b_proj.weight").view(spec.num_heads, m.qk_nope + m.v_head_dim, m.kv_lora_rank)
        return AttentionWeights(matrix(first, f"{a}.kv_a_proj_with_mqa.weight"), matrix(f"{a}.o_proj.weight"),
                                q_norm=get(f"{a}.q_a_layernorm.weight"), k_norm=get(f"{a}.kv_a_layernorm.weight"),
                                q_b=matrix(f"{a}.q_b_proj.weight"), kv_up_k=up[:, :m.qk_nope], kv_up_v=up[:, m.qk_nope:])
    qkv = matrix(*(f"{a}.{n}_proj.weight" for n in "qkv"))
    bias = torch.cat([get(f"{a}.{n}_proj.bias") for n in "qkv"], 0) if spec.qkv_bias else None
    return AttentionWeights(qkv, matrix(f"{a}.o_proj.weight"), bias, get(f"{a}.q_norm.weight"), get(f"{a}.k_norm.weight"),
                            o_bias=get(f"{a}.o_proj.bias"), sinks=get(f"{a}.sinks", torch.float32),
                            window=spec.window(i))


def _mlp(matrix, prefix: str) -> MLPWeights:
    return MLPWeights(matrix(f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"), matrix(f"{prefix}.down_proj.weight"))


def check_complete(spec: ModelSpec, source: TensorSource) -> None:
    """Fail fast, before any big allocation, if a tensor is missing, mis-shaped or of the wrong dtype."""
    names = source.names()
    packed = hasattr(source, "read_experts")
    moe = [i for i in range(spec.num_layers) if spec.moe_layers[i]]
    fused = {i for i in moe if packed or _has_fused(names, spec, i)}   # [E, 2F, D] fused, or packed already
    mxfp4 = {i for i in moe if not packed and _is_mxfp4(names, spec, i)}
    for t in tensor_plan(spec):
        if t.category == "routed_experts" and (t.layer in fused or t.layer in mxfp4):
            continue
        if t.name not in names:
            raise ModelLoadError(f"tensor '{t.name}' (shape {list(t.shape)}) is missing from the checkpoint in "
                                 f"{getattr(source, 'dir', 'memory')}; the weights do not match config.json — "
                                 "re-download the model")
        _check_header(spec, source, t.name, t.shape)
    if not packed:
        for i in sorted(fused):
            _check_fused(spec, source, i)
    for i in sorted(mxfp4):
        check_mxfp4_layer(source, spec, i)


def _check_header(spec: ModelSpec, source: TensorSource, name: str, expected: tuple[int, ...]) -> None:
    shape = tuple(source.shape(name))
    if shape != expected:
        raise ModelLoadError(f"{where_of(source, name)}: tensor '{name}' has shape {list(shape)} but config.json "
                             f"implies {list(expected)}; the weights do not match the config")
    found, where = source.dtype(name), where_of(source, name)
    if found in FP8_DTYPES and spec.expert_storage == "fp8":     # read through Fp8BlockSource: its scale is gone
        raise ModelLoadError(f"{where}: tensor '{name}' is {found} but its block scale '{name}{SCALE_SUFFIX}' is "
                             "missing from the checkpoint; the download is incomplete — fetch the model again")
    if found in FP8_DTYPES and name + SCALE_SUFFIX in source.names():
        raise ModelLoadError(f"{where}: tensor '{name}' has block scales beside it but config.json has no fp8 "
                             "quantization_config; restore quantization_config (quant_method fp8, weight_block_size) "
                             "from the original release's config.json")
    check_dtype(found, name, where, spec.architecture)


def _check_fused(spec: ModelSpec, source: TensorSource, i: int) -> None:
    p = spec.family.moe_prefix.format(i=i)
    E, D, F = spec.num_experts, spec.hidden, spec.moe_ffn
    gu, dn = spec.family.fused_gate_up.format(p=p), spec.family.fused_down.format(p=p)
    if dn not in source.names():
        raise ModelLoadError(f"tensor '{dn}' (shape {[E, D, F]}) is missing from the checkpoint in "
                             f"{getattr(source, 'dir', 'memory')} though '{gu}' is there; re-download the model")
    _check_header(spec, source, gu, (E, 2 * F, D))
    _check_header(spec, source, dn, (E, D, F))


def _has_fused(names: set[str], spec: ModelSpec, i: int) -> bool:
    """Experts fused as [E, 2F, D] where the family names them per expert (families storing them only
    fused, gpt-oss, list the fused tensors in their plan)."""
    p = spec.family.moe_prefix.format(i=i)
    return not spec.family.fused_kn and spec.family.fused_gate_up.format(p=p) in names


def _is_mxfp4(names: set[str], spec: ModelSpec, i: int) -> bool:
    """Layer ``i``'s experts ship as MXFP4 ``*_blocks`` / ``*_scales`` (no dense fused tensor)."""
    return spec.family.fused_kn and has_mxfp4(names, spec, i)
