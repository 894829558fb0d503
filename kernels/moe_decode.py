"""Decode MoE GEMMs (1-16 tokens): matrix-vector products bound by the bytes of the k experts.

Two launches per MoE call. Both run many small programs (at one token thousands, several per SM), and
each program reads whole weight strips in wide K chunks, reducing every chunk to one float32 per row
at once, so registers hold one chunk rather than an accumulator tile:

* up, grid ``[P, F / BN]``: ``h[p, n] = silu(x[t] . gate[n]) * (x[t] . up[n])`` for pair ``p = t*k + j``;
  a program reads ``BN`` gate rows and the matching ``BN`` up rows of one expert.
* down, grid ``[T, D / BN]``: ``out[t, n] = sum_j weight[p_j] * (h[p_j] . w2_j[n])``; a program reads
  ``BN`` rows of every one of its token's k experts in the same chunk (``k * BN`` rows in flight) and
  sums over k in its epilogue in a fixed order: no buffer, no atomics, no third launch.

int4 rows are read as int32 words (8 nibbles; element ``8w + m`` in bits ``4m..4m+3``) and become
floats without an int-to-float conversion: the bits ``nibble | 0x4B000000`` are the float ``2^23 + q``.
Zero points leave the inner loop: ``sum_k (q_k - z) s x_k = s (sum_k q_k x_k - z sum_k x_k)`` per group.

Legend: T tokens, k experts per token, P = T*k pairs, R rows of a program, D hidden, F expert FFN,
G int4 group size, NG groups of a chunk, GW = G/8 words of a group.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.moe_config import TileConfig
from kernels.moe_weights import FMT_INT4, PoolMatrix

@jit
def _rows_dot(v_ptr, w_rows, s_rows, z_rows, rows_ok, K, FMT: tl.constexpr, G: tl.constexpr,
              R: tl.constexpr, BLOCK_K: tl.constexpr, V_PER_ROW: tl.constexpr):
    """``[R]`` float32: each weight row (pointers ``w_rows``, int32 words for int4) dotted with its vector.

    The vector is one for all rows (``v_ptr`` a pointer) or one per row (``V_PER_ROW``: ``[R]`` pointers).
    ``s_rows``/``z_rows`` point at each row's scales (fp8: one; int4: one per group) and zero points.
    """
    acc = tl.zeros([R], dtype=tl.float32)
    if FMT == 2:
        NG: tl.constexpr = BLOCK_K // G
        GW: tl.constexpr = G // 8
        m = tl.arange(0, 8)
        for g0 in range(0, K // G, NG):
            grp = g0 + tl.arange(0, NG)                                 # [NG]
            g_ok = grp < K // G
            word = grp[:, None] * GW + tl.arange(0, GW)[None, :]        # [NG, GW]
            ok = rows_ok[:, None] & g_ok[None, :]                       # [R, NG]
            wd = tl.load(w_rows[:, None, None] + word[None, :, :], mask=ok[:, :, None], other=0)
            q = ((wd[:, :, :, None] >> (4 * m)[None, None, None, :]) & 15) | 0x4B000000
            q = q.to(tl.float32, bitcast=True) - 8388608.0              # [R, NG, GW, 8]: 2^23 + q - 2^23
            kk = word[:, :, None] * 8 + m[None, None, :]                # [NG, GW, 8] element index
            if V_PER_ROW:
                v = tl.load(v_ptr[:, None, None, None] + kk[None, :, :, :], mask=ok[:, :, None, None],
                            other=0.0).to(tl.float32)                  # [R, NG, GW, 8]
                qv = tl.sum(tl.sum(q * v, axis=3), axis=2)              # [R, NG]
                vs = tl.sum(tl.sum(v, axis=3), axis=2)                  # [R, NG]
            else:
                v = tl.load(v_ptr + kk, mask=g_ok[:, None, None], other=0.0).to(tl.float32)  # [NG, GW, 8]
                qv = tl.sum(tl.sum(q * v[None, :, :, :], axis=3), axis=2)
                vs = tl.sum(tl.sum(v, axis=2), axis=1)[None, :]         # [1, NG]
            sc = tl.load(s_rows[:, None] + grp[None, :], mask=ok, other=0.0).to(tl.float32)  # [R, NG]
            zp = tl.load(z_rows[:, None] + grp[None, :], mask=ok, other=0).to(tl.float32)
            acc += tl.sum((qv - zp * vs) * sc, axis=1)
    else:
        cols = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + cols
            k_ok = kk < K
            ok = rows_ok[:, None] & k_ok[None, :]                       # [R, BK]
            w = tl.load(w_rows[:, None] + kk[None, :], mask=ok, other=0.0).to(tl.float32)
            if V_PER_ROW:
                v = tl.load(v_ptr[:, None] + kk[None, :], mask=ok, other=0.0).to(tl.float32)
            else:
                v = tl.load(v_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            acc += tl.sum(w * v, axis=1)
        if FMT == 1:  # fp8: one scale per output row
            acc = acc * tl.load(s_rows, mask=rows_ok, other=0.0)
    return acc


@jit
def _up_decode_kernel(x_ptr, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr, ss_s, sz_s, ss_n,
                      F, K, stride_x, TOP_K: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0)
    # BLOCK_N gate rows then the matching up rows (F further on): both stream through one K loop.
    r = tl.arange(0, 2 * BLOCK_N)                                       # [2BN]
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N
    rows = n + (r // BLOCK_N) * F
    slot = tl.load(slot_ptr + tl.load(ids_ptr + pair)).to(tl.int64)    # int64: pools exceed 2 GiB
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    gu = _rows_dot(x_row, w_ptr + slot * sw_s + rows * sw_n, s_ptr + slot * ss_s + rows * ss_n,
                   z_ptr + slot * sz_s + rows * ss_n, n < F, K, FMT, G, 2 * BLOCK_N, BLOCK_K, False)
    gu = tl.reshape(gu, (2, BLOCK_N))                                   # [2, BN]: gate row, up row
    half = tl.arange(0, 2)[:, None]
    gate = tl.sum(tl.where(half == 0, gu, 0.0), axis=0)                 # [BN]
    up = tl.sum(tl.where(half == 1, gu, 0.0), axis=0)
    h = gate / (1.0 + tl.exp(-gate)) * up
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + pair.to(tl.int64) * F + cols, h.to(h_ptr.dtype.element_ty), mask=cols < F)


@jit
def _down_decode_kernel(h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr,
                        ss_s, sz_s, ss_n, D, F, stride_o, TOP_K: tl.constexpr, KP: tl.constexpr,
                        FMT: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tok = tl.program_id(0)
    r = tl.arange(0, KP * BLOCK_N)                                      # [R] row r: expert r // BN
    j = r // BLOCK_N
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N                        # [R] hidden row of w2
    j_ok = j < TOP_K                                                    # KP pads k to a power of two
    pair = tok * TOP_K + j
    slot = tl.load(slot_ptr + tl.load(ids_ptr + pair, mask=j_ok, other=0), mask=j_ok, other=0).to(tl.int64)
    y = _rows_dot(h_ptr + pair.to(tl.int64) * F, w_ptr + slot * sw_s + n * sw_n,
                  s_ptr + slot * ss_s + n * ss_n, z_ptr + slot * sz_s + n * ss_n, j_ok & (n < D), F,
                  FMT, G, KP * BLOCK_N, BLOCK_K, True)                  # [R]
    y = y * tl.load(tw_ptr + pair, mask=j_ok, other=0.0).to(tl.float32)  # routing weight
    acc = tl.sum(tl.reshape(y, (KP, BLOCK_N)), axis=0)                  # [BN]: fixed-order sum over k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < D)


def _block_k(tile: TileConfig, fmt: int, group: int, k: int) -> int:
    # No wider than K needs; int4 chunks hold whole groups. Triton needs powers of two.
    bk = min(tile.block_k, next_pow2(k))
    return max(bk, group) // group * group if fmt == FMT_INT4 else bk


def _weight_args(m: PoolMatrix, fmt: int) -> tuple:
    w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n = m.args()
    if fmt == FMT_INT4:  # as int32 words: rows are K/2 bytes, a multiple of 16 since G | K
        w, sw_s, sw_n = w.view(torch.int32), sw_s // 4, sw_n // 4
    return w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n


def moe_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               slot_of_expert: torch.Tensor, w13: PoolMatrix, w2: PoolMatrix, fmt: int, group: int,
               up: TileConfig, down: TileConfig) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype``: the MoE output, summed over each token's k experts.

    int4 group sizes are 32, 64 or 128 (:func:`engine.quant.int4.check_group_size`): powers of two of
    whole words, as the kernels' group tiles need."""
    t, d = x.shape
    k = topk_ids.shape[1]
    f = w13.n // 2
    h = torch.empty(t * k, f, dtype=x.dtype, device=x.device)          # [P, F]
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    ids = topk_ids.contiguous()
    _up_decode_kernel[(t * k, cdiv(f, up.block_n))](
        x, ids, slot_of_expert, h, *_weight_args(w13, fmt), f, d, x.stride(0),
        TOP_K=k, FMT=fmt, G=group, BLOCK_N=up.block_n, BLOCK_K=_block_k(up, fmt, group, d),
        num_warps=up.num_warps, num_stages=up.num_stages)
    _down_decode_kernel[(t, cdiv(d, down.block_n))](
        h, ids, slot_of_expert, topk_weights.contiguous(), out, *_weight_args(w2, fmt), d, f,
        out.stride(0), TOP_K=k, KP=next_pow2(k), FMT=fmt, G=group, BLOCK_N=down.block_n,
        BLOCK_K=_block_k(down, fmt, group, f), num_warps=down.num_warps, num_stages=down.num_stages)
    return out
