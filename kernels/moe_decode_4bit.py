"""4-bit decode MoE GEMMs (1-16 tokens): integer dot products of packed int4 or MXFP4 weights and
16-bit activations.

A matrix-vector product over 4-bit weights is bound by instructions per weight, not by bytes, unless
each weight costs a few instructions at most. Turning nibbles into floats costs a shift, an and-or and
an FMA per weight (on Hopper the first two run at half rate), and MXFP4's float nibbles more. These
kernels stay in integers instead:

* activations are taken as 16-bit fixed point ``v = sv * q`` (kernels/act16.py: the format, the
  plane layout that matches a packed word's bytes, and the producers);
* an int4 word (eight nibbles) becomes two words of four bytes (one shift, two ands), and four
  ``dp2a`` instructions multiply the bytes with pairs of 16-bit activations and accumulate in int32:
  about one instruction per weight;
* an MXFP4 word (eight e2m1 nibbles) becomes the same two words of signed bytes, each byte twice its
  e2m1 value (``0, ±1, ±2, ±3, ±4, ±6, ±8, ±12``: integers), looked up by ``prmt`` byte permutes
  (:func:`_fp4_bytes`), then the same four ``dp2a``: about three instructions per weight;
* per row and block, ``sum_k (w_k - z) s v_k = s sv (sum_k w_k q_k - z sum_k q_k)``: the zero point
  and both scales apply once, in float32 (MXFP4: no zero point, the scale ``2 ** (e - 127) / 2``).

Word ``i`` of a packed row holds elements ``8i .. 8i+7``, element ``8i + s`` in bits ``4s .. 4s+3``
(int4 as :mod:`kernels.quant` packs it, MXFP4 as checkpoints ship it).

Two or three launches per MoE call:

* prep, grid ``[T]`` (:func:`kernels.act16.act16`): ``x`` as planes with one scale per weight group,
  and each group's sum of ``q`` (done once: every up program needs all of it). Skipped when the
  caller passes them (``x16``): the engine has the add + RMSNorm that computes ``x`` write them
  (:func:`kernels.decode_ops.add_rms_norm_act16`), which takes a launch off each MoE layer's chain;
* up, grid ``[P, F / BN]``: ``BN`` gate and up rows of one expert, their biases if any, the activation
  (SiLU·mul or gpt-oss's clamped SwiGLU), and the program's ``h`` values written as planes with one
  scale per word (eight values: a program's outputs are whole words, so it waits for no other program);
* down, grid ``[T, D / BN]``: ``BN`` rows of every one of a token's k experts, each word's dot scaled
  by its ``h`` scale, the experts' biases if any added, the routing weights applied and the sum over k
  taken in a fixed order.

On Hopper and later the launches overlap (``pdl``, programmatic dependent launch): each starts while
its predecessor finishes; the up and down kernels read the routing ids, the slot table and their first
chunk of weights, and wait for the predecessor only before they read the activations it wrote.

Without a GPU (the Triton interpreter) the same integer arithmetic runs as plain Triton operations.

Legend: T tokens, k experts per token, P = T*k pairs, D hidden, F expert FFN, G group size, NG groups
of a tile, GW = G/8 int32 words of a group, BN output rows of a program. ``FP4``: the weights are
MXFP4 (G = 32, one e8m0 scale byte per group, no zero point); otherwise int4.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, pdl_launch, tl
from kernels.act16 import Act16, act16, check_act16, store_h_words
from kernels.moe_config import TileConfig
from kernels.moe_decode_common import (HostMatrices, add_bias, block_k, e8m0, expert_act, expert_ptr, fill_of,
                                       fill_ptr, fills_on, gdc_launch_dependents, gdc_wait, host_args, int4_word_args,
                                       on_gpu)
from kernels.moe_weights import FMT_MXFP4, ExpertFormat, PoolMatrix


@jit
def _planes(q_row, idx, ok, K8):
    """The four plane words ``idx`` of the vector whose planes start at ``q_row`` (int32)."""
    return (tl.load(q_row + idx, mask=ok, other=0), tl.load(q_row + K8 + idx, mask=ok, other=0),
            tl.load(q_row + 2 * K8 + idx, mask=ok, other=0), tl.load(q_row + 3 * K8 + idx, mask=ok, other=0))


# PTX of _fp4_bytes: nibbles 0-3 of the word (its low half) and 4-7 (its high half) are each four
# selectors: their magnitudes (bit 3 cleared) index the positive and the negative table (two byte
# permutes), and each byte is picked from one of the two by its sign bit moved to the selector's bit 2
# (shift, and-or, permute); two more permutes interleave the halves' bytes into elements 0, 2, 4, 6
# and 1, 3, 5, 7, the order of the activation planes. Tables: 2 * e2m1 of magnitudes 0..7, negated.
_FP4_HALF_ASM = """and.b32 m, {src}, 0x7777;
            prmt.b32 p, 0x03020100, 0x0C080604, m; prmt.b32 n, 0xFDFEFF00, 0xF4F8FAFC, m;
            shr.u32 t, {src}, 1; and.b32 t, t, 0x4444; or.b32 t, t, 0x3210; prmt.b32 {dst}, p, n, t;"""
_FP4_DOT8_ASM = tl.constexpr("""{
            .reg .b32 lo, hi, t, m, p, n;
            shr.u32 hi, $1, 16;
            """ + _FP4_HALF_ASM.format(src="$1", dst="lo") + """
            """ + _FP4_HALF_ASM.format(src="hi", dst="hi") + """
            prmt.b32 t, lo, hi, 0x6420;
            prmt.b32 hi, lo, hi, 0x7531;
            dp2a.lo.s32.s32 $0, $2, t, 0;
            dp2a.hi.s32.s32 $0, $3, t, $0;
            dp2a.lo.s32.s32 $0, $4, hi, $0;
            dp2a.hi.s32.s32 $0, $5, hi, $0;
            }""")


@jit
def _dot8(w, xa, xb, xc, xd, OPS: tl.constexpr):
    """int32: the eight nibbles of each word ``w`` times their activations (planes ``xa .. xd``).
    ``OPS = (asm, fp4)``: PTX (a GPU) or plain operations (the interpreter); e2m1 nibbles, each
    counted twice its value (see :func:`_fp4_bytes`), or int4."""
    if OPS[1]:
        if OPS[0]:
            return tl.inline_asm_elementwise(_FP4_DOT8_ASM, "=r,r,r,r,r,r", [w, xa, xb, xc, xd], dtype=tl.int32,
                                             is_pure=True, pack=1)
        lo = _fp4_bytes(w & 0x0F0F0F0F)
        hi = _fp4_bytes((w >> 4) & 0x0F0F0F0F)
        return _spair(xa, lo, 0) + _spair(xb, lo, 16) + _spair(xc, hi, 0) + _spair(xd, hi, 16)
    if OPS[0]:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 lo, hi;
            and.b32 lo, $1, 0x0F0F0F0F;
            shr.u32 hi, $1, 4;
            and.b32 hi, hi, 0x0F0F0F0F;
            dp2a.lo.s32.u32 $0, $2, lo, 0;
            dp2a.hi.s32.u32 $0, $3, lo, $0;
            dp2a.lo.s32.u32 $0, $4, hi, $0;
            dp2a.hi.s32.u32 $0, $5, hi, $0;
            }""",
            "=r,r,r,r,r,r", [w, xa, xb, xc, xd], dtype=tl.int32, is_pure=True, pack=1)
    lo = w & 0x0F0F0F0F
    hi = (w >> 4) & 0x0F0F0F0F
    return _pair(xa, lo, 0) + _pair(xb, lo, 16) + _pair(xc, hi, 0) + _pair(xd, hi, 16)


