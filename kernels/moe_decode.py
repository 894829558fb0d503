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

Dense and fp8 rows are read as they are (fp8 scaled per row after the K loop); mxfp4 rows as int32
words in groups of 32 elements (four words), each group's products summed in one thread and scaled by
its e8m0 byte into an accumulator reduced once after the K loop; for mxfp4 the up kernel writes ``h``
as float32 planes that the down kernel reads with whole-word loads (see :func:`_fp4_vec`).

int4 has kernels of its own (:mod:`kernels.moe_decode_int4`), bound by instructions per weight rather
than bytes.

Legend: T tokens, k experts per token, P = T*k pairs, R rows of a program, D hidden, F expert FFN.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.act16 import Act16
from kernels.moe_config import TileConfig
from kernels.moe_decode_common import (HostMatrices, add_bias, block_k, check_word_rows, e8m0, expert_act,
                                       expert_ptr, fill_of, fill_ptr, fills_on, host_args, pdl_supported)
from kernels.moe_decode_int4 import moe_decode_int4
from kernels.moe_weights import FMT_INT4, FMT_MXFP4, ExpertFormat, PoolMatrix

__all__ = ["moe_decode", "pdl_supported"]


@jit
def _rows_dot(v_ptr, w_rows, s_rows, rows_ok, K, FMT: tl.constexpr, R: tl.constexpr,
              BLOCK_K: tl.constexpr, V_PER_ROW: tl.constexpr, f_rows=None, fs_rows=None, fill_ok=None,
              FILL: tl.constexpr = False, ASM: tl.constexpr = False):
    """``[R]`` float32: each dense, fp8 or mxfp4 weight row (pointers ``w_rows``) dotted with its vector.

    The vector is one for all rows (``v_ptr`` a pointer) or one per row (``V_PER_ROW``: ``[R]`` pointers).
    ``s_rows`` points at each fp8 row's scale, applied once after the K loop, or at each mxfp4 row's
    scale bytes. With ``FILL`` each row that ``fill_ok`` marks is also stored as loaded at ``f_rows``
    (scales at ``fs_rows``).
    """
    if FMT == 3:
        acc = _fp4_rows_dot(v_ptr, w_rows, s_rows, rows_ok, K, R, BLOCK_K, V_PER_ROW, f_rows, fs_rows, fill_ok,
                            FILL, ASM)
    else:
        acc = tl.zeros([R], dtype=tl.float32)
        cols = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + cols
            k_ok = kk < K
            ok = rows_ok[:, None] & k_ok[None, :]                       # [R, BK]
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
def _fp4_rows_dot(v_ptr, w_rows, s_rows, rows_ok, K, R: tl.constexpr, BLOCK_K: tl.constexpr,
                  V_PER_ROW: tl.constexpr, f_rows, fs_rows, fill_ok, FILL: tl.constexpr, ASM: tl.constexpr):
    """:func:`_rows_dot` of mxfp4 rows, read as int32 words (eight values, element ``8i + s`` in bits
    ``4s ..``; rows start on 16 bytes) in chunks of ``BLOCK_K / 32`` groups of four words.

    Each word's eight products and each group's four words are summed in the thread that loaded them,
    each group's sum is scaled by its e8m0 byte into a ``[R, NG]`` accumulator, and the accumulator is
    reduced across threads once, after the K loop. Rows that ``rows_ok`` leaves out must still point at
    readable rows and vectors (the kernels clamp them): only the chunk past the last whole one is masked
    (every chunk with ``FILL``, whose stores need the masks), so whole chunks load without predicates,
    each while the one before is computed (Triton does not pipeline loads that feed no dot)."""
    NG: tl.constexpr = BLOCK_K // 32
    w_words = w_rows.to(tl.pointer_type(tl.int32))[:, None]             # [R, 1]
    acc = tl.zeros([R, NG], dtype=tl.float32)
    if FILL:
        for k0 in range(0, K, BLOCK_K):
            w, sc = _fp4_load(k0, w_words, s_rows, rows_ok, K, BLOCK_K, True,
                              f_rows.to(tl.pointer_type(tl.int32))[:, None], fs_rows, fill_ok, True)
            acc = _fp4_math(acc, w, sc, k0, v_ptr, rows_ok, K, BLOCK_K, V_PER_ROW, True, ASM)
    else:
        k_whole = K - K % BLOCK_K
        if k_whole > 0:
            w, sc = _fp4_load(0, w_words, s_rows, rows_ok, K, BLOCK_K, False)
            for k0 in range(BLOCK_K, k_whole, BLOCK_K):
                w_next, sc_next = _fp4_load(k0, w_words, s_rows, rows_ok, K, BLOCK_K, False)
                acc = _fp4_math(acc, w, sc, k0 - BLOCK_K, v_ptr, rows_ok, K, BLOCK_K, V_PER_ROW, False, ASM)
                w, sc = w_next, sc_next
            acc = _fp4_math(acc, w, sc, k_whole - BLOCK_K, v_ptr, rows_ok, K, BLOCK_K, V_PER_ROW, False, ASM)
        if k_whole < K:
            w, sc = _fp4_load(k_whole, w_words, s_rows, rows_ok, K, BLOCK_K, True)
            acc = _fp4_math(acc, w, sc, k_whole, v_ptr, rows_ok, K, BLOCK_K, V_PER_ROW, True, ASM)
    return tl.sum(acc, axis=1) * 16384.0                                # the nibbles' 2 ** -14


