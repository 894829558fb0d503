"""Decode MoE GEMMs (1-16 tokens): matrix-vector products bound by the bytes of the k experts.

Two launches per MoE call. Both run many small programs (at one token thousands, several per SM),
and each program reads whole weight strips in wide K chunks, reducing every chunk to one float32 per
row at once, so registers hold one chunk rather than an accumulator tile:

* up, grid ``[P, F / BN]``: ``h[p, n] = act(x[t] . gate[n] + b[n], x[t] . up[n] + b[F + n])`` for pair
  ``p = t*k + j`` (silu(gate) * up, or gpt-oss's clamped SwiGLU; biases where the layout has them);
  a program reads ``BN`` gate rows and the matching ``BN`` up rows of one expert.
* down, grid ``[T, D / BN]``: ``out[t, n] = sum_j weight[p_j] * (h[p_j] . w2_j[n] + b2_j[n])``; a program
  reads ``BN`` rows of every one of its token's k experts in the same chunk (``k * BN`` rows in flight)
  and sums over k in its epilogue in a fixed order: no buffer, no atomics, no reduction launch.

Dense and fp8 rows are read as they are (fp8 scaled per row after the K loop).

int4 and MXFP4 have kernels of their own (:mod:`kernels.moe_decode_4bit`), bound by instructions per
weight rather than bytes.

Legend: T tokens, k experts per token, P = T*k pairs, R rows of a program, D hidden, F expert FFN.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.act16 import Act16
from kernels.moe_config import TileConfig
from kernels.moe_decode_common import (HostMatrices, add_bias, block_k, expert_act, expert_ptr, fill_of, fill_ptr,
                                       fills_on, host_args, on_gpu, pdl_supported)
from kernels.moe_decode_4bit import moe_decode_4bit
from kernels.moe_weights import FMT_INT4, FMT_MXFP4, ExpertFormat, PoolMatrix

__all__ = ["moe_decode", "pdl_supported"]


@jit
def _rows_dot(v_ptr, w_rows, s_rows, rows_ok, K, FMT: tl.constexpr, R: tl.constexpr,
              BLOCK_K: tl.constexpr, V_PER_ROW: tl.constexpr, f_rows=None, fs_rows=None, fill_ok=None,
              FILL: tl.constexpr = False):
    """``[R]`` float32: each dense or fp8 weight row (pointers ``w_rows``) dotted with its vector.

    The vector is one for all rows (``v_ptr`` a pointer) or one per row (``V_PER_ROW``: ``[R]`` pointers).
    ``s_rows`` points at each fp8 row's scale, applied once after the K loop. With ``FILL`` each row
    that ``fill_ok`` marks is also stored as loaded at ``f_rows`` (scales at ``fs_rows``).
    """
    acc = tl.zeros([R], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + cols
        k_ok = kk < K
        ok = rows_ok[:, None] & k_ok[None, :]                           # [R, BK]
        raw = tl.load(w_rows[:, None] + kk[None, :], mask=ok, other=0.0)
        if FILL:
            tl.store(f_rows[:, None] + kk[None, :], raw, mask=ok & fill_ok[:, None])
        w = raw.to(tl.float32)
        if V_PER_ROW:
            v = tl.load(v_ptr[:, None] + kk[None, :], mask=ok, other=0.0).to(tl.float32)
        else:
            v = tl.load(v_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        acc += tl.sum(w * v, axis=1)
    if FMT == 1:  # fp8: one scale per output row
        sc = tl.load(s_rows, mask=rows_ok, other=0.0)
        if FILL:
            tl.store(fs_rows, sc, mask=rows_ok & fill_ok)
        acc = acc * sc
    return acc


@jit
def _up_decode_kernel(x_ptr, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, ss_s, ss_n, bias, F, K, stride_x,
                      host, TOP_K: tl.constexpr, FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, HOST: tl.constexpr, FILL: tl.constexpr):
    """``h`` of pair ``program_id(0)``, outputs ``program_id(1) * BN ..``. ``host``: the store's
    ``(w, scale, bias, row_base, fill_row)``; ``bias``: the pool's ``(bias, slot stride)``; ``EPI``:
    see :class:`kernels.moe_weights.ExpertFormat`."""
    hw_ptr, hs_ptr, hb_ptr, row_base, fill_row = host
    pair = tl.program_id(0)
    # BLOCK_N gate rows then the matching up rows (F further on): both stream through one K loop.
    r = tl.arange(0, 2 * BLOCK_N)                                       # [2BN]
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N
    rows = n + (r // BLOCK_N) * F
    e = tl.load(ids_ptr + pair)
    slot = tl.load(slot_ptr + e).to(tl.int64)                           # int64: pools exceed 2 GiB
    key = (row_base + e).to(tl.int64)
    w_rows = expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + rows * sw_n
    s_rows = expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + rows * ss_n
    fill = fill_of(fill_row, e, slot, FILL)
    f_rows = fill_ptr(w_ptr, fill, sw_s, FILL) + rows * sw_n
    fs_rows = fill_ptr(s_ptr, fill, ss_s, FILL) + rows * ss_n
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    n_ok = on_gpu(n < F, slot, HOST)                 # a pair the host CPU computes reads nothing
    # Only a program whose expert has a fill slot runs the K loop that stores: a loop with stores is
    # not pipelined: with the stores masked off in every program a call took 21% longer at one token
    # (benchmarks/results/fill_loop_2026-11-30.json).
    if FILL:
        if fill >= 0:
            gu = _rows_dot(x_row, w_rows, s_rows, n_ok, K, FMT, 2 * BLOCK_N, BLOCK_K, False, f_rows, fs_rows,
                           rows >= 0, True)
        else:
            gu = _rows_dot(x_row, w_rows, s_rows, n_ok, K, FMT, 2 * BLOCK_N, BLOCK_K, False)
    else:
        gu = _rows_dot(x_row, w_rows, s_rows, n_ok, K, FMT, 2 * BLOCK_N, BLOCK_K, False)
    if EPI[3]:
        gu = add_bias(gu, bias, hb_ptr, slot, key, fill, rows, n_ok, HOST, FILL)
    gu = tl.reshape(gu, (2, BLOCK_N))                                   # [2, BN]: gate row, up row
    half = tl.arange(0, 2)[:, None]
    gate = tl.sum(tl.where(half == 0, gu, 0.0), axis=0)                 # [BN]
    up = tl.sum(tl.where(half == 1, gu, 0.0), axis=0)
    h = expert_act(gate, up, EPI)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + pair.to(tl.int64) * F + cols, h.to(h_ptr.dtype.element_ty), mask=cols < F)


@jit
def _down_decode_kernel(h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n, s_ptr, ss_s, ss_n, bias, D, F,
                        stride_o, host, TOP_K: tl.constexpr, KP: tl.constexpr, FMT: tl.constexpr,
                        EPI: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HOST: tl.constexpr,
                        FILL: tl.constexpr):
    """``out`` of token ``program_id(0)``, rows ``program_id(1) * BN ..`` (arguments as the up kernel's)."""
    hw_ptr, hs_ptr, hb_ptr, row_base, fill_row = host
    tok = tl.program_id(0)
    r = tl.arange(0, KP * BLOCK_N)                                      # [R] row r: expert r // BN
    j = r // BLOCK_N
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N                        # [R] hidden row of w2
    j_in = j < TOP_K                                                    # KP pads k to a power of two
    pair = tok * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j_in, other=0)
    slot = tl.load(slot_ptr + e, mask=j_in, other=0).to(tl.int64)
    j_ok = on_gpu(j_in, slot, HOST)                                    # not the host CPU's pairs
    key = (row_base + e).to(tl.int64)
    w_rows = expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + n * sw_n
    s_rows = expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + n * ss_n
    fill = fill_of(fill_row, e, slot, FILL)
    h_rows = h_ptr + pair.to(tl.int64) * F
    rows_ok = j_ok & (n < D)
    if FILL:                                        # stores only where some of the k experts fill (see up)
        if tl.max(fill, axis=0) >= 0:
            y = _rows_dot(h_rows, w_rows, s_rows, rows_ok, F, FMT, KP * BLOCK_N, BLOCK_K, True,
                          fill_ptr(w_ptr, fill, sw_s, FILL) + n * sw_n, fill_ptr(s_ptr, fill, ss_s, FILL) + n * ss_n,
                          j_ok & (fill >= 0), True)  # [R]
        else:
            y = _rows_dot(h_rows, w_rows, s_rows, rows_ok, F, FMT, KP * BLOCK_N, BLOCK_K, True)
    else:
        y = _rows_dot(h_rows, w_rows, s_rows, rows_ok, F, FMT, KP * BLOCK_N, BLOCK_K, True)
    if EPI[3]:
        y = add_bias(y, bias, hb_ptr, slot, key, fill, n, rows_ok, HOST, FILL)
    y = y * tl.load(tw_ptr + pair, mask=j_ok, other=0.0).to(tl.float32)  # routing weight
    acc = tl.sum(tl.reshape(y, (KP, BLOCK_N)), axis=0)                  # [BN]: fixed-order sum over k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < D)


