"""The generic MoE transformer: one forward for Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GLM-4.5, gpt-oss and
DeepSeek-V2 / V3.

Family differences are data (ModelSpec, families.py): q/k norm per head or over the projection,
qkv and o biases, attention sinks, sliding-window layers, YaRN RoPE on all or part of each head,
latent attention (engine/models/mla.py), shared expert with or without a sigmoid gate, dense layers
between sparse ones, router bias, softmax or sigmoid scores (with a choice bias, expert groups and a
scaling of the weights), top-k renormalisation (the experts' biases and activation live in the
expert layout).

Legend: T tokens in the step, B sequences, D hidden, H / Hkv heads, hd head dim, E experts, k top-k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.checkpoint.spec import ModelSpec
from engine.experts.provider import ExpertProvider
from engine.host_copy import host_to
from engine.kv.cache import KVCache
from engine.models.layers import Rope, SeqSlice, mlp, paged_attention_ref, rms_norm
from engine.models.mla import latent_attention
from engine.models.weights import AttentionWeights, ModelWeights, MoEWeights
from kernels import router as router_kernels
from kernels._triton import HAS_TRITON
from kernels.decode_ops import add_rms_norm, add_rms_norm_act16, qk_norm_rope_write
from kernels.host_rows import gather_rows
from kernels.paged_attention import attend_context_ref, context_rows, window_valid
from kernels.qlinear import gemv16, gemv16_fits, linear
from kernels.router import route as route_kernel
from kernels.router import route_gemv, route_gemv_fits
from kernels.router import route_ref as route_scored

# (moe_index, topk_ids, prediction) -> (slot_of_expert, views) or (slot_of_expert, views, host experts)
Acquire = Callable[[int, torch.Tensor, Any], tuple]


@dataclass
class DecodeMeta:
    """A pure decode step (one new token per sequence) in tensors only, so it can be graph-captured."""

    block_tables: torch.Tensor       # [B, max_blocks] int32
    context_lens: torch.Tensor       # [B] int32, including the new token
    rows: torch.Tensor | None = None   # reference path: cache rows [B, P] of the context, shared by all layers
    valid: torch.Tensor | None = None  # [B, P]
    # a replayed step's padding rows [B] bool (engine/cuda_graphs.py), left out of the experts' counts;
    # every row set: a warm-up, which counts nothing
    pad: torch.Tensor | None = None


@dataclass
class ForwardBatch:
    """Inputs of one forward pass, passed explicitly (no global context)."""

    input_ids: torch.Tensor          # [T] int64
    positions: torch.Tensor          # [T] int64
    slot_mapping: torch.Tensor       # [T] int64, cache row of each new token
    seqs: list[SeqSlice]             # B sequences, in row order (unused when ``decode`` is set)
    logits_rows: torch.Tensor | None  # [B'] rows whose logits are needed; None = every row
    decode: DecodeMeta | None = None  # set when every sequence adds exactly one token
    # the same step over the window layers' own block tables (slot mapping, seqs, decode meta), for a
    # cache that keeps its sliding-window layers in a pool of their own; None: every layer uses this one
    window: ForwardBatch | None = None
    prefill: PrefillMeta | None = None  # built on first use by a layer that runs the prefill kernel
    # the host-side description it was built from (engine/runner/batch.py BatchParts), which a
    # pipeline sends its other stages so that they build the same batch on their own devices
    parts: Any = None


@dataclass
class PrefillMeta:
    """A step's sequences as the CUDA prefill attention kernel takes them."""

    block_tables: torch.Tensor       # [B, nb] int32
    q_starts: torch.Tensor           # [B] int32
    q_lens: torch.Tensor             # [B] int32
    ctx_lens: torch.Tensor           # [B] int32
    max_q_len: int
    max_ctx_len: int

    @staticmethod
    def of(seqs: list[SeqSlice], device: torch.device) -> PrefillMeta:
        tables = torch.nn.utils.rnn.pad_sequence([s.block_table for s in seqs], batch_first=True)   # [B, nb]
        ints = torch.tensor([[s.q_start for s in seqs], [s.q_len for s in seqs], [s.ctx_len for s in seqs]],
                            dtype=torch.int32, device=device)                  # [3, B], rows contiguous
        return PrefillMeta(tables.to(device, torch.int32), ints[0], ints[1], ints[2], max(s.q_len for s in seqs),
                           max(s.ctx_len for s in seqs))


