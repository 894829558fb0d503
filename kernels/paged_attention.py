"""Paged decode attention: one new query token per sequence over a block-paged KV cache.

For sequence b the keys and values are the cache rows
``block_tables[b, p // block_size] * block_size + p % block_size`` for ``p < context_lens[b]``;
``out[b, h] = softmax(q[b, h] . k * scale) @ v`` with the softmax in float32. GQA: query head h reads
KV head ``h // (H // Hkv)``. Block-table entries past a sequence's used blocks are never read.

:func:`paged_decode_attention` is the Triton path, split-KV (flash-decoding): one program per
(sequence, KV head, split) runs over a range of the sequence's KV blocks for all query heads of that
KV head's group, keeping a running (max, sum, acc) in float32; the last split of each (sequence, KV
head) to finish combines them (it counts the arrivals in a small buffer of zeros that it leaves zeroed
again), so there is no second launch; it merges every query head of its group at once, a chunk of
splits a load, so it waits for a few loads, not a chain of them per head. ``DecodeAttentionLaunch.
fold_reduce=False`` runs the combining as a kernel of its own instead. The grid and the partial buffers are sized from tensor shapes and the
device's SM count only (never from ``context_lens``), and nothing is copied to the host, so the call
can be captured in a CUDA graph; each program reads its sequence's length on the device and takes its share of that
context (:func:`split_bounds`), so a 600-token context in a 4096-token table runs as ten programs
of one tile each rather than three of four. K and V are loaded in their storage dtype and upcast to
float32 at once; the two small matrix products run on tensor cores as TF32, which is exact for
bf16/fp16 K, V and q (their mantissas fit in TF32's), and as IEEE fp32 for an fp32 cache. An int8 /
fp8 (e4m3) cache carries one float32 scale per token and KV head: its stored values are exact in TF32
too, so the kernel multiplies the raw rows and applies each token's key scale to its scores and its
value scale to its probability. On Hopper and later the launches are programmatic dependents: each
starts while the kernel before it finishes and waits for it before reading anything.

gpt-oss layers add two things, each behind a compile-time flag so other models run the same code as
before. Sinks (a logit per query head that attends to nothing) join the final normalisation's
denominator. A sliding window of W: sequence b reads only positions ``>= context_lens[b] - W``; the
splits then share those at most W positions, so nothing before them is read and the split count
follows from W rather than from the table width.
:func:`paged_decode_attention_ref` is the vectorised plain-torch path (CPU decode) and the truth.

Legend: B sequences, H query heads, Hkv KV heads, G = H // Hkv heads per group, hd head dim,
P = max_blocks * block_size padded context, S splits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from kernels._triton import cdiv, gdc_launch_dependents, gdc_wait, jit, next_pow2, pdl_launch, pdl_supported, tl
from kernels.arrivals import arrival_counts

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QUANT_DTYPES = (torch.int8, torch.float8_e4m3fn)     # quantised caches, with a float32 scale per token and KV head
LOG2E = 1.4426950408889634
FOLD_REDUCE = True      # benchmarks set False to time the combining as a launch of its own
GROUP_COMBINE = True    # benchmarks set False to time the folded combining head after head
COMBINE_VALUES = 8192   # float32 partials a folded combine loads at once: heads x splits x head dim


@dataclass(frozen=True)
class DecodeAttentionLaunch:
    """Launch settings; the split count follows from shapes, the SM count and these numbers."""
    block_n: int = 64              # context tokens per loop step (power of two, >= 16)
    num_warps: int = 4
    num_stages: int = 2
    waves: int = 4                 # aim for waves * SMs split programs (best on H200 at 4k-32k)
    min_split_tokens: int = 64     # a split covers at least this many context tokens (rounded up to block_n)
    num_splits: int | None = None  # force a split count (tests, benchmark sweeps)
    fold_reduce: bool = True       # the last split of each (sequence, KV head) combines them: no reduce launch


@jit
def split_bounds(ctx, window, S, min_tokens, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    """A sequence's split layout from its own context length (read on the device, so a captured graph
    spreads whatever context a step has over all its ``S`` programs): (first position read, tokens per
    split, splits that hold any). Split ``s`` reads ``[first + s * per, min(first + (s + 1) * per, ctx))``;
    ``per`` is a multiple of ``BLOCK_N`` and at least ``min_tokens``, and split 0 is never empty."""
    if WINDOWED:
        first = tl.maximum(ctx - window, 0)
    else:
        first = ctx * 0
    span = ctx - first                                                  # >= 1
    per = tl.maximum((span + S - 1) // S, min_tokens)
    per = (per + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    return first, per, (span + per - 1) // per


# Over 60 lines: a Triton program is one function (its helpers are inlined @triton.jit calls),
# and splitting its main loop further would only move loads away from the math they feed.
@jit
def _paged_decode_split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, sinks_ptr, out_ptr, m_ptr,
                               l_ptr, acc_ptr, stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                               stride_st, stride_btb, stride_ob, stride_oh, qk_scale, min_tokens, window, H, S,
                               G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                               BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                               DIRECT: tl.constexpr, DOT_PREC: tl.constexpr, QUANT: tl.constexpr,
                               WINDOWED: tl.constexpr, SINKS: tl.constexpr, count_ptr, FOLD: tl.constexpr = False,
                               BLOCK_S: tl.constexpr = 16, PDL: tl.constexpr = False, BLOCK_H: tl.constexpr = 1,
                               CHUNK: tl.constexpr = 0):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    if PDL:  # launched while the kernel before runs: wait for what it wrote, let the next kernel launch
        gdc_wait()
        gdc_launch_dependents()
    ctx = tl.load(lens_ptr + b)
    first, per, used = split_bounds(ctx, window, S, min_tokens, BLOCK_N, WINDOWED)
    start = first + s * per
    end = tl.minimum(start + per, ctx)                                  # s >= used: empty, writes nothing
    offs_g = tl.arange(0, BLOCK_G)                                      # [BG]
    offs_n = tl.arange(0, BLOCK_N)                                      # [BN]
    offs_d = tl.arange(0, BLOCK_D)                                      # [BD]
    g_ok = offs_g < G
    d_ok = offs_d < HEAD_DIM
    heads = kvh * G + offs_g                                            # [BG] query heads of the group
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)   # [BG, BD]
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)                 # running max (log2 units)
    l_i = tl.zeros([BLOCK_G], tl.float32)                               # running sum of exp2
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)                      # running sum of p * v
    bt_row = bt_ptr + b * stride_btb
    for t0 in range(start, end, BLOCK_N):
        pos = t0 + offs_n                                               # [BN] token positions
        ok = pos < end
        blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=ok, other=0)     # [BN] unused entries unread
        row = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE          # [BN] cache rows
        kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + row[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :], mask=kv_mask)
        k = tl.where(kv_mask, k.to(tl.float32), 0.0)                    # [BN, BD] any storage dtype
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)           # [BG, BN]
        if QUANT:  # int8 / fp8 rows: the token's scale applies to its whole row of scores
            qk = qk * (qk_scale * tl.load(ks_ptr + row * stride_st + kvh, mask=ok, other=0.0))[None, :]
        else:
            qk = qk * qk_scale
        qk = tl.where(ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))                     # finite: >= 1 valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])                                # [BG, BN]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + row[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :], mask=kv_mask)
        v = tl.where(kv_mask, v.to(tl.float32), 0.0)                    # [BN, BD]
        if QUANT:  # the value scale folds into the probabilities of its token
            pv = p * tl.load(vs_ptr + row * stride_st + kvh, mask=ok, other=0.0)[None, :]
        else:
            pv = p
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PREC)
        m_i = m_new
    if DIRECT:  # one split: normalise and write the output here, no reduce launch
        if SINKS:  # the sink's exp joins the denominator (inf for a huge sink: the output goes to 0)
            sink = tl.load(sinks_ptr + heads, mask=g_ok, other=0.0) * 1.4426950408889634   # [BG] log2 units
            o = acc / (l_i + tl.exp2(sink - m_i))[:, None]
        else:
            o = acc / l_i[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:
        part = (b * H + heads) * S + s                                  # [BG] rows of [B, H, S]
        keep = g_ok & (offs_g * 0 + s < used)                           # the reduce reads used splits only
        tl.store(m_ptr + part, m_i, mask=keep)
        tl.store(l_ptr + part, l_i, mask=keep)
        tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=keep[:, None] & d_ok[None, :])
        if FOLD:  # the group's last split to arrive combines the splits: no reduce launch
            if s < used:
                count = count_ptr + b * (H // G) + kvh
                tl.debug_barrier()                                      # every thread's partials stored
                arrived = tl.atomic_add(count, 1, sem="acq_rel")       # releases this split's partials
                if arrived == used - 1:                                 # ... and acquires the others'
                    tl.atomic_xchg(count, 0)                            # zero again for the next call
                    if CHUNK > 0:     # every head of the group at once, CHUNK splits a load
                        _combine_group(m_ptr, l_ptr, acc_ptr, sinks_ptr, out_ptr, b, kvh, used, stride_ob,
                                       stride_oh, H, S, G, HEAD_DIM, BLOCK_H, CHUNK, BLOCK_D, SINKS)
                    else:
                        for g in tl.static_range(G):
                            _combine_splits(m_ptr, l_ptr, acc_ptr, sinks_ptr, out_ptr, b, kvh * G + g, used,
                                            stride_ob, stride_oh, H, S, HEAD_DIM, BLOCK_S, BLOCK_D, SINKS)


@jit
def _combine_group(m_ptr, l_ptr, acc_ptr, sinks_ptr, out_ptr, b, kvh, used, stride_ob, stride_oh, H, S,
                   G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK_D: tl.constexpr, SINKS: tl.constexpr):
    """The ``G`` query heads of KV head ``kvh`` of sequence ``b``: their ``used`` splits' (max, sum, acc)
    merged with a running max, ``CHUNK`` splits of every head per load, so the program that combines
    waits for a few loads rather than a chain per head; normalised and written to ``out``. Partials are
    read past L1 (``.cg``): other programs of the same launch wrote them."""
    offs_h = tl.arange(0, BLOCK_H)                                      # [BH]
    h_ok = offs_h < G
    heads = kvh * G + offs_h
    base = (b * H + heads) * S                                          # [BH]
    offs_c = tl.arange(0, CHUNK)                                        # [C]
    offs_d = tl.arange(0, BLOCK_D)                                      # [BD]
    d_ok = offs_d < HEAD_DIM
    m_run = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    o = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for s0 in range(0, used, CHUNK):
        ok = h_ok[:, None] & (s0 + offs_c < used)[None, :]             # [BH, C]
        idx = base[:, None] + s0 + offs_c[None, :]                      # [BH, C] rows of [B, H, S]
        m = tl.load(m_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(l_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg")
        a = tl.load(acc_ptr + idx[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                    mask=ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg")   # [BH, C, BD]
        m_new = tl.maximum(m_run, tl.max(m, axis=1))                    # -inf only for padding heads
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_run - m_ref)                                  # 0 on the first chunk
        w = tl.exp2(m - m_ref[:, None])                                 # [BH, C]: 0 for empty splits
        total = total * alpha + tl.sum(w * l, axis=1)
        o = o * alpha[:, None] + tl.sum(w[:, :, None] * a, axis=1)
        m_run = m_new
    if SINKS:  # the sink's exp joins the denominator (inf for a huge sink: the output goes to 0)
        total += tl.exp2(tl.load(sinks_ptr + heads, mask=h_ok, other=0.0) * 1.4426950408889634 - m_run)
    o = o / total[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=h_ok[:, None] & d_ok[None, :])


@jit
def _combine_splits(m_ptr, l_ptr, acc_ptr, sinks_ptr, out_ptr, b, h, used, stride_ob, stride_oh, H, S,
                    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr):
    """Query head ``h`` of sequence ``b``: its ``used`` splits' (max, sum, acc) combined, normalised and
    written to ``out``. The partials are read past L1 (``.cg``): other programs of the same launch may
    have written them."""
    base = (b * H + h) * S
    offs_s = tl.arange(0, BLOCK_S)                                      # [BS]
    offs_d = tl.arange(0, BLOCK_D)                                      # [BD]
    d_ok = offs_d < HEAD_DIM
    m_max = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, used, BLOCK_S):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + s0 + offs_s, mask=s0 + offs_s < used,
                                          other=float("-inf"), cache_modifier=".cg"))
    m_all = tl.max(m_max, axis=0)                                       # finite: split 0 is never empty
    total = tl.zeros([BLOCK_S], tl.float32)
    o = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, used, BLOCK_S):
        s_ok = s0 + offs_s < used
        m = tl.load(m_ptr + base + s0 + offs_s, mask=s_ok, other=float("-inf"), cache_modifier=".cg")
        w = tl.exp2(m - m_all)                                          # [BS] 0 for empty splits
        total += w * tl.load(l_ptr + base + s0 + offs_s, mask=s_ok, other=0.0, cache_modifier=".cg")
        a = tl.load(acc_ptr + (base + s0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=s_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")   # [BS, BD]
        o += tl.sum(w[:, None] * a, axis=0)
    denom = tl.sum(total, axis=0)
    if SINKS:  # the sink's exp joins the denominator (inf for a huge sink: the output goes to 0)
        denom += tl.exp2(tl.load(sinks_ptr + h) * 1.4426950408889634 - m_all)
    o = o / denom
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


@jit
def _paged_decode_reduce_kernel(m_ptr, l_ptr, acc_ptr, sinks_ptr, lens_ptr, out_ptr, stride_ob, stride_oh, H, S,
                                min_tokens, window, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                                BLOCK_D: tl.constexpr, SINKS: tl.constexpr, BLOCK_N: tl.constexpr,
                                WINDOWED: tl.constexpr, PDL: tl.constexpr = False):
    """Combines the splits a sequence used (the split kernel's ``split_bounds``, same arguments)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    _, _, used = split_bounds(tl.load(lens_ptr + b), window, S, min_tokens, BLOCK_N, WINDOWED)
    _combine_splits(m_ptr, l_ptr, acc_ptr, sinks_ptr, out_ptr, b, h, used, stride_ob, stride_oh, H, S,
                    HEAD_DIM, BLOCK_S, BLOCK_D, SINKS)


def context_rows(block_tables: torch.Tensor, context_lens: torch.Tensor,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache rows of every context position: (rows [B, P] int64, valid [B, P] bool), P = max_blocks * block_size.

    The same for every layer of a step, so a forward computes it once. Padded positions read row 0
    and are marked invalid.
    """
    pos = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)   # [P]
    rows = block_tables.long()[:, pos // block_size] * block_size + pos % block_size     # [B, P]
    valid = pos[None, :] < context_lens.long()[:, None]                                 # [B, P]
    return torch.where(valid, rows, 0), valid


def attend_rows_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
                    valid: torch.Tensor, scale: float | None = None, finite_padding: bool = False,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [B, H, hd] over the cache rows ``rows [B, P]`` (``valid`` masks padding); float32 inside.

    ``finite_padding``: the row padded positions read (row 0) holds finite numbers (a zero-initialised
    cache), so masking the scores suffices; otherwise keys and values are zeroed there too, since a NaN
    would survive a zero probability.
    """
    k, v = k_cache[rows], v_cache[rows]                                              # [B, P, Hkv, hd]
    if not finite_padding:
        keep = valid[:, :, None, None]
        k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
    return attend_context_ref(q, k, v, valid, scale, sinks)


def attend_context_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                       scale: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, hd] over gathered context k / v [B, P, Hkv, hd] (``valid [B, P]``) -> [B, H, hd], float32 inside.

    ``sinks`` [H] (optional): a learned logit per query head that joins the softmax's denominator and
    attends to nothing, so a head can put weight nowhere (gpt-oss). A sliding window is a ``valid``
    that marks only the last positions (:func:`window_valid`)."""
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else scale
    if sinks is not None:
        return _attend_with_sinks(q, k, v, valid[:, None, None, :], scale, sinks)[:, :, 0]
    # SDPA with grouped KV heads: one fused op on the CPU (the engine's batched decode path there)
    return F.scaled_dot_product_attention(q.float()[:, :, None, :], k.float().transpose(1, 2),
                                          v.float().transpose(1, 2), attn_mask=valid[:, None, None, :],
                                          scale=scale, enable_gqa=True)[:, :, 0].to(q.dtype)   # [B, H, hd]


def _attend_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                       sinks: torch.Tensor) -> torch.Tensor:
    """Attention with a sink logit per head: q [B, H, Q, hd] or [B, H, hd] (Q = 1), k / v [B, P, Hkv, hd],
    ``mask`` broadcastable to [B, H, Q, P] -> [B, H, Q, hd] in q.dtype, float32 inside."""
    qf = q.float() if q.dim() == 4 else q.float()[:, :, None, :]          # [B, H, Q, hd]
    b, h = qf.shape[:2]
    rep = h // k.shape[2]
    kf = k.float().transpose(1, 2).repeat_interleave(rep, 1)            # [B, H, P, hd]
    vf = v.float().transpose(1, 2).repeat_interleave(rep, 1)
    scores = (qf @ kf.transpose(-1, -2)) * scale                        # [B, H, Q, P]
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.float().view(1, h, 1, 1).expand(b, h, qf.shape[2], 1)
    probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]   # the sink's share is dropped
    return (probs @ vf).to(q.dtype)


def window_valid(valid: torch.Tensor, context_lens: torch.Tensor, window: int) -> torch.Tensor:
    """``valid [B, P]`` of a decode step cut to each sequence's last ``window`` positions (0: unchanged)."""
    if window <= 0:
        return valid
    pos = torch.arange(valid.shape[1], device=valid.device)
    return valid & (pos[None, :] >= context_lens.long()[:, None] - window)


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                               scale: float | None = None, out: torch.Tensor | None = None, *,
                               k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                               window: int = 0) -> torch.Tensor:
    """Plain-torch paged decode attention, vectorised over the batch.

    ``sinks`` [H] float32: a sink logit per query head (see :func:`attend_context_ref`); ``window``
    > 0: each sequence attends only to its last ``window`` positions (a sliding-window layer).

    q [B, H, hd], k_cache / v_cache [num_blocks * block_size, Hkv, hd] (q's dtype; or int8 / fp8 e4m3
    with ``k_scale`` / ``v_scale`` [num_blocks * block_size, Hkv] float32, one scale per token and KV
    head, value = stored * scale), block_tables [B, max_blocks] int32, context_lens [B] int32
    (1 <= len <= max_blocks * block_size). Returns [B, H, hd] in q.dtype (written into ``out`` if
    given); computes in float32.
    """
    _check(q, k_cache, v_cache, block_tables, context_lens, block_size, out, k_scale, v_scale)
    if k_scale is not None:
        k_cache = k_cache.float() * k_scale[..., None]
        v_cache = v_cache.float() * v_scale[..., None]
    rows, valid = context_rows(block_tables, context_lens, block_size)
    res = attend_rows_ref(q, k_cache, v_cache, rows, window_valid(valid, context_lens, window), scale, sinks=sinks)
    if out is None:
        return res
    return out.copy_(res)


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, block_size: int, out: torch.Tensor | None,
           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    check_q_cache(q, k_cache, v_cache, block_size, k_scale, v_scale, "[B, H, hd]")
    b = q.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != b or block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32 [{b}, max_blocks], got {block_tables.dtype} "
                         f"{tuple(block_tables.shape)}")
    if context_lens.shape != (b,) or context_lens.dtype != torch.int32:
        raise ValueError(f"context_lens must be int32 [{b}], got {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype):
        raise ValueError(f"out must be {q.dtype} {tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                    ("context_lens", context_lens), ("out", out)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move both to one device")


def check_q_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_size: int,
                  k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, q_dims: str) -> None:
    """One-sentence errors for q (``q_dims`` names its dims) and a paged cache in q's dtype, or int8 / fp8
    with float32 scales [rows, Hkv] (both or neither)."""
    if q.dim() != 3 or q.dtype not in DTYPES:
        raise ValueError(f"q must be bf16/fp16/fp32 {q_dims}, got {q.dtype} {tuple(q.shape)}")
    h, hd = q.shape[1:]
    if (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale and v_scale go together: give both for an int8/fp8 cache, or neither")
    want = QUANT_DTYPES if k_scale is not None else (q.dtype,)
    names = "int8/float8_e4m3fn" if k_scale is not None else str(q.dtype)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 3 or c.dtype not in want or c.shape[2] != hd:
            raise ValueError(f"{name} must be {names} [num_blocks * block_size, Hkv, {hd}], got "
                             f"{c.dtype} {tuple(c.shape)}" + ("" if k_scale is not None else
                                                              "; an int8/fp8 cache needs k_scale and v_scale"))
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must have k_cache's shape {tuple(k_cache.shape)}")
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if sc is not None and (sc.shape != k_cache.shape[:2] or sc.dtype != torch.float32 or sc.stride(1) != 1
                               or sc.device != q.device):
            raise ValueError(f"{name} must be float32 {tuple(k_cache.shape[:2])} with contiguous rows on "
                             f"{q.device}, got {sc.dtype} {tuple(sc.shape)} on {sc.device}")
    if k_scale is not None and k_scale.stride() != v_scale.stride():
        raise ValueError("k_scale and v_scale must have the same strides")
    hkv = k_cache.shape[1]
    if hkv == 0 or h % hkv != 0:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({hkv})")
    if block_size < 1 or k_cache.shape[0] % block_size != 0:
        raise ValueError(f"cache rows ({k_cache.shape[0]}) must be a whole number of blocks of "
                         f"block_size={block_size}")


@lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 16  # the interpreter: a few splits, so tests exercise the reduce


def num_splits(batch: int, kv_heads: int, max_blocks: int, block_size: int, device: torch.device,
               launch: DecodeAttentionLaunch) -> int:
    """Split programs per (sequence, KV head) of a full-attention layer (:func:`split_plan`)."""
    return split_plan(batch, kv_heads, max_blocks, block_size, 0, device, launch)[0]


def check_sinks_window(sinks: torch.Tensor | None, window: int, heads: int, device: torch.device) -> None:
    """One-sentence errors for the gpt-oss extras: ``sinks`` float32 [heads] on ``device``, ``window`` >= 0."""
    if sinks is not None and (sinks.shape != (heads,) or sinks.dtype != torch.float32 or sinks.device != device
                              or sinks.stride(0) != 1):
        raise ValueError(f"sinks must be contiguous float32 [{heads}] on {device} (one logit per query head), "
                         f"got {sinks.dtype} {tuple(sinks.shape)} on {sinks.device}")
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (0: full attention), got {window!r}")


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                           scale: float | None = None, out: torch.Tensor | None = None, *,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                           sinks: torch.Tensor | None = None, window: int = 0,
                           launch: DecodeAttentionLaunch | None = None) -> torch.Tensor:
    """Triton paged decode attention, same contract as :func:`paged_decode_attention_ref`.

    The last dim of q, k_cache, v_cache and out must be contiguous. ``context_lens`` values are not
    checked on the device (that would sync): each must lie in ``[1, max_blocks * block_size]`` and each
    used block id must be a valid block. ``launch`` overrides the default launch settings. An int8 /
    fp8 cache is read as stored (its values are exact in TF32) and its scales are applied to the
    scores and to the probabilities, one multiply per token instead of one per element. ``window``
    is a per-layer constant (the split count follows from it), so a captured graph stays valid.
    """
    _check(q, k_cache, v_cache, block_tables, context_lens, block_size, out, k_scale, v_scale)
    check_sinks_window(sinks, window, q.shape[1], q.device)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1)")
    launch = launch or DecodeAttentionLaunch()
    if launch.block_n < 16 or launch.block_n & (launch.block_n - 1):
        raise ValueError(f"launch.block_n={launch.block_n} must be a power of two >= 16")
    b, h, hd = q.shape
    out = torch.empty_like(q) if out is None else out
    if b == 0:
        return out
    window = window if window < block_tables.shape[1] * block_size else 0   # a window past the table cuts nothing
    splits, min_tokens = split_plan(b, k_cache.shape[1], block_tables.shape[1], block_size, window, q.device,
                                    launch)
    m, l, acc = _partials(out, splits)
    block_d, quant, g = max(16, next_pow2(hd)), k_scale is not None, h // k_cache.shape[1]
    fold = splits > 1 and launch.fold_reduce and FOLD_REDUCE
    count = arrival_counts(q.device, b * k_cache.shape[1], "paged_attention") if fold else context_lens
    pdl = pdl_supported(q.device)       # each launch overlaps the end of the kernel before it (Hopper+)
    _paged_decode_split_kernel[(b, k_cache.shape[1], splits)](
        q, k_cache, v_cache, k_scale if quant else q, v_scale if quant else q, block_tables, context_lens,
        q if sinks is None else sinks, out, m, l, acc, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), k_scale.stride(0) if quant else 0,
        block_tables.stride(0), out.stride(0), out.stride(1),
        (1.0 / math.sqrt(hd) if scale is None else scale) * LOG2E, min_tokens, window, h, splits,
        G=g, HEAD_DIM=hd, BLOCK_SIZE=block_size, BLOCK_G=max(16, next_pow2(g)), BLOCK_N=launch.block_n,
        BLOCK_D=block_d, DIRECT=splits == 1, DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        QUANT=quant, WINDOWED=window > 0, SINKS=sinks is not None, count_ptr=count, FOLD=fold,
        BLOCK_S=min(16, next_pow2(splits)), PDL=pdl, BLOCK_H=next_pow2(g),
        CHUNK=_combine_chunk(g, block_d, splits) if fold and GROUP_COMBINE else 0,
        num_warps=launch.num_warps, num_stages=launch.num_stages, **pdl_launch(pdl))
    if splits > 1 and not fold:
        _paged_decode_reduce_kernel[(b, h)](m, l, acc, q if sinks is None else sinks, context_lens, out,
                                            out.stride(0), out.stride(1), h, splits, min_tokens, window,
                                            HEAD_DIM=hd, BLOCK_S=min(16, next_pow2(splits)), BLOCK_D=block_d,
                                            SINKS=sinks is not None, BLOCK_N=launch.block_n, WINDOWED=window > 0,
                                            PDL=pdl, num_warps=4, **pdl_launch(pdl))
    return out


