"""Latent-attention decode (DeepSeek-V2 / V3): one query token per sequence over the paged latent cache.

Each cache row holds one token's normed latent ``c`` (``R`` values, the cache's K plane) and its rotated
shared key ``k_pe`` (``P`` values, the V plane); every query head reads the same rows. Head ``h``'s query
comes folded (engine/models/mla.py): ``q[b, h] = [q_c (R), q_p (P)]``, so

    score[h, j] = (q_c . c_j + q_p . k_pe_j) * scale,    out[b, h] = softmax_j(score[h]) @ c     (R values)

for the positions ``j < context_lens[b]`` of sequence ``b``'s blocks. The value up-projection is applied
afterwards by the caller.

:func:`latent_decode_attention` is split-KV, as :mod:`kernels.paged_attention`: one program per (sequence,
block of heads, split of the context) keeps a running (max, sum, acc) in float32 over the rows of its
split, reading each tile of rows once for its heads, and only up to the sequence's length; the splits
are combined by that module's reduce kernel. The grid and the partial buffers follow from shapes and the
SM count only, so a CUDA graph records the call as it is. An int8 / fp8 cache keeps a float32 scale per
row and plane: the tiles are read as stored (exact in 16 bits) and the latent's scale applies to its
scores and probabilities, the rotary key's to its scores. The products run in the query's 16-bit dtype
with float32 sums (probabilities rounded to it, as flash attention does), in IEEE float32 for a float32
query. :func:`latent_decode_attention_ref` is the plain-torch truth.

Legend: B sequences, H heads, R latent width (kv_lora_rank), P rotary width (qk_rope_head_dim).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.paged_attention import (LOG2E, QUANT_DTYPES, DecodeAttentionLaunch, _paged_decode_reduce_kernel,
                                     _partials, context_rows, split_bounds, split_plan)

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class LatentDecodeLaunch(DecodeAttentionLaunch):
    """Launch settings: :class:`DecodeAttentionLaunch`'s, with ``block_h`` heads a program (a power of two
    >= 16) and a smaller tile of rows, since a latent row is 512 values wide in every released model."""
    block_n: int = 32
    block_h: int = 16
    num_warps: int = 8


# Over 60 lines: a Triton program is one function, as the paged decode kernel's is.
@jit
def _latent_decode_split_kernel(q_ptr, c_ptr, p_ptr, cs_ptr, ps_ptr, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr,
                                acc_ptr, stride_qb, stride_qh, stride_ct, stride_pt, stride_st, stride_btb,
                                stride_ob, stride_oh, qk_scale, min_tokens, H, S,
                                R: tl.constexpr, P: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
                                DIRECT: tl.constexpr, F32: tl.constexpr, QUANT: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    first, per, used = split_bounds(ctx, 0, S, min_tokens, BLOCK_N, False)
    start = first + s * per
    end = tl.minimum(start + per, ctx)                                  # s >= used: empty, writes nothing
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)                        # [BH]
    offs_n = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    h_ok, r_ok, p_ok = heads < H, offs_r < R, offs_p < P
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_c = tl.load(q_row + offs_r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0)        # [BH, BR]
    q_p = tl.load(q_row + R + offs_p[None, :], mask=h_ok[:, None] & p_ok[None, :], other=0.0)    # [BH, BP]
    if F32:
        q_c, q_p = q_c.to(tl.float32), q_p.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)                 # running max (log2 units)
    l_i = tl.zeros([BLOCK_H], tl.float32)                               # running sum of exp2
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)                      # running sum of p * c
    bt_row = bt_ptr + b * stride_btb
    for t0 in range(start, end, BLOCK_N):
        pos = t0 + offs_n                                               # [BN] token positions
        ok = pos < end
        blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=ok, other=0)     # [BN] unused entries unread
        row = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE          # [BN] cache rows
        c_ok, p_ok2 = ok[:, None] & r_ok[None, :], ok[:, None] & p_ok[None, :]
        c = tl.load(c_ptr + row[:, None] * stride_ct + offs_r[None, :], mask=c_ok)               # [BN, BR]
        kp = tl.load(p_ptr + row[:, None] * stride_pt + offs_p[None, :], mask=p_ok2)             # [BN, BP]
        if F32:
            c, kp = tl.where(c_ok, c.to(tl.float32), 0.0), tl.where(p_ok2, kp.to(tl.float32), 0.0)
            sc = tl.dot(q_c, tl.trans(c), input_precision="ieee")       # [BH, BN]
            sp = tl.dot(q_p, tl.trans(kp), input_precision="ieee")
        else:  # 16-bit products (int8 / fp8 values are exact in them), float32 sums
            c = tl.where(c_ok, c.to(q_ptr.dtype.element_ty), 0.0)
            kp = tl.where(p_ok2, kp.to(q_ptr.dtype.element_ty), 0.0)
            sc = tl.dot(q_c, tl.trans(c))
            sp = tl.dot(q_p, tl.trans(kp))
        if QUANT:  # each plane's row scale applies to its part of the scores
            c_scale = tl.load(cs_ptr + row * stride_st, mask=ok, other=0.0)          # [BN]
            qk = (sc * c_scale[None, :] + sp * tl.load(ps_ptr + row * stride_st, mask=ok, other=0.0)[None, :])
            qk = qk * qk_scale
        else:
            qk = (sc + sp) * qk_scale
        qk = tl.where(ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))                     # finite: >= 1 valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])                                # [BH, BN]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if QUANT:  # the latent's scale folds into the probabilities of its row
            p = p * c_scale[None, :]
        if F32:
            pc = tl.dot(p, c, input_precision="ieee")
        else:
            pc = tl.dot(p.to(q_ptr.dtype.element_ty), c)
        acc = acc * alpha[:, None] + pc
        m_i = m_new
    if DIRECT:  # one split: normalise and write the output here, no reduce launch
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_r[None, :],
                 (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & r_ok[None, :])
    else:
        part = (b * H + heads) * S + s                                  # [BH] rows of [B, H, S]
        keep = h_ok & (heads * 0 + s < used)                            # the reduce reads used splits only
        tl.store(m_ptr + part, m_i, mask=keep)
        tl.store(l_ptr + part, l_i, mask=keep)
        tl.store(acc_ptr + part[:, None] * R + offs_r[None, :], acc, mask=keep[:, None] & r_ok[None, :])


def latent_decode_attention_ref(q: torch.Tensor, c_cache: torch.Tensor, p_cache: torch.Tensor,
                                block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                                scale: float, *, c_scale: torch.Tensor | None = None,
                                p_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The truth for :func:`latent_decode_attention`, in float32: q [B, H, R + P], c_cache [rows, 1, R] and
    p_cache [rows, 1, P] (q's dtype, or int8 / fp8 with float32 scales [rows, 1]) -> [B, H, R] in q's dtype."""
    r = c_cache.shape[-1]
    c, kp = c_cache[:, 0].float(), p_cache[:, 0].float()
    if c_scale is not None:
        c, kp = c * c_scale, kp * p_scale
    rows, valid = context_rows(block_tables, context_lens, block_size)  # [B, Pad]
    keys = torch.cat([c, kp], -1)[rows]                                 # [B, Pad, R + P]
    keys = keys.masked_fill(~valid[:, :, None], 0.0)     # padding reads row 0, which may hold anything (NaN)
    scores = (q.float() @ keys.transpose(1, 2)) * scale                 # [B, H, Pad]
    probs = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), -1)
    return (probs @ keys[..., :r]).to(q.dtype)


