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

Cache rows: a token's ``r + p`` values are kept across the K and V planes of the layer, half in
each (``KVCache`` rows of one head of ``(r + p) / 2``), so the cache, its int8 / fp8 storage and its
sizing serve this layout unchanged. The rotary dimensions are kept in rotate-half order
(engine/checkpoint/loader.latent_rope_orders turns the checkpoints' interleaved pairs at load).

Legend: T tokens in the step, H heads, n qk_nope, p qk_rope, v v_head_dim, r kv_lora_rank, D hidden.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.models.layers import Rope, paged_attention_ref, rms_norm
from kernels.paged_attention import attend_context_ref, context_rows
from kernels.qlinear import linear

# bytes of the heads' copies of one sequence's context rows a prefill pass makes (the reference
# attention repeats the shared rows for each head): DeepSeek-V3's 128 heads over 4096 tokens would be 604 MB
PREFILL_HEAD_BYTES = 64 << 20

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
    row = torch.cat([c, k_pe], -1)                                       # [T, r + p]
    half = m.latent_dim // 2
    cache.write(i, batch.slot_mapping, row[:, None, :half], row[:, None, half:])
    # the key up-projection folded into the queries: [T, H, r + p] over the cache rows
    q_lat = torch.einsum("thn,hnr->thr", q_nope, a.kv_up_k)
    queries = torch.cat([q_lat, q_pe], -1)
    if batch.decode is not None:
        d = batch.decode
        if d.rows is None:                                               # once per step, not per layer
            d.rows, d.valid = context_rows(d.block_tables, d.context_lens, cache.block_size)
        keys = torch.cat(cache.gather(i, d.rows), -1)                    # [B, P, 1, r + p]
        o = attend_context_ref(queries, keys, keys[..., :r], d.valid, m.softmax_scale)   # [B, H, r]
    else:       # the shared rows repeat for every head inside: a bounded number of heads at a time
        per_pass = max(1, PREFILL_HEAD_BYTES // (max(s.ctx_len for s in batch.seqs) * m.latent_dim * x.element_size()))
        o = torch.cat([paged_attention_ref(queries[:, h:h + per_pass], lambda rows: _rows(cache, i, rows, r),
                                           batch.seqs, cache.block_size, scale=m.softmax_scale, v_dim=r)
                       .reshape(T, -1, r) for h in range(0, H, per_pass)], 1)
    out = torch.einsum("thr,hvr->thv", o, a.kv_up_v).reshape(T, H * m.v_head_dim)   # the value up-projection
    return linear(out, a.o, a.o_bias, kernel=kernel)                     # [T, D]


def _rows(cache: KVCache, i: int, rows: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s latent rows as keys ``[C, 1, r + p]`` and values (their latent) ``[C, 1, r]``."""
    keys = torch.cat(cache.gather(i, rows), -1)
    return keys, keys[..., :r]
