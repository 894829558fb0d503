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

Both paths hold the heads apart from the rows: the shared rows are never copied per head. A decode
step runs over each sequence's context in chunks with a running softmax (a CUDA graph records every
position of the longest context, so a chunk bounds what one layer holds, :data:`DECODE_BYTES`); a
prefill gathers each sequence's rows once and attends a bounded number of heads at a time
(:data:`PREFILL_BYTES`).

Legend: T tokens in the step, H heads, n qk_nope, p qk_rope, v v_head_dim, r kv_lora_rank, D hidden.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.models.layers import Rope, rms_norm
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
        if d.rows is None:                                               # once per step, not per layer
            d.rows, d.valid = context_rows(d.block_tables, d.context_lens, cache.block_size)
        o = _decode(queries, cache, i, d.rows, d.valid, r, m.softmax_scale)            # [B, H, r]
    else:
        o = torch.empty(T, H, r, dtype=queries.dtype, device=queries.device)
        offsets = torch.arange(cache.block_size, device=x.device)
        for s in batch.seqs:
            rows = (s.block_table[:, None] * cache.block_size + offsets).flatten()[:s.ctx_len]
            q = queries[s.q_start:s.q_start + s.q_len]
            o[s.q_start:s.q_start + s.q_len] = _prefill(q, *cache.gather(i, rows), s.ctx_len, m.softmax_scale)
    out = torch.einsum("thr,hvr->thv", o, a.kv_up_v).reshape(T, H * m.v_head_dim)   # the value up-projection
    return linear(out, a.o, a.o_bias, kernel=kernel)                     # [T, D]


def _decode(q: torch.Tensor, cache: KVCache, i: int, rows: torch.Tensor, valid: torch.Tensor, r: int,
            scale: float) -> torch.Tensor:
    """q [B, H, r + p] over each sequence's cache ``rows [B, P]`` (``valid`` masks padding) -> [B, H, r]:
    chunks of positions with a running max and sum, float32 inside; the chunk count is fixed by P, so a
    recorded step replays it as it is."""
    B, H, width = q.shape
    P = rows.shape[1]
    chunk = max(1, min(P, DECODE_BYTES // (B * 4 * (2 * width + H))))
    qf = q.float()
    top = torch.full((B, H), float("-inf"), device=q.device)
    total = torch.zeros(B, H, device=q.device)
    acc = torch.zeros(B, H, r, device=q.device)
    for start in range(0, P, chunk):
        c, k_pe = cache.gather(i, rows[:, start:start + chunk])        # [B, C, 1, r], [B, C, 1, p]
        keys = torch.cat([c, k_pe], -1)[:, :, 0].float()               # [B, C, r + p]
        scores = torch.einsum("bhd,bcd->bhc", qf, keys) * scale
        scores = scores.masked_fill(~valid[:, None, start:start + chunk], float("-inf"))
        new_top = torch.maximum(top, scores.amax(-1))
        safe = torch.where(torch.isinf(new_top), 0.0, new_top)          # a chunk past a context: nothing yet
        weights = torch.exp(scores - safe[..., None])
        keep = torch.exp(top - safe)
        total = total * keep + weights.sum(-1)
        acc = acc * keep[..., None] + torch.einsum("bhc,bcr->bhr", weights, keys[..., :r])
        top = new_top
    return (acc / total[..., None]).to(q.dtype)


def _prefill(q: torch.Tensor, c: torch.Tensor, k_pe: torch.Tensor, ctx_len: int, scale: float) -> torch.Tensor:
    """One sequence's new queries q [Q, H, r + p] over its rows (latent c [C, 1, r], rotary keys k_pe
    [C, 1, p]), causal -> [Q, H, r], float32 inside; each pass a bounded block of queries and heads
    (scores of at most :data:`PREFILL_BYTES` where a context allows), each head over the one set of rows."""
    Q, H, _ = q.shape
    keys = torch.cat([c, k_pe], -1)[:, 0].float()                       # [C, r + p]
    values = keys[:, :c.shape[-1]]                                      # [C, r]
    qpos = torch.arange(ctx_len - Q, ctx_len, device=q.device)
    hidden = torch.arange(ctx_len, device=q.device)[None, :] > qpos[:, None]   # [Q, C] positions after the query
    rows = max(1, min(Q, PREFILL_BYTES // (4 * ctx_len)))              # queries a pass
    heads = max(1, PREFILL_BYTES // (4 * rows * ctx_len))               # heads a pass
    out = torch.empty(Q, H, values.shape[1], dtype=q.dtype, device=q.device)
    for t in range(0, Q, rows):
        for h in range(0, H, heads):
            scores = torch.einsum("qhd,cd->hqc", q[t:t + rows, h:h + heads].float(), keys) * scale   # [h', q', C]
            probs = torch.softmax(scores.masked_fill(hidden[t:t + rows], float("-inf")), -1)
            out[t:t + rows, h:h + heads] = torch.einsum("hqc,cr->qhr", probs, values).to(q.dtype)
    return out