def router_logits(x: torch.Tensor, m: MoEWeights) -> torch.Tensor:
    """The router's logits ``[T, E]`` of ``x [T, D]``: in float32 where the router is kept so (sigmoid
    scores, GLM: engine/checkpoint/plan.kept_in_float32), else in ``x``'s dtype; plus its bias."""
    w = m.router
    if gemv16_fits(x, w):                               # a one-token step (CUDA, when the A/B turns it on)
        return gemv16(x, w, m.router_bias)
    logits = (x.float() if w.dtype == torch.float32 else x) @ w.t()
    return logits if m.router_bias is None else logits + m.router_bias


def route_ref(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax in float32, top-k, optional renormalisation. logits [T, E] -> (weights [T, k] f32, ids [T, k])."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


class MoETransformer:
    def __init__(self, spec: ModelSpec, weights: ModelWeights, experts: ExpertProvider,
                 device: torch.device, dtype: torch.dtype, max_position: int) -> None:
        self.spec, self.w, self.experts = spec, weights, experts
        self.device, self.dtype = device, dtype
        if spec.mla:             # latent attention turns only each head's (and the shared key's) rotary part
            self.rope = Rope(spec.mla.qk_rope, spec.rope_theta, max_position, device, dtype, spec.rope_scaling)
        else:
            self.rope = Rope(spec.head_dim, spec.rope_theta, max_position, device, dtype, spec.rope_scaling,
                             spec.rotary_dim)
        self.moe_fn, self._act16_group = _select_moe_fn(device)
        # One-launch norms, q/k norm + RoPE + KV write, and router on CUDA; torch everywhere else.
        self.fused = device.type == "cuda" and HAS_TRITON
        self.decode_attention = _select_decode_attention(device)
        self.prefill_attention = _select_prefill_attention(device)   # CUDA: the paged flash kernel
        self.pipeline: Any = None          # the first stage of a pipeline: its Pipeline (engine/parallel)
        self.expert_parallel: Any = None   # card 0 of expert parallel: its ExpertsOnCards (engine/parallel/experts.py)

    def use_moe_kernels(self, triton: bool) -> None:
        """The Triton MoE (where the device has it, as chosen at load) or the torch reference path
        (the benchmarks' unfused baseline; it syncs per layer, so it is never graph-captured)."""
        from kernels.fused_moe import fused_moe_ref
        self.moe_fn, self._act16_group = _select_moe_fn(self.device) if triton else (fused_moe_ref, None)

    @property
    def moe_kernels(self) -> bool:
        """Whether the MoE runs on the Triton kernels (see :meth:`use_moe_kernels`)."""
        from kernels.fused_moe import fused_moe_ref
        return self.moe_fn is not fused_moe_ref

    def route(self, logits: torch.Tensor, score_bias: torch.Tensor | None = None,
              tally_into: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits -> (weights [T, k] f32, ids [T, k]) as the family scores them; ``score_bias``
        [E] float32: the layer's choice bias (GLM). Also used by the prefetcher. ``tally_into``: where the
        Triton router also counts the call (kernels/router.route; given only where ``fused``)."""
        s = self.spec
        scoring = s.family.router_scoring
        groups = {"groups": s.route_groups, "keep_groups": s.route_keep_groups}
        if self.fused:
            return route_kernel(logits, s.top_k, scoring, s.renormalize, bias=score_bias, scale=s.routed_scale,
                                tally_into=tally_into, **groups)
        if scoring == "softmax" and score_bias is None and s.routed_scale == 1.0 and s.route_groups == 1:
            return route_ref(logits, s.top_k, s.renormalize)
        return route_scored(logits, s.top_k, scoring, s.renormalize, bias=score_bias, scale=s.routed_scale,
                            **groups)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache, acquire: Acquire | None = None) -> torch.Tensor:
        """Logits [B', V] in float32 for ``batch.logits_rows`` (every row when None).

        ``acquire(moe_index, topk_ids, prediction) -> (slot_of_expert, views)`` resolves each MoE
        layer's experts; by default the expert provider's. A decode step recorded into CUDA graphs
        piece by piece passes one that ends a graph there (engine/cuda_graphs.py). On the first
        stage of a pipeline (``pipeline`` set, engine/parallel) the pipeline runs the step: this
        model's layers, the other stages' in their processes, then this model's head.
        """
        if self.pipeline is not None:
            return self.pipeline.forward(self, batch, cache, acquire)
        if self.expert_parallel is not None:           # the other cards take part in every MoE layer
            with self.expert_parallel.group.step_guard():
                self.expert_parallel.begin_step(batch.input_ids.shape[0], prompt=batch.decode is None)
                x, out = self.layers(self.embed(batch), None, batch, cache, acquire)
                return self.head(x, out, batch)
        x, out = self.layers(self.embed(batch), None, batch, cache, acquire)       # [T, D]
        return self.head(x, out, batch)

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        if self.w.embed_on_host:      # the table in mapped host memory: the GPU gathers the rows it needs
            return gather_rows(self.w.embed, batch.input_ids)
        return self.w.embed[batch.input_ids]                             # [T, D]

    @torch.inference_mode()
    def layers(self, x: torch.Tensor, out: torch.Tensor | None, batch: ForwardBatch, cache: KVCache,
               acquire: Acquire | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This model's layers over the residual stream ``x`` [T, D] and the last block's output ``out``
        not yet added to it (None before the first layer); returns the two after its last layer."""
        acquire = acquire or self.experts.acquire
        rope = self.rope.tables(batch.positions)                         # cos, sin [T, 1, hd]
        self.experts.begin_step(prompt=batch.decode is None)
        group = self._x16_group(x.shape[0])
        pad = batch.decode.pad if batch.decode is not None else None
        try:
            for i, layer in enumerate(self.w.layers):
                h, x = self._add_norm(x, out, layer.input_norm)
                pred = self.experts.before_layer(layer.moe.moe_index, x) if layer.moe is not None else None
                attn = self._attention(i, layer.attn, h, batch, cache, rope)
                if layer.moe is not None:
                    h, x, h16 = self._add_norm16(x, attn, layer.post_norm, group)
                    out = self._moe(layer.moe, h, pred, acquire, h16, x, pad)
                else:
                    h, x = self._add_norm(x, attn, layer.post_norm)
                    out = mlp(h, layer.mlp.gate_up, layer.mlp.down, self.fused)
        finally:
            self.experts.end_step()
        return x, out

    def head(self, x: torch.Tensor, out: torch.Tensor | None, batch: ForwardBatch) -> torch.Tensor:
        """The last block's output added, the rows whose logits are needed, final norm, LM head."""
        if out is not None:
            x = x + out
        if batch.logits_rows is not None:
            x = x[batch.logits_rows]                                     # [B', D]
        x, _ = self._add_norm(x, None, self.w.final_norm)
        return linear(x, self.w.lm_head, kernel=self.fused, head=True).float()      # [B', V]

    def _add_norm(self, x: torch.Tensor, delta: torch.Tensor | None,
                  weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(x + delta), x + delta)``; no add when ``delta`` is None. One kernel on CUDA."""
        if self.fused and weight.dtype == x.dtype:
            return add_rms_norm(x, weight, self.spec.rms_norm_eps, residual=delta)
        if delta is not None:
            x = x + delta
        return rms_norm(x, weight, self.spec.rms_norm_eps), x

    def _x16_group(self, tokens: int) -> int | None:
        """Group size of the 16-bit planes the MoE kernels take for a step of ``tokens`` (int4 decode
        on a GPU; see :func:`kernels.fused_moe.act16_group`), or None."""
        if self._act16_group is None or not self.fused or self.expert_parallel is not None:
            return None
        return self._act16_group(self.experts.layout, tokens, self.device, self.experts.direct_for(tokens))

    def _add_norm16(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                    group: int | None) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """:meth:`_add_norm`, and with ``group`` the normed rows also as the int4 MoE's 16-bit planes
        (else None), from the same launch."""
        if group is not None and weight.dtype == x.dtype:
            return add_rms_norm_act16(x, weight, self.spec.rms_norm_eps, group, residual=delta)
        return (*self._add_norm(x, delta, weight), None)

    def _attention(self, i: int, a: AttentionWeights, x: torch.Tensor, batch: ForwardBatch,
                   cache: KVCache, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        s, T = self.spec, x.shape[0]
        if s.mla:
            return latent_attention(s, i, a, x, batch, cache, rope, self.fused)
        if batch.window is not None and cache.windowed(i):               # this layer's rows: the window pool
            batch = batch.window
        qkv = linear(x, a.qkv, kernel=self.fused)                        # [T, (H + 2Hkv) hd]
        if self.fused and self._fused_qkv_ok(a, cache):                   # norm, RoPE, KV write: one kernel
            q = qk_norm_rope_write(qkv, batch.positions, self.rope.cos, self.rope.sin, cache.k[i], cache.v[i],
                                   batch.slot_mapping, s.num_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps,
                                   a.q_norm, a.k_norm, a.qkv_bias)
        else:
            q = self._qkv_ref(i, a, qkv, batch, cache, rope)
        if batch.decode is not None:
            o = self._decode_attention(q, cache, i, batch.decode, a).reshape(T, -1)   # [B, H hd]
        else:
            o = self._prefill_attention(q, cache, i, batch, a)           # [T, H hd]
        return linear(o, a.o, a.o_bias, kernel=self.fused)               # [T, D]

    def _prefill_attention(self, q: torch.Tensor, cache: KVCache, i: int, batch: ForwardBatch,
                           a: AttentionWeights) -> torch.Tensor:
        """q [T, H, hd] of a prefill (or mixed) step over each sequence's cached context -> [T, H hd].
        On CUDA the Triton flash kernel reads the paged cache in place (cache in q's dtype, or int8 / fp8
        with its scales); elsewhere the reference gathers each sequence's rows."""
        if self.prefill_attention is not None and (cache.quantised or cache.storage_dtype == q.dtype):
            if batch.prefill is None:                                    # once per step, not per layer
                batch.prefill = PrefillMeta.of(batch.seqs, q.device)
            p = batch.prefill
            scales = {"k_scale": cache.k_scale[i], "v_scale": cache.v_scale[i]} if cache.quantised else {}
            o = self.prefill_attention(q, cache.k[i], cache.v[i], p.block_tables, p.q_starts, p.q_lens, p.ctx_lens,
                                       cache.block_size, p.max_q_len, p.max_ctx_len, sinks=a.sinks, window=a.window,
                                       **scales)
            return o.reshape(q.shape[0], -1)
        return paged_attention_ref(q, lambda rows: cache.gather(i, rows), batch.seqs, cache.block_size,
                                   sinks=a.sinks, window=a.window)

    def _fused_qkv_ok(self, a: AttentionWeights, cache: KVCache) -> bool:
        """The fused kernel covers per-head q/k norm (or none), an optional bias, an unquantised cache."""
        s = self.spec
        return (s.qk_norm in (None, "head") and s.clip_qkv is None and cache.storage_dtype == self.dtype
                and all(t is None or t.dtype == self.dtype for t in (a.q_norm, a.k_norm, a.qkv_bias)))

    def _qkv_ref(self, i: int, a: AttentionWeights, qkv: torch.Tensor, batch: ForwardBatch, cache: KVCache,
                 rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Bias, q/k norm, RoPE and the KV write in torch; returns q [T, H, hd]."""
        s, T = self.spec, qkv.shape[0]
        if a.qkv_bias is not None:
            qkv = qkv + a.qkv_bias
        q, k, v = qkv.split([s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim,
                             s.num_kv_heads * s.head_dim], -1)
        if s.qk_norm == "full":                                   # OLMoE: norm over the projection
            q, k = rms_norm(q, a.q_norm, s.rms_norm_eps), rms_norm(k, a.k_norm, s.rms_norm_eps)
        if s.clip_qkv is not None:
            q, k, v = (t.clamp(-s.clip_qkv, s.clip_qkv) for t in (q, k, v))
        q = q.reshape(T, s.num_heads, s.head_dim)                        # [T, H, hd]
        k = k.reshape(T, s.num_kv_heads, s.head_dim)                     # [T, Hkv, hd]
        v = v.reshape(T, s.num_kv_heads, s.head_dim)
        if s.qk_norm == "head":                                   # Qwen3: norm per head
            q, k = rms_norm(q, a.q_norm, s.rms_norm_eps), rms_norm(k, a.k_norm, s.rms_norm_eps)
        q, k = Rope.apply(torch.cat([q, k], 1), *rope).split([s.num_heads, s.num_kv_heads], 1)   # one rotation
        cache.write(i, batch.slot_mapping, k, v)
        return q

    def _decode_attention(self, q: torch.Tensor, cache: KVCache, i: int, d: DecodeMeta,
                          a: AttentionWeights) -> torch.Tensor:
        """q [B, H, hd] over each sequence's cached context (its last ``a.window`` positions in a
        window layer) -> [B, H, hd]."""
        extra = {"sinks": a.sinks, "window": a.window} if a.sinks is not None or a.window else {}
        if self.decode_attention is not None and cache.quantised:          # Triton, int8 / fp8 rows + scales
            return self.decode_attention(q, cache.k[i], cache.v[i], d.block_tables, d.context_lens, cache.block_size,
                                         k_scale=cache.k_scale[i], v_scale=cache.v_scale[i], **extra)
        if self.decode_attention is not None and cache.storage_dtype == q.dtype:   # Triton split-KV kernel
            return self.decode_attention(q, cache.k[i], cache.v[i], d.block_tables, d.context_lens, cache.block_size,
                                         **extra)
        if d.rows is None:                                               # once per step, not per layer
            d.rows, d.valid = context_rows(d.block_tables, d.context_lens, cache.block_size)
        k, v = cache.gather(i, d.rows)          # [B, P, Hkv, hd]; padding reads row 0 of a zeroed cache: finite
        return attend_context_ref(q, k, v, window_valid(d.valid, d.context_lens, a.window), sinks=a.sinks)

    def _moe(self, m: MoEWeights, x: torch.Tensor, pred: Any, acquire: Acquire, x16: Any = None,
             residual: torch.Tensor | None = None, pad: torch.Tensor | None = None) -> torch.Tensor:
        if self.expert_parallel is not None:                             # the routed experts on every card
            out = self.expert_parallel.moe(self, m, x, residual, pred)
            return out if m.shared is None else out + self._shared(m, x)
        tally_into = self.experts.route_tally(m.moe_index) if self.fused else None   # a full pool's counts
        if tally_into is not None and pad is not None:
            tally_into = (*tally_into, pad)                              # not the padding rows of a replay
        if self.fused and router_kernels.FUSED_GEMV and route_gemv_fits(x, m.router):      # a decode step: the router GEMV and routing in one
            s = self.spec
            w, ids = route_gemv(x, m.router, s.top_k, s.family.router_scoring, s.renormalize,
                                router_bias=m.router_bias, bias=m.score_bias, scale=s.routed_scale,
                                groups=s.route_groups, keep_groups=s.route_keep_groups, tally_into=tally_into)
        else:
            w, ids = self.route(router_logits(x, m), m.score_bias, tally_into)   # [T, k] f32, [T, k]
        # rest: where slot -1 experts are read (direct reads), the host CPU's share (cold experts), and
        # the passes of a layer whose missing experts outnumber its slots (engine/experts/copy_path.py)
        slot_of_expert, views, *rest = acquire(m.moe_index, ids, pred)
        host, cold, passes = (rest + [None, None, None])[:3]
        extra = {"host": host} if host is not None else {}
        if passes is not None:
            out = self._moe_passes(x, ids, w, slot_of_expert, views, cold, passes)
        elif cold is not None and not cold.in_graph:                     # eager: the GPU's pairs apart
            out = self._moe_split(x, ids, w, slot_of_expert, views, cold, extra)
        else:
            if cold is not None:       # replayed: publish with the CPU's share; the kernels skip its pairs
                cold.start(x, w)
            if x16 is not None:                                          # x as 16-bit planes, from the norm
                extra["x16"] = x16
            out = self.moe_fn(x, ids, w, slot_of_expert, views, self.experts.layout, **extra)   # [T, D]
        if m.shared is not None:
            out = out + self._shared(m, x)
        if cold is not None:
            out = cold.add_to(out)                                       # the CPU's sum, computed meanwhile
        return out

    def _shared(self, m: MoEWeights, x: torch.Tensor) -> torch.Tensor:
        """The shared expert, scaled by its sigmoid gate where it has one (Qwen2-MoE): [T, D]."""
        shared = mlp(x, m.shared.gate_up, m.shared.down, self.fused)      # [T, D]
        return shared if m.shared_gate is None else torch.sigmoid(x @ m.shared_gate.t()) * shared

    def _moe_passes(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, slot_of_expert: torch.Tensor,
                    views: dict, cold: Any, passes: Any) -> torch.Tensor:
        """A layer computed in passes (``passes.runs``), each over its pairs as one-expert tokens; the
        host CPU's pairs, if any, in none of them."""
        if cold is not None:
            cold.start(x, w)
        k = ids.shape[1]
        flat_ids, flat_w = ids.reshape(-1), w.reshape(-1)
        buf = None
        for row, pairs in passes.runs(slot_of_expert):
            if not pairs:
                continue
            p = host_to(pairs, torch.int64, x.device)          # no wait for the pass before
            y = self.moe_fn(x[p // k], flat_ids[p].view(-1, 1), flat_w[p].view(-1, 1), row, views,
                            self.experts.layout)                                          # [P', D]
            if buf is None:
                buf = torch.zeros(flat_ids.numel(), y.shape[1], dtype=y.dtype, device=y.device)
            buf[p] = y
        return torch.zeros_like(x) if buf is None else buf.view(ids.shape[0], k, -1).sum(dim=1)

    def _moe_split(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, slot_of_expert: torch.Tensor,
                   views: dict, cold: Any, extra: dict) -> torch.Tensor:
        """The GPU's share of a layer whose other pairs the host CPU computes (engine/experts/cold.py):
        the inputs go to the host first, then the GPU's pairs are launched as one-expert tokens."""
        cold.start(x, w)
        part = cold.gpu_inputs(x, ids, w)
        if part is None:
            return cold.scatter(None, None)
        xs, ids_s, w_s, pairs = part
        y = self.moe_fn(xs, ids_s, w_s, slot_of_expert, views, self.experts.layout, **extra)   # [P', D]
        return cold.scatter(y, pairs)


def _select_moe_fn(device: torch.device):
    """The Triton grouped GEMM on CUDA when available, the torch reference elsewhere; with the former
    the function saying in which groups it takes ``x`` as 16-bit planes (else None)."""
    from kernels.fused_moe import fused_moe_ref
    if device.type == "cuda" and HAS_TRITON:
        from kernels.fused_moe import act16_group, fused_moe
        return fused_moe, act16_group
    return fused_moe_ref, None


def _select_decode_attention(device: torch.device):
    """The Triton split-KV decode kernel on CUDA when available; None: the vectorised reference."""
    if device.type == "cuda":
        try:
            from kernels.paged_attention import paged_decode_attention
            return paged_decode_attention
        except ImportError:
            pass
    return None


def _select_prefill_attention(device: torch.device):
    """The Triton paged prefill kernel on CUDA; None: the reference."""
    if device.type == "cuda" and HAS_TRITON:
        from kernels.prefill_attention import prefill_attention
        return prefill_attention
    return None
