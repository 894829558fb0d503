"""Multi-head latent attention (DeepSeek-V2 / V3) over the paged cache, in torch on every device.

A token's keys and values for all heads come from one latent ``c`` of ``r = kv_lora_rank`` values
(normed) and one rotary key ``k_pe`` of ``p = qk_rope`` values shared by the heads. Head ``h``'s key
is ``[W_uk[h] c, k_pe]`` and its value ``W_uv[h] c`` (``W_uk [H, n, r]``, ``W_uv [H, v, r]``: the two
halves of kv_b_proj). So the cache keeps ``[c, k_pe]`` alone (``r + p`` values a token and layer,
against ``H (n + p + v)`` for the expanded keys and values), and attention runs on it directly:

* ``q.k = (W_uk[h]^T q_nope) . c + q_pe . k_pe``: the key up-projection folds into the query, which
  becomes ``[W_uk[h]^T q_nope, q_pe]`` of ``r + p`` values, over keys that are the cache rows;
* ``sum_j a_j W_uv[h] c_j = W_uv[h] (sum_j a_j c_j)``: the values are the rows' first ``r`` values,
  and the value up-projection folds into the output, once per query.

Cache rows: a token's latent is kept in the K plane of the layer and its rotary key in the V plane
(``KVCache`` rows of one head, ``r`` and ``p`` wide), each with its own scale in int8 / fp8 storage, so
the cache, its formats and its sizing serve this layout as they are. The rotary dimensions are kept in
rotate-half order (engine/checkpoint/loader.latent_rope_orders turns the checkpoints' interleaved pairs
at load).

On CUDA a decode step runs the Triton kernel of :mod:`kernels.latent_attention`, which reads each
sequence's rows up to its length. The torch paths (decode elsewhere, prefill everywhere) hold the heads
apart from the rows (the shared rows are never copied per head) and run over the context in chunks with
a running softmax (:func:`_running`), so a layer holds a bounded amount whatever the context: a decode
step's chunks stay within :data:`DECODE_BYTES` (a CUDA graph of it records every position of the longest
context the cache allows), a prefill's within :data:`PREFILL_BYTES`, a few heads at a time.

Legend: T tokens in the step, H heads, n qk_nope, p qk_rope, v v_head_dim, r kv_lora_rank, D hidden.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.models.layers import Rope, rms_norm
from kernels.latent_attention import latent_decode_attention
from kernels.paged_attention import context_rows
from kernels.qlinear import linear

# bytes a decode step's chunk of context rows and scores may take in one layer (float32), and those of a
# prefill pass's scores (queries x context rows x heads); both counted in the step's workspace
DECODE_BYTES = 128 << 20
PREFILL_BYTES = 64 << 20

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from engine.kv.cache import KVCache
    from engine.models.moe_transformer import ForwardBatch
    from engine.models.weights import AttentionWeights


def latent_attention(spec: ModelSpec, i: int, a: AttentionWeights, x: torch.Tensor, batch: ForwardBatch,
                     cache: KVCache, rope: tuple[torch.Tensor, torch.Tensor], kernel: bool = False) -> torch.Tensor:
    """Layer ``i``'s attention of ``x [T, D]`` (normed), its new latent rows written to ``cache``: ``[T, D]``.
    ``rope``: cos, sin ``[T, 1, p]``; ``kernel``: 8-bit matrices through the Triton kernel (CUDA)."""
    m, T, H = spec.mla, x.shape[0], spec.num_heads
    r = m.kv_lora_rank
    proj = linear(x, a.qkv, kernel=kernel)                               # [T, q_lora or H (n + p), + r + p]
    q, latent = proj.split([proj.shape[1] - m.latent_dim, m.latent_dim], -1)
    if a.q_b is not None:                                                # low-rank queries: norm, then up
        q = linear(rms_norm(q, a.q_norm, spec.rms_norm_eps), a.q_b, kernel=kernel)
    q = q.reshape(T, H, m.qk_nope + m.qk_rope)
    q_nope, q_pe = q.split([m.qk_nope, m.qk_rope], -1)                   # [T, H, n], [T, H, p]
    c = rms_norm(latent[:, :r], a.k_norm, spec.rms_norm_eps)             # [T, r]
    turned = Rope.apply(torch.cat([q_pe, latent[:, None, r:]], 1), *rope)   # [T, H + 1, p]: one rotation
    q_pe, k_pe = turned[:, :H], turned[:, H]
    cache.write(i, batch.slot_mapping, c[:, None, :], k_pe[:, None, :])
    # the key up-projection folded into the queries: [T, H, r + p] over the cache rows
    queries = torch.cat([torch.einsum("thn,hnr->thr", q_nope, a.kv_up_k), q_pe], -1)
    if batch.decode is not None:
        d = batch.decode
        if kernel and (cache.quantised or cache.storage_dtype == queries.dtype):   # Triton: rows up to each length
            scales = {"c_scale": cache.k_scale[i], "p_scale": cache.v_scale[i]} if cache.quantised else {}
            o = latent_decode_attention(queries, cache.k[i], cache.v[i], d.block_tables, d.context_lens,
                                        cache.block_size, m.softmax_scale, **scales)           # [B, H, r]
        else:
            if d.rows is None:                                           # once per step, not per layer
                d.rows, d.valid = context_rows(d.block_tables, d.context_lens, cache.block_size)
            o = _decode(queries, cache, i, d.rows, d.valid, r, m.softmax_scale)        # [B, H, r]
    else:
        o = torch.empty(T, H, r, dtype=queries.dtype, device=queries.device)
        offsets = torch.arange(cache.block_size, device=x.device)
        for s in batch.seqs:
            rows = (s.block_table[:, None] * cache.block_size + offsets).flatten()[:s.ctx_len]
            o[s.q_start:s.q_start + s.q_len] = _prefill(queries[s.q_start:s.q_start + s.q_len], cache, i, rows,
                                                        m.softmax_scale, r)
    out = torch.einsum("thr,hvr->thv", o, a.kv_up_v).reshape(T, H * m.v_head_dim)   # the value up-projection
    return linear(out, a.o, a.o_bias, kernel=kernel)                     # [T, D]


def _running(q: torch.Tensor, chunks, r: int, scale: float) -> torch.Tensor:
    """Softmax attention of float32 queries ``q [..., M, r + p]`` over ``chunks`` of (keys ``[..., C, r + p]``
    float32, ``keep`` broadcastable to ``[..., M, C]``), the values being the keys' first ``r``: a running
    max and sum, so that one chunk's scores are all a pass holds -> ``[..., M, r]`` float32. A row that
    keeps no position gets zeros."""
    top = torch.full(q.shape[:-1], float("-inf"), device=q.device)
    total = torch.zeros(q.shape[:-1], device=q.device)
    acc = torch.zeros(*q.shape[:-1], r, device=q.device)
    for keys, keep in chunks:
        scores = (q @ keys.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))   # [..., M, C]
        new_top = torch.maximum(top, scores.amax(-1))
        safe = torch.where(torch.isinf(new_top), 0.0, new_top)          # nothing kept yet: no shift
        weights = torch.exp(scores - safe[..., None])
        rescale = torch.exp(top - safe)                                 # the earlier chunks, to the new max
        total = total * rescale + weights.sum(-1)
        acc = acc * rescale[..., None] + weights @ keys[..., :r]
        top = new_top
    return acc / total.clamp_min(torch.finfo(torch.float32).tiny)[..., None]


def _keys(cache: KVCache, i: int, rows: torch.Tensor) -> torch.Tensor:
    """Layer ``i``'s cache ``rows [...]`` as float32 keys ``[..., r + p]`` (the latent, then the rotary key)."""
    c, k_pe = cache.gather(i, rows)
    return torch.cat([c, k_pe], -1)[..., 0, :].float()