def _combine_chunk(g: int, block_d: int, splits: int) -> int:
    """Splits per load of the folded combine: every head of the group, at most ``COMBINE_VALUES`` partial
    values a load (a power of two, at most the splits' next power of two)."""
    return max(1, min(next_pow2(splits), COMBINE_VALUES // (next_pow2(g) * block_d)))


def split_plan(batch: int, kv_heads: int, max_blocks: int, block_size: int, window: int, device: torch.device,
               launch: DecodeAttentionLaunch) -> tuple[int, int]:
    """(split programs per sequence and head, least tokens a split covers), from shapes and the SM count
    only, so a captured graph stays valid. The kernels spread each sequence's own context (or its
    window) over the splits on the device (:func:`split_bounds`): a short context in a long table
    still keeps every split program busy with a tile or two instead of a few programs walking it
    alone. ``launch.num_splits`` forces the count (tests, sweeps); the context is then spread over
    that many splits whatever ``min_split_tokens`` says."""
    tokens = max_blocks * block_size if window <= 0 else min(window, max_blocks * block_size)
    if launch.num_splits is not None:
        return max(1, min(launch.num_splits, tokens)), 1
    wanted = cdiv(launch.waves * _sm_count(device), batch * kv_heads)
    return max(1, min(wanted, cdiv(tokens, max(launch.min_split_tokens, launch.block_n)))), launch.min_split_tokens


def _partials(out: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-split running (max, sum, acc) buffers: m, l [B, H, S] and acc [B, H, S, hd] float32; with one
    split the kernel writes ``out`` directly and the three are unused stand-ins."""
    if splits == 1:
        return out, out, out
    b, h, hd = out.shape
    m = torch.empty(b, h, splits, dtype=torch.float32, device=out.device)            # [B, H, S]
    return m, torch.empty_like(m), torch.empty(b, h, splits, hd, dtype=torch.float32, device=out.device)