@jit
def _pair(x, b, S: tl.constexpr):
    """``dp2a``: the two 16-bit halves of ``x`` times bytes ``S/8`` and ``S/8 + 1`` of ``b``."""
    return ((x << 16) >> 16) * ((b >> S) & 255) + (x >> 16) * ((b >> (S + 8)) & 255)


@jit
def _spair(x, b, S: tl.constexpr):
    """:func:`_pair` with signed bytes (``dp2a.s32.s32``)."""
    return ((x << 16) >> 16) * ((b << (24 - S)) >> 24) + (x >> 16) * ((b << (16 - S)) >> 24)


@jit
def _fp4_bytes(n):
    """int32 of four signed bytes: twice the e2m1 value of the nibble in each byte of ``n`` (0..15 a
    byte; sign in bit 3), the integers ``0, ±1, ±2, ±3, ±4, ±6, ±8, ±12``: magnitude ``m`` is ``m``
    below 2, else ``(2 + (m & 1)) << ((m >> 1) - 1)``. What the PTX of :func:`_dot8` looks up."""
    out = n * 0
    for j in tl.static_range(4):
        nib = (n >> (8 * j)) & 15
        m = nib & 7
        v = tl.where(m < 2, m, (2 + (m & 1)) << tl.maximum((m >> 1) - 1, 0))
        out |= (tl.where(nib >= 8, -v, v) & 255) << (8 * j)
    return out


