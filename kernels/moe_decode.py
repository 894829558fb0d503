"""Decode MoE GEMMs (1-16 tokens): GEMV programs per (token, expert) pair, or token, and row tile.

At decode the MoE layer is a set of matrix-vector products, bound by the bytes of the k experts'
weights. Each program streams one ``[BLOCK_N, K]`` strip of one expert's matrix once (fp8 and int4
are dequantised in registers inside the K loop) and reduces it against the token's activations.

* up: ``h[p, n] = silu(x[t] . gate[n]) * (x[t] . up[n])`` for pair ``p = t * k + j``;
* down: ``out[t, n] = sum_j weight[p_j] * (h[p_j] . w2_j[n])``: one program per (token, N tile)
  walks the token's k experts in order, so the reduction over k needs no buffer and no atomics.

Legend: T tokens, k experts per token, P = T*k pairs, D hidden, F expert FFN, G int4 group size.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, tl
from kernels.moe_config import TileConfig
from kernels.moe_weights import FMT_FP8, FMT_INT4, PoolMatrix


@jit
def _strip_dot(v_ptr, w_ptr, s_ptr, z_ptr, rows, rows_ok, K, sw_n, ss_n,
               FMT: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``[BLOCK_N]`` float32 dot products of weight ``rows`` with the vector at ``v_ptr``."""
    if FMT == 2:  # int4: BLOCK_K covers BLOCK_K // G whole groups; bytes hold (even, odd) k
        NGI: tl.constexpr = BLOCK_K // G
        HG: tl.constexpr = G // 2
        gi = tl.arange(0, NGI)
        hj = tl.arange(0, HG)
        acc = tl.zeros([BLOCK_N, NGI, HG], dtype=tl.float32)
        for g0 in range(0, K // G, NGI):
            grp = g0 + gi                                               # [NGI]
            g_ok = grp < K // G
            kb = grp[:, None] * HG + hj[None, :]                        # [NGI, HG] byte index
            ve = tl.load(v_ptr + 2 * kb, mask=g_ok[:, None], other=0.0).to(tl.float32)
            vo = tl.load(v_ptr + 2 * kb + 1, mask=g_ok[:, None], other=0.0).to(tl.float32)
            m2 = rows_ok[:, None] & g_ok[None, :]                       # [BN, NGI]
            b = tl.load(w_ptr + rows[:, None, None] * sw_n + kb[None, :, :], mask=m2[:, :, None], other=0)
            sc = tl.load(s_ptr + rows[:, None] * ss_n + grp[None, :], mask=m2, other=0.0).to(tl.float32)
            zp = tl.load(z_ptr + rows[:, None] * ss_n + grp[None, :], mask=m2, other=0).to(tl.float32)
            lo = (b & 15).to(tl.float32)                                # [BN, NGI, HG]
            hi = (b >> 4).to(tl.float32)
            part = lo * ve[None, :, :] + hi * vo[None, :, :] - zp[:, :, None] * (ve + vo)[None, :, :]
            acc += part * sc[:, :, None]
        return tl.sum(tl.sum(acc, axis=2), axis=1)
    else:
        cols = tl.arange(0, BLOCK_K)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + cols
            k_ok = kk < K
            v = tl.load(v_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * sw_n + kk[None, :], mask=rows_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            acc2 += w * v[None, :]
        out = tl.sum(acc2, axis=1)
        if FMT == 1:  # fp8: one scale per output row
            out = out * tl.load(s_ptr + rows * ss_n, mask=rows_ok, other=0.0)
        return out


@jit
def _up_decode_kernel(x_ptr, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr, ss_s, sz_s, ss_n,
                      F, K, stride_x, TOP_K: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0)
    # One strip of 2 * BLOCK_N rows: BLOCK_N gate rows then the matching up rows (F further on), so
    # gate and up stream through the same K loop and twice the bytes are in flight.
    r = tl.arange(0, 2 * BLOCK_N)                                       # [2BN]
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N
    rows = n + (r // BLOCK_N) * F
    slot = tl.load(slot_ptr + tl.load(ids_ptr + pair)).to(tl.int64)    # int64: pools exceed 2 GiB
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    gu = _strip_dot(x_row, w_ptr + slot * sw_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s, rows, n < F, K,
                    sw_n, ss_n, FMT, G, 2 * BLOCK_N, BLOCK_K)           # [2BN]
    gu = tl.reshape(gu, (2, BLOCK_N))                                   # [2, BN]: gate row, up row
    half = tl.arange(0, 2)[:, None]
    gate = tl.sum(tl.where(half == 0, gu, 0.0), axis=0)                 # [BN]
    up = tl.sum(tl.where(half == 1, gu, 0.0), axis=0)
    h = gate / (1.0 + tl.exp(-gate)) * up
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + pair.to(tl.int64) * F + cols, h.to(h_ptr.dtype.element_ty), mask=cols < F)


@jit
def _down_decode_kernel(h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr,
                        ss_s, sz_s, ss_n, D, F, stride_o, TOP_K: tl.constexpr, FMT: tl.constexpr,
                        G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tok = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)          # [BN] rows of w2 (hidden)
    rows_ok = rows < D
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    # The sum over the token's k experts happens here, in a fixed order: deterministic, no atomics.
    for j in range(TOP_K):
        pair = tok * TOP_K + j
        slot = tl.load(slot_ptr + tl.load(ids_ptr + pair)).to(tl.int64)
        y = _strip_dot(h_ptr + pair.to(tl.int64) * F, w_ptr + slot * sw_s, s_ptr + slot * ss_s,
                       z_ptr + slot * sz_s, rows, rows_ok, F, sw_n, ss_n, FMT, G, BLOCK_N, BLOCK_K)
        acc += y * tl.load(tw_ptr + pair).to(tl.float32)               # routing weight in the epilogue
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + rows, acc.to(out_ptr.dtype.element_ty), mask=rows_ok)


def _block_k(tile: TileConfig, fmt: int, group: int) -> int:
    # int4 programs step over whole groups; the interpreter and compiler need powers of two.
    return max(tile.block_k, group) // group * group if fmt == FMT_INT4 else tile.block_k


def moe_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               slot_of_expert: torch.Tensor, w13: PoolMatrix, w2: PoolMatrix, fmt: int, group: int,
               up: TileConfig, down: TileConfig) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype``: the MoE output, summed over each token's k experts."""
    t, d = x.shape
    k = topk_ids.shape[1]
    f = w13.n // 2
    h = torch.empty(t * k, f, dtype=x.dtype, device=x.device)          # [P, F]
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    ids = topk_ids.contiguous()
    w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n = w13.args()
    _up_decode_kernel[(t * k, cdiv(f, up.block_n))](
        x, ids, slot_of_expert, h, w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n, f, d, x.stride(0),
        TOP_K=k, FMT=fmt, G=group, BLOCK_N=up.block_n, BLOCK_K=_block_k(up, fmt, group),
        num_warps=up.num_warps, num_stages=up.num_stages)
    w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n = w2.args()
    _down_decode_kernel[(t, cdiv(d, down.block_n))](
        h, ids, slot_of_expert, topk_weights.contiguous(), out, w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n, d, f,
        out.stride(0), TOP_K=k, FMT=fmt, G=group, BLOCK_N=down.block_n, BLOCK_K=_block_k(down, fmt, group),
        num_warps=down.num_warps, num_stages=down.num_stages)
    return out