def moe_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               slot_of_expert: torch.Tensor, w13: PoolMatrix, w2: PoolMatrix, consts: ExpertFormat,
               up: TileConfig, down: TileConfig, pdl: bool = False,
               host: HostMatrices | None = None, x16: Act16 | None = None) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype``: the MoE output, summed over each token's k experts.

    ``host`` (``(w13, w2, row_base, fill)`` over the mapped host store): an expert whose slot is -1 is
    read from store row ``row_base + expert`` instead of the pool (see :func:`expert_ptr`).

    ``pdl`` (int4 and mxfp4; see :func:`pdl_supported`) launches both kernels as programmatic dependents: the
    up kernel's launch overlaps the prep of ``x`` (only then: given ``x16``, it launches plainly after
    the router, whose ids it reads), the down kernel's the up kernel, and the down kernel requests its
    first chunk of w2 before it waits for ``h``.

    int4 group sizes are 32, 64 or 128 (:func:`kernels.quant.int4.check_group_size`): powers of two of
    at least four int32 words (16 bytes), as the kernels' group tiles need; mxfp4 groups are 32. ``x16``
    (int4 and mxfp4): ``x`` already as 16-bit planes (:mod:`kernels.act16`), so the 4-bit kernels skip
    their prep launch."""
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    if consts.fmt in (FMT_INT4, FMT_MXFP4):
        return moe_decode_4bit(x, ids, tw, slot_of_expert, w13, w2, consts, up, down, pdl, host, x16)
    t, d = x.shape
    k = topk_ids.shape[1]
    f = w13.n // 2
    h = torch.empty(t * k, f, dtype=x.dtype, device=x.device)          # [P, F]
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    common = dict(FMT=consts.fmt, EPI=consts.epi, HOST=host is not None, FILL=fills_on(host))
    w, sw_s, sw_n, s, _, ss_s, _, ss_n = w13.args()
    _up_decode_kernel[(t * k, cdiv(f, up.block_n))](
        x, ids, slot_of_expert, h, w, sw_s, sw_n, s, ss_s, ss_n, w13.bias_args(), f, d, x.stride(0),
        host_args(host, w13, 0, False), TOP_K=k, BLOCK_N=up.block_n, BLOCK_K=block_k(up.block_k, d),
        num_warps=up.num_warps, num_stages=up.num_stages, **common)
    w, sw_s, sw_n, s, _, ss_s, _, ss_n = w2.args()
    _down_decode_kernel[(t, cdiv(d, down.block_n))](
        h, ids, slot_of_expert, tw, out, w, sw_s, sw_n, s, ss_s, ss_n, w2.bias_args(), d, f, out.stride(0),
        host_args(host, w2, 1, False), TOP_K=k, KP=next_pow2(k), BLOCK_N=down.block_n,
        BLOCK_K=block_k(down.block_k, f), num_warps=down.num_warps, num_stages=down.num_stages, **common)
    return out