@jit
def _int4_chunk(k0, w_rows, s_rows, z_rows, row_ok, word, grp, K, G: tl.constexpr, NG: tl.constexpr,
                EVEN_K: tl.constexpr, OPS: tl.constexpr, fills=None, fill_ok=None, FILL: tl.constexpr = False):
    """Words, scales (float32) and zero points (int32) of the K chunk at ``k0`` of packed rows, the
    word indices, the groups and which groups are in K. Rows broadcast against ``word [NG, 1, 1, GW]``
    and ``grp [NG, 1, 1, 1]``. With ``FILL`` the rows ``fill_ok`` marks are also stored as loaded at
    ``fills`` (words, scale and zero point row pointers). MXFP4 (``OPS[1]``): the e8m0 scale halved
    (the weights are doubled), zero point 0 (``z_rows`` is never read)."""
    idx = k0 // 8 + word                                                # [NG, 1, 1, GW] word index
    g = k0 // G + grp                                                   # [NG, 1, 1, 1]
    if EVEN_K:  # a constant mask where the tiles divide K
        g_in = tl.full([NG, 1, 1, 1], 1, tl.int1)
    else:       # whole groups are valid or not: the mask never splits a 16-byte load
        g_in = g < K // G
    w = tl.load(w_rows + idx, mask=row_ok & g_in, other=0)              # [NG, A, B, GW]
    g_ok = row_ok & g_in
    sc = tl.load(s_rows + g, mask=g_ok, other=0)                        # [NG, A, B, 1]
    if FILL:
        tl.store(fills[0] + idx, w, mask=row_ok & g_in & fill_ok)
        tl.store(fills[1] + g, sc, mask=g_ok & fill_ok)
    if OPS[1]:
        zp = sc.to(tl.int32) * 0                                        # no zero point
        scf = e8m0(sc) * 0.5
    else:
        z = tl.load(z_rows + g, mask=g_ok, other=0)
        if FILL:
            tl.store(fills[2] + g, z, mask=g_ok & fill_ok)
        zp = z.to(tl.int32)
        scf = sc.to(tl.float32)
    return w, scf, zp, idx, g, g_in