def _check(q: torch.Tensor, c_cache: torch.Tensor, p_cache: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, c_scale: torch.Tensor | None, p_scale: torch.Tensor | None) -> None:
    if q.dim() != 3 or q.dtype not in DTYPES or q.stride(-1) != 1:
        raise ValueError(f"q must be bf16/fp16/fp32 [B, H, R + P] with a contiguous last dim, got {q.dtype} "
                         f"{tuple(q.shape)}")
    r, p = c_cache.shape[-1], p_cache.shape[-1]
    want = QUANT_DTYPES if c_scale is not None else (q.dtype,)
    for name, t in (("c_cache", c_cache), ("p_cache", p_cache)):
        if t.dim() != 3 or t.shape[1] != 1 or t.dtype not in want or t.stride(-1) != 1 or t.device != q.device:
            raise ValueError(f"{name} must be [rows, 1, width] in {'int8/fp8' if c_scale is not None else q.dtype} "
                             f"with a contiguous last dim on {q.device}, got {t.dtype} {tuple(t.shape)}")
    if q.shape[2] != r + p or p_cache.shape[0] != c_cache.shape[0]:
        raise ValueError(f"q's last dim ({q.shape[2]}) must be the latent's {r} plus the rotary key's {p}, and "
                         "both planes must have the same rows")
    if (c_scale is None) != (p_scale is None):
        raise ValueError("c_scale and p_scale go together: give both for an int8/fp8 cache, or neither")
    for name, sc in (("c_scale", c_scale), ("p_scale", p_scale)):
        if sc is not None and (sc.shape != c_cache.shape[:2] or sc.dtype != torch.float32 or sc.device != q.device):
            raise ValueError(f"{name} must be float32 {tuple(c_cache.shape[:2])} on {q.device}, got {sc.dtype} "
                             f"{tuple(sc.shape)}")
    if c_scale is not None and c_scale.stride() != p_scale.stride():
        raise ValueError("c_scale and p_scale must have the same strides")
    b = q.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != b or block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32 [{b}, max_blocks], got {block_tables.dtype} "
                         f"{tuple(block_tables.shape)}")
    if context_lens.shape != (b,) or context_lens.dtype != torch.int32:
        raise ValueError(f"context_lens must be int32 [{b}], got {context_lens.dtype} {tuple(context_lens.shape)}")