def _decode(q: torch.Tensor, cache: KVCache, i: int, rows: torch.Tensor, valid: torch.Tensor, r: int,
            scale: float) -> torch.Tensor:
    """q [B, H, r + p] over each sequence's cache ``rows [B, P]`` (``valid`` masks padding) -> [B, H, r]
    in chunks of positions (:func:`_running`); the chunk count is fixed by P, so a recorded step replays
    it as it is."""
    B, H, width = q.shape
    P = rows.shape[1]
    chunk = max(1, min(P, DECODE_BYTES // (B * 4 * (2 * width + H))))
    chunks = ((_keys(cache, i, rows[:, s:s + chunk]), valid[:, None, s:s + chunk]) for s in range(0, P, chunk))
    return _running(q.float(), chunks, r, scale).to(q.dtype)


def _prefill(q: torch.Tensor, cache: KVCache, i: int, rows: torch.Tensor, scale: float, r: int) -> torch.Tensor:
    """One sequence's new queries q [Q, H, r + p] over its context's cache ``rows [C]``, causal -> [Q, H, r]:
    a few heads at a time, each over chunks of the context (:func:`_running`), so that a pass's scores and
    keys stay within :data:`PREFILL_BYTES` (one head's at least) whatever the context."""
    Q, H, width = q.shape
    C = rows.shape[0]
    span = max(1, min(C, PREFILL_BYTES // (4 * (Q + width))))          # context positions a chunk
    heads = max(1, PREFILL_BYTES // (4 * Q * span))                     # heads a pass
    qpos = torch.arange(C - Q, C, device=q.device)                      # [Q] the queries' positions
    out = torch.empty(Q, H, r, dtype=q.dtype, device=q.device)
    for h in range(0, H, heads):
        chunks = ((_keys(cache, i, rows[s:s + span]),
                   torch.arange(s, min(s + span, C), device=q.device) <= qpos[:, None]) for s in range(0, C, span))
        out[:, h:h + heads] = _running(q[:, h:h + heads].transpose(0, 1).float(), chunks, r, scale).transpose(0, 1)
    return out