@jit
def _group_dots(w, sc, zp, q_row, idx, g, g_ok, K8, sq_row, sv_row, OPS: tl.constexpr):
    """``[NG, A, B]`` float32, each group's share: packed rows ``w [NG, A, B, GW]`` (scales and zero
    points ``[NG, A, B, 1]``) dotted with the 16-bit vector whose planes start at ``q_row`` (``[1, 1 or
    A, 1, 1]``), group sums at ``sq_row`` and scales at ``sv_row``; groups ``g`` where ``g_ok`` (``[NG,
    1 or A, 1, 1]``). The kernels sum over the groups once, after the K loop: the groups of a chunk
    lie in different warps, so a sum per chunk would cross warps (shared memory and barriers)."""
    xa, xb, xc, xd = _planes(q_row, idx, g_ok, K8)                      # [NG, 1 or A, 1, GW] int32
    dot = tl.sum(_dot8(w, xa, xb, xc, xd, OPS), axis=3, keep_dims=True)  # [NG, A, B, 1] int32
    sv = tl.load(sv_row + g, mask=g_ok, other=0.0)
    if not OPS[1]:                                                      # int4: the zero point's share
        dot -= zp * tl.load(sq_row + g, mask=g_ok, other=0)
    return tl.sum(dot.to(tl.float32) * (sc * sv), axis=3)


@jit
def _word_dots(w, sc, zp, q_row, idx, ok, K8, sv_row, OPS: tl.constexpr):
    """As :func:`_group_dots` for a vector with one scale per word (eight elements) at ``sv_row``:
    each word's sum of ``q`` comes from the same ``dp2a`` over a word of ones, and each word's dot is
    scaled before the group's sum."""
    xa, xb, xc, xd = _planes(q_row, idx, ok, K8)                        # [NG, 1 or A, 1, GW] int32
    sv = tl.load(sv_row + idx, mask=ok, other=0.0)
    dot = _dot8(w, xa, xb, xc, xd, OPS)                                 # [NG, A, B, GW]
    if not OPS[1]:                                                      # int4: each word's sum of q
        dot -= zp * _dot8(xa * 0 + 0x11111111, xa, xb, xc, xd, OPS)
    val = dot.to(tl.float32) * sv
    return tl.sum(tl.sum(val, axis=3, keep_dims=True) * sc, axis=3)


@jit
def _up_rest(acc, start, w_rows, s_rows, z_rows, row_ok, word, grp, K, K8, q_row, sq_row, sv_row, G: tl.constexpr,
             NG: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, OPS: tl.constexpr, fills=None,
             fill_ok=None, FILL: tl.constexpr = False):
    """``acc`` plus the up kernel's chunks from ``start`` on. Kernels take the ``FILL`` loop only where
    their rows fill: stores in a loop keep it from being pipelined, which slows every program even
    with the stores masked off."""
    for k0 in range(start, K, BLOCK_K):
        w, sc, zp, idx, g, g_in = _int4_chunk(k0, w_rows, s_rows, z_rows, row_ok, word, grp, K, G, NG, EVEN_K,
                                              OPS, fills, fill_ok, FILL)
        acc += _group_dots(w, sc, zp, q_row, idx, g, g_in, K8, sq_row, sv_row, OPS)
    return acc


@jit
def _down_rest(acc, start, w_rows, s_rows, z_rows, row_ok, j_ok, word, grp, F, F8, q_row, sv_row,
               G: tl.constexpr, NG: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, OPS: tl.constexpr,
               fills=None, fill_ok=None, FILL: tl.constexpr = False):
    """``acc`` plus the down kernel's chunks from ``start`` on (see :func:`_up_rest`)."""
    for k0 in range(start, F, BLOCK_K):
        w, sc, zp, idx, g, g_in = _int4_chunk(k0, w_rows, s_rows, z_rows, row_ok, word, grp, F, G, NG, EVEN_K,
                                              OPS, fills, fill_ok, FILL)
        acc += _word_dots(w, sc, zp, q_row, idx, j_ok & g_in, F8, sv_row, OPS)
    return acc