@jit
def _fp4_load(k0, w_words, s_rows, rows_ok, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr, f_words=None,
              fs_rows=None, fill_ok=None, FILL: tl.constexpr = False):
    """Words ``[R, NW]`` (int32) and scale bytes ``[R, NG]`` of the chunk at ``k0``; ``MASKED``: rows
    and groups past K masked off; ``FILL``: both also stored at ``f_words`` / ``fs_rows``."""
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)                           # [NW] word of the row
    g = k0 // 32 + tl.arange(0, BLOCK_K // 32)                          # [NG] group of the row
    if MASKED:
        ok = rows_ok[:, None] & (wi // 4 < K // 32)[None, :]            # [R, NW]: whole groups, 16-byte loads
        g_ok = rows_ok[:, None] & (g < K // 32)[None, :]                # [R, NG]
        w = tl.load(w_words + wi[None, :], mask=ok, other=0)
        sc = tl.load(s_rows[:, None] + g[None, :], mask=g_ok, other=0)
        if FILL:
            tl.store(f_words + wi[None, :], w, mask=ok & fill_ok[:, None])
            tl.store(fs_rows[:, None] + g[None, :], sc, mask=g_ok & fill_ok[:, None])
    else:
        w = tl.load(w_words + wi[None, :])
        sc = tl.load(s_rows[:, None] + g[None, :])
    return w, sc


@jit
def _fp4_math(acc, w, sc, k0, v_ptr, rows_ok, K, BLOCK_K: tl.constexpr, V_PER_ROW: tl.constexpr,
              MASKED: tl.constexpr, ASM: tl.constexpr):
    """``acc [R, NG]`` plus the group dots of words ``w`` at ``k0`` with the vector, each scaled by its
    byte of ``sc`` (see :func:`_fp4_rows_dot`)."""
    NG: tl.constexpr = BLOCK_K // 32
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)                           # [NW] word of the row
    ok = rows_ok[:, None] & (wi // 4 < K // 32)[None, :]                # [R, NW] (with MASKED)
    vals = _fp4_word(w, ASM)                                            # 8 x [R, NW] float32
    dot = vals[0] * _fp4_vec(v_ptr, wi, 0, ok, K, V_PER_ROW, MASKED)    # [R, NW] word dots
    for i in tl.static_range(1, 8):
        dot += vals[i] * _fp4_vec(v_ptr, wi, i, ok, K, V_PER_ROW, MASKED)
    dot = tl.sum(tl.reshape(dot, (acc.shape[0], NG, 4)), axis=2)        # [R, NG] group dots
    return acc + dot * e8m0(sc)


# PTX of _fp4_word: per pair, nibbles i and i + 4 placed as fp16 bits, then each half as float32.
_FP4_PAIR_ASM = ("{0} a, $8, {1}; and.b32 a, a, 0x0E000E00; shl.b32 b, $8, {2}; and.b32 b, b, 0x80008000; "
                 "or.b32 a, a, b; mov.b32 {{l, h}}, a; cvt.f32.f16 ${3}, l; cvt.f32.f16 ${4}, h; ")
_FP4_WORD_ASM = tl.constexpr("{ .reg .b32 a, b; .reg .b16 l, h; " + "".join(
    _FP4_PAIR_ASM.format("shl.b32" if i < 3 else "shr.b32", abs(9 - 4 * i), 12 - 4 * i, i, i + 4)
    for i in range(4)) + "}")


@jit
def _fp4_word(w, ASM: tl.constexpr):
    """The eight e2m1 values of int32 words ``w`` (element ``s`` in bits ``4s ..``) as float32 tensors,
    each times 2 ** -14: nibbles ``i`` and ``i + 4`` at once as a pair of fp16 bits (the bits of
    :func:`kernels.moe_decode_common.fp4_pair`). ``ASM``: the same in PTX, two shifts, two logic
    operations and two conversions a pair (Triton's own code shuffles the halves between registers)."""
    if ASM:
        vals = tl.inline_asm_elementwise(_FP4_WORD_ASM, "=f,=f,=f,=f,=f,=f,=f,=f,r", [w],
                                         dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        l0, h0 = _fp4_halves(w, 0)
        l1, h1 = _fp4_halves(w, 1)
        l2, h2 = _fp4_halves(w, 2)
        l3, h3 = _fp4_halves(w, 3)
        vals = (l0, l1, l2, l3, h0, h1, h2, h3)
    return vals


@jit
def _fp4_halves(w, I: tl.constexpr):
    """float32 nibbles ``I`` and ``I + 4`` of words ``w``, times 2 ** -14 (see :func:`_fp4_word`)."""
    if I < 3:
        mag = w << (9 - 4 * I)
    else:
        mag = w >> 3
    pair = (mag & 0x0E000E00) | ((w << (12 - 4 * I)) & -0x7FFF8000)   # sign bits: 0x80008000
    lo = pair.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (pair >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@jit
def _fp4_vec(v_ptr, wi, s, ok, K, V_PER_ROW: tl.constexpr, MASKED: tl.constexpr):
    """float32 elements ``8 wi + s`` (``wi [NW]`` words) of the vector against ``[R, NW]`` rows.

    One vector (``v_ptr``, contiguous): ``[1, NW]``. One per row (``V_PER_ROW``, ``v_ptr [R]``): ``h``
    as the up kernel writes it for mxfp4, float32 planes (element ``8i + s`` at ``s K/8 + i``), so a
    thread's words meet contiguous elements: ``[R, NW]``, masked by ``ok``. ``MASKED``: words past K
    are masked off."""
    if V_PER_ROW:
        at = v_ptr[:, None] + (s * 4 * (K // 32) + wi)[None, :]         # [R, NW]: 16-byte loads
        if MASKED:
            v = tl.load(at, mask=ok, other=0.0)
        else:
            v = tl.load(at)
    else:
        if MASKED:
            v = tl.load(v_ptr + 8 * wi + s, mask=wi // 4 < K // 32, other=0.0).to(tl.float32)[None, :]
        else:
            v = tl.load(v_ptr + 8 * wi + s).to(tl.float32)[None, :]
    return v


@jit
def _up_decode_kernel(x_ptr, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, ss_s, ss_n, bias, F, K, stride_x,
                      host, TOP_K: tl.constexpr, FMT: tl.constexpr, EPI: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, HOST: tl.constexpr, FILL: tl.constexpr,
                      ASM: tl.constexpr = False):
    """``h`` of pair ``program_id(0)``, outputs ``program_id(1) * BN ..``. ``host``: the store's
    ``(w, scale, bias, row_base, fill_row)``; ``bias``: the pool's ``(bias, slot stride)``; ``EPI``:
    see :class:`kernels.moe_weights.ExpertFormat`."""
    hw_ptr, hs_ptr, hb_ptr, row_base, fill_row = host
    pair = tl.program_id(0)
    # BLOCK_N gate rows then the matching up rows (F further on): both stream through one K loop.
    r = tl.arange(0, 2 * BLOCK_N)                                       # [2BN]
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N
    rows = n + (r // BLOCK_N) * F
    rd = rows
    if FMT == 3:  # mxfp4 reads whole chunks unmasked: rows past F read row F - 1 (never stored)
        rd = tl.minimum(n, F - 1) + (r // BLOCK_N) * F
    e = tl.load(ids_ptr + pair)
    slot = tl.load(slot_ptr + e).to(tl.int64)                           # int64: pools exceed 2 GiB
    key = (row_base + e).to(tl.int64)
    w_rows = expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + rd * sw_n
    s_rows = expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + rd * ss_n
    fill = fill_of(fill_row, e, slot, FILL)
    f_rows = fill_ptr(w_ptr, fill, sw_s, FILL) + rows * sw_n
    fs_rows = fill_ptr(s_ptr, fill, ss_s, FILL) + rows * ss_n
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    # Only a program whose expert has a fill slot runs the K loop that stores: a loop with stores is
    # not pipelined: with the stores masked off in every program a call took 21% longer at one token
    # (benchmarks/results/fill_loop_2026-11-30.json).
    if FILL:
        if fill >= 0:
            gu = _rows_dot(x_row, w_rows, s_rows, n < F, K, FMT, 2 * BLOCK_N, BLOCK_K, False, f_rows, fs_rows,
                           rows >= 0, True, ASM)
        else:
            gu = _rows_dot(x_row, w_rows, s_rows, n < F, K, FMT, 2 * BLOCK_N, BLOCK_K, False, ASM=ASM)
    else:
        gu = _rows_dot(x_row, w_rows, s_rows, n < F, K, FMT, 2 * BLOCK_N, BLOCK_K, False, ASM=ASM)
    if EPI[3]:
        gu = add_bias(gu, bias, hb_ptr, slot, key, fill, rows, n < F, HOST, FILL)
    gu = tl.reshape(gu, (2, BLOCK_N))                                   # [2, BN]: gate row, up row
    half = tl.arange(0, 2)[:, None]
    gate = tl.sum(tl.where(half == 0, gu, 0.0), axis=0)                 # [BN]
    up = tl.sum(tl.where(half == 1, gu, 0.0), axis=0)
    h = expert_act(gate, up, EPI)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    at = cols
    if FMT == 3:  # float32 planes for the down kernel (see _fp4_vec)
        at = (cols % 8) * (F // 8) + cols // 8
    tl.store(h_ptr + pair.to(tl.int64) * F + at, h.to(h_ptr.dtype.element_ty), mask=cols < F)


@jit
def _down_decode_kernel(h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n, s_ptr, ss_s, ss_n, bias, D, F,
                        stride_o, host, TOP_K: tl.constexpr, KP: tl.constexpr, FMT: tl.constexpr,
                        EPI: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HOST: tl.constexpr,
                        FILL: tl.constexpr, ASM: tl.constexpr = False):
    """``out`` of token ``program_id(0)``, rows ``program_id(1) * BN ..`` (arguments as the up kernel's)."""
    hw_ptr, hs_ptr, hb_ptr, row_base, fill_row = host
    tok = tl.program_id(0)
    r = tl.arange(0, KP * BLOCK_N)                                      # [R] row r: expert r // BN
    j = r // BLOCK_N
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N                        # [R] hidden row of w2
    j_ok = j < TOP_K                                                    # KP pads k to a power of two
    pair = tok * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j_ok, other=0)
    slot = tl.load(slot_ptr + e, mask=j_ok, other=0).to(tl.int64)
    key = (row_base + e).to(tl.int64)
    n_rd, pair_rd = n, pair
    if FMT == 3:  # mxfp4 reads whole chunks unmasked: rows past D or k read valid ones (weight 0)
        n_rd, pair_rd = tl.minimum(n, D - 1), tl.where(j_ok, pair, tok * TOP_K)
    w_rows = expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + n_rd * sw_n
    s_rows = expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + n_rd * ss_n
    fill = fill_of(fill_row, e, slot, FILL)
    h_rows = h_ptr + pair_rd.to(tl.int64) * F
    rows_ok = j_ok & (n < D)
    if FILL:                                        # stores only where some of the k experts fill (see up)
        if tl.max(fill, axis=0) >= 0:
            y = _rows_dot(h_rows, w_rows, s_rows, rows_ok, F, FMT, KP * BLOCK_N, BLOCK_K, True,
                          fill_ptr(w_ptr, fill, sw_s, FILL) + n * sw_n, fill_ptr(s_ptr, fill, ss_s, FILL) + n * ss_n,
                          j_ok & (fill >= 0), True, ASM)  # [R]
        else:
            y = _rows_dot(h_rows, w_rows, s_rows, rows_ok, F, FMT, KP * BLOCK_N, BLOCK_K, True, ASM=ASM)
    else:
        y = _rows_dot(h_rows, w_rows, s_rows, rows_ok, F, FMT, KP * BLOCK_N, BLOCK_K, True, ASM=ASM)
    if EPI[3]:
        y = add_bias(y, bias, hb_ptr, slot, key, fill, n, rows_ok, HOST, FILL)
    y = y * tl.load(tw_ptr + pair, mask=j_ok, other=0.0).to(tl.float32)  # routing weight
    acc = tl.sum(tl.reshape(y, (KP, BLOCK_N)), axis=0)                  # [BN]: fixed-order sum over k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < D)


def _check_mxfp4_rows(w13: PoolMatrix, w2: PoolMatrix, host: HostMatrices | None) -> None:
    """The mxfp4 kernels read every row of the pool and the host store as int32 words, 16 bytes at once."""
    views = [(w13, "w13"), (w2, "w2")] + ([] if host is None else [(host[0], "host w13"), (host[1], "host w2")])
    for m, name in views:
        check_word_rows(m, f"mxfp4 view {name}")


def moe_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               slot_of_expert: torch.Tensor, w13: PoolMatrix, w2: PoolMatrix, consts: ExpertFormat,
               up: TileConfig, down: TileConfig, pdl: bool = False,
               host: HostMatrices | None = None, x16: Act16 | None = None) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype``: the MoE output, summed over each token's k experts.

    ``host`` (``(w13, w2, row_base, fill)`` over the mapped host store): an expert whose slot is -1 is
    read from store row ``row_base + expert`` instead of the pool (see :func:`expert_ptr`).

    ``pdl`` (int4; see :func:`pdl_supported`) launches both kernels as programmatic dependents: the
    up kernel's launch overlaps the previous kernel, the down kernel's the up kernel, and the down
    kernel requests its first chunk of w2 before it waits for ``h``.

    int4 group sizes are 32, 64 or 128 (:func:`kernels.quant.int4.check_group_size`): powers of two of
    at least four int32 words (16 bytes), as the kernels' group tiles need. ``x16`` (int4 only): ``x``
    already as 16-bit planes (:mod:`kernels.act16`), so the int4 kernels skip their prep launch."""
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    if consts.fmt == FMT_INT4:
        return moe_decode_int4(x, ids, tw, slot_of_expert, w13, w2, consts, up, down, pdl, host, x16)
    t, d = x.shape
    k = topk_ids.shape[1]
    f = w13.n // 2
    group = consts.group if consts.fmt == FMT_MXFP4 else 0              # mxfp4: chunks of whole groups
    # [P, F]; mxfp4: float32 planes (_fp4_vec)
    h = torch.empty(t * k, f, dtype=torch.float32 if group else x.dtype, device=x.device)
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    common = dict(FMT=consts.fmt, EPI=consts.epi, HOST=host is not None, FILL=fills_on(host))
    if group:  # mxfp4: rows read as words; nibbles decoded in PTX where there is a GPU (not interpreted)
        _check_mxfp4_rows(w13, w2, host)
        common["ASM"] = x.device.type == "cuda"
    w, sw_s, sw_n, s, _, ss_s, _, ss_n = w13.args()
    _up_decode_kernel[(t * k, cdiv(f, up.block_n))](
        x, ids, slot_of_expert, h, w, sw_s, sw_n, s, ss_s, ss_n, w13.bias_args(), f, d, x.stride(0),
        host_args(host, w13, 0, False), TOP_K=k, BLOCK_N=up.block_n, BLOCK_K=block_k(up.block_k, d, group),
        num_warps=up.num_warps, num_stages=up.num_stages, **common)
    w, sw_s, sw_n, s, _, ss_s, _, ss_n = w2.args()
    _down_decode_kernel[(t, cdiv(d, down.block_n))](
        h, ids, slot_of_expert, tw, out, w, sw_s, sw_n, s, ss_s, ss_n, w2.bias_args(), d, f, out.stride(0),
        host_args(host, w2, 1, False), TOP_K=k, KP=next_pow2(k), BLOCK_N=down.block_n,
        BLOCK_K=block_k(down.block_k, f, group), num_warps=down.num_warps, num_stages=down.num_stages, **common)
    return out