def latent_decode_attention(q: torch.Tensor, c_cache: torch.Tensor, p_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                            scale: float | None = None, *, c_scale: torch.Tensor | None = None,
                            p_scale: torch.Tensor | None = None,
                            launch: LatentDecodeLaunch | None = None) -> torch.Tensor:
    """Triton latent decode attention, :func:`latent_decode_attention_ref`'s contract -> [B, H, R].

    ``context_lens`` values are not checked on the device (that would sync): each must lie in
    ``[1, max_blocks * block_size]`` and each used block id must be a valid block."""
    _check(q, c_cache, p_cache, block_tables, context_lens, c_scale, p_scale)
    launch = launch or LatentDecodeLaunch()
    for name, v in (("block_n", launch.block_n), ("block_h", launch.block_h)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"launch.{name}={v} must be a power of two >= 16")
    b, h, width = q.shape
    r = c_cache.shape[-1]
    out = torch.empty(b, h, r, dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    head_blocks = cdiv(h, launch.block_h)
    splits, min_tokens = split_plan(b, head_blocks, block_tables.shape[1], block_size, 0, q.device, launch)
    m, l, acc = _partials(out, splits)
    scale = 1.0 / math.sqrt(width) if scale is None else scale
    quant = c_scale is not None
    _latent_decode_split_kernel[(b, head_blocks, splits)](
        q, c_cache, p_cache, c_scale if quant else q, p_scale if quant else q, block_tables, context_lens, out, m, l,
        acc, q.stride(0), q.stride(1), c_cache.stride(0), p_cache.stride(0), c_scale.stride(0) if quant else 0,
        block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E, min_tokens, h, splits,
        R=r, P=width - r, BLOCK_SIZE=block_size, BLOCK_H=launch.block_h, BLOCK_N=launch.block_n,
        BLOCK_R=max(16, next_pow2(r)), BLOCK_P=max(16, next_pow2(width - r)), DIRECT=splits == 1,
        F32=q.dtype == torch.float32, QUANT=quant, num_warps=launch.num_warps, num_stages=launch.num_stages)
    if splits > 1:
        _paged_decode_reduce_kernel[(b, h)](m, l, acc, q, context_lens, out, out.stride(0), out.stride(1), h, splits,
                                            min_tokens, 0, HEAD_DIM=r, BLOCK_S=min(16, next_pow2(splits)),
                                            BLOCK_D=max(16, next_pow2(r)), SINKS=False, BLOCK_N=launch.block_n,
                                            WINDOWED=False, num_warps=4)
    return out