# Over 60 lines: a Triton program is one function (its helpers are inlined @triton.jit calls),
# and splitting its main loop further would only move loads away from the math they feed.
@jit
def _up_kernel(xq_ptr, xsum_ptr, xscale_ptr, ids_ptr, slot_ptr, hq_ptr, hv_ptr, w_ptr, sw_s, sw_n4, s_ptr, z_ptr,
               ss_s, sz_s, ss_n, bias, F, K, K32, host, TOP_K: tl.constexpr, ROUND: tl.constexpr, G: tl.constexpr,
               EPI: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
               PDL: tl.constexpr, HOST: tl.constexpr, FILL: tl.constexpr, OPS: tl.constexpr, PRE: tl.constexpr = 1):
    """``h`` of pair ``program_id(0)``, outputs ``program_id(1) * BN ..``: the gate and up rows of one
    expert, plus their biases (``EPI[3]``), combined by the activation (``EPI``, see
    :class:`kernels.moe_weights.ExpertFormat`), written as 16-bit planes with one scale per word (``BN``
    is a multiple of 8). ``host``: the store's ``(w, scale, zero, bias, row_base, fill_row)``;
    ``bias``: the pool's ``(bias, slot stride)``.

    Tile [NG, 2, BN, GW]: NG groups of GW words along K of the gate and up rows of BN outputs. Groups
    outermost: Triton spreads threads over the words of a group, then over rows, and warps over
    gate/up and rows, so the vector, scale and weight loads share one register layout.

    ``PDL``: the routing ids, the slot table and the first ``PRE`` (1 or 2) chunks of weights are read
    before the wait for the previous kernel (the prep of ``x``): it was launched once every program of
    that kernel had finished waiting for its own predecessor, so everything before it is complete;
    then the next kernel may launch.

    The row stride in words comes as ``sw_n4 = sw_n / 4`` and ``K8 = K / 8`` as ``K32 = K / 32``: rows
    and planes start on 16 bytes, and multiplying by 4 here tells the compiler so, which it then
    reads 16 bytes at a time (it infers alignment only from arguments divisible by 16: gpt-oss's
    rows of 2880 are 360 words)."""
    GW: tl.constexpr = G // 8
    NG: tl.constexpr = BLOCK_K // G
    sw_n = sw_n4 * 4
    K8 = K32 * 4
    hw_ptr, hs_ptr, hz_ptr, hb_ptr, row_base, fill_row = host
    pair, nb = tl.program_id(0), tl.program_id(1)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :, None]                 # [1, 1, BN, 1]
    rows = n + tl.arange(0, 2)[None, :, None, None] * F                           # [1, 2, BN, 1]
    grp = tl.arange(0, NG)[:, None, None, None]                                    # [NG, 1, 1, 1]
    word = grp * GW + tl.arange(0, GW)[None, None, None, :]                        # [NG, 1, 1, GW]
    e = tl.load(ids_ptr + pair)
    slot = tl.load(slot_ptr + e).to(tl.int64)                           # int64: pools exceed 2 GiB
    row_ok = on_gpu(n < F, slot, HOST)               # a pair the host CPU computes reads nothing
    key = (row_base + e).to(tl.int64)
    w_rows = expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + rows * sw_n
    s_rows = expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + rows * ss_n
    z_rows = expert_ptr(z_ptr, hz_ptr, slot, key, sz_s, HOST) + rows * ss_n
    fill = fill_of(fill_row, e, slot, FILL)
    fills = (fill_ptr(w_ptr, fill, sw_s, FILL) + rows * sw_n, fill_ptr(s_ptr, fill, ss_s, FILL) + rows * ss_n,
             fill_ptr(z_ptr, fill, sz_s, FILL) + rows * ss_n)
    tok = (pair // TOP_K).to(tl.int64)
    q_row = xq_ptr + tok * (4 * K8)
    sq_row = xsum_ptr + tok * (K // G)
    sv_row = xscale_ptr + tok * (K // G)
    fill_ok = (fill + 0 * rows) >= 0
    w, sc, zp, idx, g, g_in = _int4_chunk(0, w_rows, s_rows, z_rows, row_ok, word, grp, K, G, NG, EVEN_K, OPS,
                                          fills, fill_ok, FILL)
    if PRE >= 2:  # a second chunk requested before the wait
        w1, sc1, zp1, idx1, g1, g_in1 = _int4_chunk(BLOCK_K, w_rows, s_rows, z_rows, row_ok, word, grp, K, G, NG,
                                                    EVEN_K, OPS, fills, fill_ok, FILL)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    acc = _group_dots(w, sc, zp, q_row, idx, g, g_in, K8, sq_row, sv_row, OPS)  # [NG, 2, BN]
    if PRE >= 2:
        acc += _group_dots(w1, sc1, zp1, q_row, idx1, g1, g_in1, K8, sq_row, sv_row, OPS)
    if FILL:    # the loop that stores runs only where the expert fills (see _up_rest)
        if fill >= 0:
            acc = _up_rest(acc, PRE * BLOCK_K, w_rows, s_rows, z_rows, row_ok, word, grp, K, K8, q_row, sq_row,
                           sv_row, G, NG, BLOCK_K, EVEN_K, OPS, fills, fill_ok, True)
        else:
            acc = _up_rest(acc, PRE * BLOCK_K, w_rows, s_rows, z_rows, row_ok, word, grp, K, K8, q_row, sq_row,
                           sv_row, G, NG, BLOCK_K, EVEN_K, OPS)
    else:
        acc = _up_rest(acc, PRE * BLOCK_K, w_rows, s_rows, z_rows, row_ok, word, grp, K, K8, q_row, sq_row,
                       sv_row, G, NG, BLOCK_K, EVEN_K, OPS)
    acc = tl.sum(acc, axis=0)                                           # [2, BN]
    half = tl.arange(0, 2)[:, None]
    if EPI[3]:
        n2 = nb * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]              # [1, BN]
        acc = add_bias(acc, bias, hb_ptr, slot, key, fill, n2 + half * F, on_gpu(n2 < F, slot, HOST), HOST, FILL)
    gate = tl.sum(tl.where(half == 0, acc, 0.0), axis=0)                # [BN]
    up = tl.sum(tl.where(half == 1, acc, 0.0), axis=0)
    h = expert_act(gate, up, EPI)
    if ROUND == 1:  # the activations' precision, as the reference keeps h
        h = h.to(tl.bfloat16).to(tl.float32)
    elif ROUND == 2:
        h = h.to(tl.float16).to(tl.float32)
    pair64 = pair.to(tl.int64)
    store_h_words(h, nb * BLOCK_N, hq_ptr + pair64 * F, hv_ptr + pair64 * (F // 8), F, F // 8, BLOCK_N)


# Over 60 lines: a Triton program is one function (its helpers are inlined @triton.jit calls),
# and splitting its main loop further would only move loads away from the math they feed.
@jit
def _down_kernel(hq_ptr, hv_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n4, s_ptr, z_ptr, ss_s, sz_s,
                 ss_n, bias, D, F, F32, stride_o, host, TOP_K: tl.constexpr, KP: tl.constexpr, G: tl.constexpr,
                 EPI: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 PDL: tl.constexpr, HOST: tl.constexpr, FILL: tl.constexpr, OPS: tl.constexpr, PRE: tl.constexpr = 1):
    """``out`` of token ``program_id(0)``, rows ``program_id(1) * BN ..``: BN rows of w2 of each of the
    token's k experts (tile [NG, KP, BN, GW], groups outermost as in the up kernel), plus the expert's
    biases (``EPI[3]``), each expert's rows times its routing weight, summed over k in a fixed order.

    ``PDL``: launched while the up kernel runs; the first ``PRE`` (1 to 3) chunks of w2 are requested,
    then the wait for ``h``. Arguments ``sw_n4``, ``F32``: row strides over 4 and F / 32 (see the up kernel)."""
    GW: tl.constexpr = G // 8
    NG: tl.constexpr = BLOCK_K // G
    sw_n = sw_n4 * 4
    F8 = F32 * 4
    hw_ptr, hs_ptr, hz_ptr, hb_ptr, row_base, fill_row = host
    tok, db = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, KP)[None, :, None, None]                           # [1, KP, 1, 1]
    n = db * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :, None]       # [1, 1, BN, 1]
    j_in = j < TOP_K                                                    # KP pads k to a power of two
    pair = tok * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j_in, other=0)
    slot = tl.load(slot_ptr + e, mask=j_in, other=0).to(tl.int64)
    j_ok = on_gpu(j_in, slot, HOST)                                    # not the host CPU's pairs
    key = (row_base + e).to(tl.int64)
    row_ok = j_ok & (n < D)                                             # [1, KP, BN, 1]
    w_rows = expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + n * sw_n
    s_rows = expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + n * ss_n
    z_rows = expert_ptr(z_ptr, hz_ptr, slot, key, sz_s, HOST) + n * ss_n
    fill = fill_of(fill_row, e, slot, FILL)                             # [1, KP, 1, 1]
    fills = (fill_ptr(w_ptr, fill, sw_s, FILL) + n * sw_n, fill_ptr(s_ptr, fill, ss_s, FILL) + n * ss_n,
             fill_ptr(z_ptr, fill, sz_s, FILL) + n * ss_n)
    fill_ok = j_ok & (fill >= 0)
    pair64 = pair.to(tl.int64)
    q_row = hq_ptr + pair64 * (4 * F8)                                  # [1, KP, 1, 1]
    sv_row = hv_ptr + pair64 * F8
    grp = tl.arange(0, NG)[:, None, None, None]                         # [NG, 1, 1, 1]
    word = grp * GW + tl.arange(0, GW)[None, None, None, :]             # [NG, 1, 1, GW]
    w, sc, zp, idx, g, g_in = _int4_chunk(0, w_rows, s_rows, z_rows, row_ok, word, grp, F, G, NG, EVEN_K,
                                          OPS, fills, fill_ok, FILL)
    if PRE >= 2:
        w1, sc1, zp1, idx1, g1, g_in1 = _int4_chunk(BLOCK_K, w_rows, s_rows, z_rows, row_ok, word, grp, F, G, NG,
                                                    EVEN_K, OPS, fills, fill_ok, FILL)
    if PRE >= 3:
        w2, sc2, zp2, idx2, g2, g_in2 = _int4_chunk(2 * BLOCK_K, w_rows, s_rows, z_rows, row_ok, word, grp, F, G,
                                                    NG, EVEN_K, OPS, fills, fill_ok, FILL)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    acc = _word_dots(w, sc, zp, q_row, idx, j_ok & g_in, F8, sv_row, OPS)  # [NG, KP, BN]
    if PRE >= 2:
        acc += _word_dots(w1, sc1, zp1, q_row, idx1, j_ok & g_in1, F8, sv_row, OPS)
    if PRE >= 3:
        acc += _word_dots(w2, sc2, zp2, q_row, idx2, j_ok & g_in2, F8, sv_row, OPS)
    if FILL:    # the loop that stores runs only where some of the k experts fill (see _up_rest)
        if tl.max(tl.ravel(fill), axis=0) >= 0:
            acc = _down_rest(acc, PRE * BLOCK_K, w_rows, s_rows, z_rows, row_ok, j_ok, word, grp, F, F8, q_row,
                             sv_row, G, NG, BLOCK_K, EVEN_K, OPS, fills, fill_ok, True)
        else:
            acc = _down_rest(acc, PRE * BLOCK_K, w_rows, s_rows, z_rows, row_ok, j_ok, word, grp, F, F8, q_row,
                             sv_row, G, NG, BLOCK_K, EVEN_K, OPS)
    else:
        acc = _down_rest(acc, PRE * BLOCK_K, w_rows, s_rows, z_rows, row_ok, j_ok, word, grp, F, F8, q_row,
                         sv_row, G, NG, BLOCK_K, EVEN_K, OPS)
    acc = tl.sum(acc, axis=0)                                           # [KP, BN]
    if EPI[3]:  # [1, KP, BN, 1] biases, as [KP, BN]
        b = add_bias(tl.zeros([1, KP, BLOCK_N, 1], tl.float32), bias, hb_ptr, slot, key, fill, n, row_ok, HOST, FILL)
        acc += tl.sum(tl.sum(b, axis=3), axis=0)
    tw = tl.load(tw_ptr + tok * TOP_K + tl.arange(0, KP), mask=tl.arange(0, KP) < TOP_K, other=0.0)
    y = tl.sum(acc * tw.to(tl.float32)[:, None], axis=0)                # [BN]: fixed-order sum over k
    cols = db * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=cols < D)


def moe_decode_4bit(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, slots: torch.Tensor,
                    w13: PoolMatrix, w2: PoolMatrix, consts: ExpertFormat, up: TileConfig, down: TileConfig,
                    pdl: bool = False, host: HostMatrices | None = None, x16: Act16 | None = None) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype`` for int4 or MXFP4 experts (see :func:`kernels.moe_decode.moe_decode`);
    ``x16``: ``x`` as 16-bit planes in groups of ``consts.group``, when the caller has them."""
    group = consts.group
    t, d = x.shape
    k = ids.shape[1]
    f = w13.n // 2
    asm = x.device.type == "cuda"             # dp2a where there is a GPU; the interpreter has no PTX
    if host is not None and x16 is not None:
        # The up kernel reads the slot snapshot and its first weights before its wait, trusting that
        # its predecessor (the prep of x) waited for everything before it. Given x16, its predecessor
        # is a direct step's publish or gather copy, which neither waits nor triggers: launch plainly.
        pdl = False
    # The up kernel reads the ids before its wait only behind the prep of x launched here, which waited
    # for the router before it: planes made earlier (by the norm) leave the router as its predecessor,
    # whose ids are visible only after a wait, so then the up kernel launches plainly.
    up_pdl = pdl and x16 is None
    common = dict(G=group, EPI=consts.epi, HOST=host is not None, FILL=fills_on(host),
                  OPS=(asm, consts.fmt == FMT_MXFP4))
    if x16 is None:
        x16 = act16(x, group, pdl)
    elif x16.group != group:
        raise ValueError(f"x16 has groups of {x16.group}, the experts groups of {group}; build it with group={group}")
    else:
        check_act16(x16, t, d, x.device)
    xq, xs, xv = x16.q, x16.sums, x16.scales
    hq = torch.empty(t * k, f // 2, dtype=torch.int32, device=x.device)    # [P, F] as 16-bit planes
    hv = torch.empty(t * k, f // 8, dtype=torch.float32, device=x.device)  # a scale per word
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)                # [T, D]
    w, sw_s, sw_n, *rest = int4_word_args(w13, "w13")
    bk = block_k(up.block_k, d, group)
    bn = max(up.block_n, 8)                   # whole words of h: each gets its own scale
    _up_kernel[(t * k, cdiv(f, bn))](
        xq, xs, xv, ids, slots, hq.view(torch.int16), hv, w, sw_s, sw_n // 4, *rest, w13.bias_args(), f, d, d // 32,
        host_args(host, w13, 0, True), TOP_K=k, ROUND={torch.bfloat16: 1, torch.float16: 2}.get(x.dtype, 0),
        BLOCK_N=bn, BLOCK_K=bk, EVEN_K=d % bk == 0, PRE=max(1, min(up.preload, 2, cdiv(d, bk))),
        num_warps=up.num_warps, num_stages=up.num_stages, PDL=up_pdl, **common, **pdl_launch(up_pdl))
    w, sw_s, sw_n, *rest = int4_word_args(w2, "w2")
    bk = block_k(down.block_k, f, group)
    _down_kernel[(t, cdiv(d, down.block_n))](
        hq, hv, ids, slots, tw, out, w, sw_s, sw_n // 4, *rest, w2.bias_args(), d, f, f // 32, out.stride(0),
        host_args(host, w2, 1, True), TOP_K=k, KP=next_pow2(k), BLOCK_N=down.block_n, BLOCK_K=bk,
        EVEN_K=f % bk == 0, PRE=max(1, min(down.preload, 3, cdiv(f, bk))), num_warps=down.num_warps,
        num_stages=down.num_stages, PDL=pdl, **common, **pdl_launch(pdl))
    return out
