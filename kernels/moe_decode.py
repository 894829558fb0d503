"""Decode MoE GEMMs (1-16 tokens): matrix-vector products bound by the bytes of the k experts.

Two launches per MoE call (three for int4, whose activations are prepared first). Both run many
small programs (at one token thousands, several per SM), and each program reads whole weight strips
in wide K chunks, reducing every chunk to one float32 per row at once, so registers hold one chunk
rather than an accumulator tile:

* up, grid ``[P, F / BN]``: ``h[p, n] = silu(x[t] . gate[n]) * (x[t] . up[n])`` for pair ``p = t*k + j``;
  a program reads ``BN`` gate rows and the matching ``BN`` up rows of one expert.
* down, grid ``[T, D / BN]``: ``out[t, n] = sum_j weight[p_j] * (h[p_j] . w2_j[n])``; a program reads
  ``BN`` rows of every one of its token's k experts in the same chunk (``k * BN`` rows in flight) and
  sums over k in its epilogue in a fixed order: no buffer, no atomics, no reduction launch.

int4 has its own kernels, bound by instructions per weight rather than bytes. Programs read packed
rows as int32 words in ``[NG, .., G/8]`` tiles (16-byte loads); word ``i`` holds elements ``8i ..
8i+7``, element ``8i + s`` in bits ``4s .. 4s+3``. Each nibble position ``s`` is one pass over the
tile: one shift and one and-or turn the nibble into the float ``1 + q/16`` (no conversion), and one
FMA adds it times vector element ``8i + s`` to a per-element accumulator. Both vectors are float32
stored nibble-major (element ``n`` at ``(n % 8) * K/8 + n // 8``), so each nibble's slice is read
contiguously: ``h`` as the up kernel stores it, ``x`` as a third, tiny kernel before it writes it,
with the sums of ``x`` over each group (the up kernel would otherwise gather and add them in every
program). Scale and zero point apply once per row and group: ``sum_k (q_k - z) s x_k = s (16 sum_k
(1 + q_k/16) x_k - (16 + z) sum_k x_k)``.

On Hopper and later the int4 launches can overlap (``pdl``, programmatic dependent launch): each
kernel starts while its predecessor finishes and waits for it before reading what it wrote; the down
kernel requests its first chunk of weights before that wait.

Legend: T tokens, k experts per token, P = T*k pairs, R rows of a program, D hidden, F expert FFN,
G int4 group size, NG groups of a tile, GW = G/8 int32 words of a group.
"""
from __future__ import annotations

import torch

from kernels._triton import HAS_TRITON, cdiv, jit, next_pow2, tl
from kernels.moe_config import TileConfig
from kernels.moe_weights import FMT_INT4, PoolMatrix

# The host store's (w13, w2) views, the store row of the layer's expert 0, and the layer's fill row
# (``[E]`` int32: the pool slot a directly read expert is written into as it is read, or -1; or None).
HostMatrices = tuple[PoolMatrix, PoolMatrix, int, "torch.Tensor | None"]

gdc_launch_dependents = gdc_wait = None
if HAS_TRITON:
    try:  # grid dependency control (Hopper+): the next kernel launches while this one runs
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # older Triton: launches stay serial
        pass

@jit
def _expert_ptr(ptr, host_ptr, slot, key, stride, HOST: tl.constexpr):
    """Base of one expert's matrix (or scales): its pool slot, or with ``HOST`` and slot -1 its row
    ``key`` of the mapped host store, whose views have the pool's strides (a direct read over the bus)."""
    if HOST:
        return tl.where(slot >= 0, ptr + slot * stride, host_ptr + key * stride)
    return ptr + slot * stride


@jit
def _fill_ptr(ptr, fill, stride, FILL: tl.constexpr):
    """Base of one expert's matrix (or scales) in pool slot ``fill``: where a kernel that reads the
    expert from the host store writes it as it reads it (``fill >= 0``), so the pool holds it for the
    next step without a copy. Without ``FILL`` the pool's own base (never written)."""
    base = ptr
    if FILL:
        base = ptr + tl.maximum(fill, 0) * stride
    return base


@jit
def _fill_of(fill_row, e, slot, FILL: tl.constexpr):
    """The fill slot of expert ``e`` (``fill_row[e]``) when it has no pool slot, else -1."""
    fill = slot * 0 - 1                                                 # int64, like the slot
    if FILL:
        fill = tl.where(slot < 0, tl.load(fill_row + e).to(tl.int64), fill)
    return fill


@jit
def _rows_dot(v_ptr, w_rows, s_rows, rows_ok, K, FMT: tl.constexpr, R: tl.constexpr,
              BLOCK_K: tl.constexpr, V_PER_ROW: tl.constexpr, f_rows=None, fs_rows=None, fill_ok=None,
              FILL: tl.constexpr = False):
    """``[R]`` float32: each dense or fp8 weight row (pointers ``w_rows``) dotted with its vector.

    The vector is one for all rows (``v_ptr`` a pointer) or one per row (``V_PER_ROW``: ``[R]`` pointers).
    ``s_rows`` points at each fp8 row's scale, applied once after the K loop. With ``FILL`` each row
    that ``fill_ok`` marks is also stored as loaded at ``f_rows`` (scale at ``fs_rows``).
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
def _up_decode_kernel(x_ptr, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, ss_s, ss_n, F, K, stride_x,
                      hw_ptr, hs_ptr, row_base, fill_row, TOP_K: tl.constexpr, FMT: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HOST: tl.constexpr, FILL: tl.constexpr):
    pair = tl.program_id(0)
    # BLOCK_N gate rows then the matching up rows (F further on): both stream through one K loop.
    r = tl.arange(0, 2 * BLOCK_N)                                       # [2BN]
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N
    rows = n + (r // BLOCK_N) * F
    e = tl.load(ids_ptr + pair)
    slot = tl.load(slot_ptr + e).to(tl.int64)                           # int64: pools exceed 2 GiB
    key = (row_base + e).to(tl.int64)
    w_rows = _expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + rows * sw_n
    s_rows = _expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + rows * ss_n
    fill = _fill_of(fill_row, e, slot, FILL)
    f_rows = _fill_ptr(w_ptr, fill, sw_s, FILL) + rows * sw_n
    fs_rows = _fill_ptr(s_ptr, fill, ss_s, FILL) + rows * ss_n
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    gu = _rows_dot(x_row, w_rows, s_rows, n < F, K, FMT, 2 * BLOCK_N, BLOCK_K, False, f_rows, fs_rows,
                   (fill + 0 * rows) >= 0, FILL)
    gu = tl.reshape(gu, (2, BLOCK_N))                                   # [2, BN]: gate row, up row
    half = tl.arange(0, 2)[:, None]
    gate = tl.sum(tl.where(half == 0, gu, 0.0), axis=0)                 # [BN]
    up = tl.sum(tl.where(half == 1, gu, 0.0), axis=0)
    h = gate / (1.0 + tl.exp(-gate)) * up
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + pair.to(tl.int64) * F + cols, h.to(h_ptr.dtype.element_ty), mask=cols < F)


@jit
def _down_decode_kernel(h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n, s_ptr, ss_s, ss_n, D, F,
                        stride_o, hw_ptr, hs_ptr, row_base, fill_row, TOP_K: tl.constexpr, KP: tl.constexpr,
                        FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HOST: tl.constexpr,
                        FILL: tl.constexpr):
    tok = tl.program_id(0)
    r = tl.arange(0, KP * BLOCK_N)                                      # [R] row r: expert r // BN
    j = r // BLOCK_N
    n = tl.program_id(1) * BLOCK_N + r % BLOCK_N                        # [R] hidden row of w2
    j_ok = j < TOP_K                                                    # KP pads k to a power of two
    pair = tok * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j_ok, other=0)
    slot = tl.load(slot_ptr + e, mask=j_ok, other=0).to(tl.int64)
    key = (row_base + e).to(tl.int64)
    w_rows = _expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + n * sw_n
    s_rows = _expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + n * ss_n
    fill = _fill_of(fill_row, e, slot, FILL)
    y = _rows_dot(h_ptr + pair.to(tl.int64) * F, w_rows, s_rows, j_ok & (n < D), F, FMT, KP * BLOCK_N,
                  BLOCK_K, True, _fill_ptr(w_ptr, fill, sw_s, FILL) + n * sw_n,
                  _fill_ptr(s_ptr, fill, ss_s, FILL) + n * ss_n, j_ok & (fill >= 0), FILL)  # [R]
    y = y * tl.load(tw_ptr + pair, mask=j_ok, other=0.0).to(tl.float32)  # routing weight
    acc = tl.sum(tl.reshape(y, (KP, BLOCK_N)), axis=0)                  # [BN]: fixed-order sum over k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < D)


@jit
def _pair_vectors(v_ptr, idx, p: tl.constexpr, mask, quarter):
    """Elements ``8 idx + 2p`` and ``8 idx + 2p + 1`` of a vector (for nibbles ``2p`` and ``2p + 1`` of
    weight words ``idx``) as two float32 tensors shaped like ``idx``.

    The vector is float32 stored nibble-major, element ``n`` at ``(n % 8) * quarter + n // 8`` (``x``
    as :func:`_x_prep_kernel` writes it, ``h`` as the up kernel does), so each nibble's slice is
    contiguous and read in 16-byte loads in the weights' own layout.
    """
    ve = tl.load(v_ptr + (2 * p) * quarter + idx, mask=mask, other=0.0)
    vo = tl.load(v_ptr + (2 * p + 1) * quarter + idx, mask=mask, other=0.0)
    return ve, vo


@jit
def _nibble_floats(w, S: tl.constexpr, one):
    """Nibble ``S`` of every int32 word ``w`` as the float ``1 + q/16``: one shift and one and-or.

    The nibble lands in the top mantissa bits (19..22) under the exponent of 1.0 (``one``, the bits of
    1.0 passed at run time: with one immediate mask and one register the and-or is a single LOP3);
    the mask also drops the sign bits an arithmetic right shift brings in."""
    if 4 * S <= 19:
        b = (w << (19 - 4 * S)) & (15 << 19)
    else:
        b = (w >> (4 * S - 19)) & (15 << 19)
    return (b | one).to(tl.float32, bitcast=True)


@jit
def _group_mask(g, groups, NG: tl.constexpr, EVEN_K: tl.constexpr):
    # Whole groups are valid or not (K is a multiple of G), so the mask is constant along a group's
    # words and never splits a 16-byte load; a constant one when the tiles divide K.
    if EVEN_K:
        return tl.full([NG, 1, 1, 1], 1, tl.int1)
    return g < groups


@jit
def _int4_group_dots(w, v_ptr, idx, v_ok, quarter, sc, zp, one, sx_rows=None, g=None, g_ok=None,
                     SX: tl.constexpr = False):
    """``[A, B]`` float32: packed rows ``w [NG, A, B, G/8]`` (int32 words) dotted with the vector.

    Word ``i`` holds elements ``8i .. 8i + 7``, element ``8i + s`` in bits ``4s .. 4s + 3``. Each nibble
    position is one pass over the tile (shift, and-or, FMA per element) against the vector elements
    ``8 idx + s``. Per group ``sum_k (1 + q_k/16) x_k = sx + sqx/16`` with ``sx = sum_k x_k``, so
    ``sum_k (q_k - z) s x_k = s (16 sum_k v_k x_k - (16 + z) sx)``: scale and zero once per group.
    ``SX``: the group sums are read (``sx_rows + g``, groups ``g`` where ``g_ok``), not summed here.
    """
    acc = tl.zeros(w.shape, dtype=tl.float32)                           # [NG, A, B, GW]
    sx = tl.zeros(idx.shape, dtype=tl.float32)                          # [NG, 1 or A, 1, GW]
    for p in tl.static_range(4):
        ve, vo = _pair_vectors(v_ptr, idx, p, v_ok, quarter)
        acc += _nibble_floats(w, 2 * p, one) * ve
        acc += _nibble_floats(w, 2 * p + 1, one) * vo
        if not SX:
            sx += ve + vo
    dot = tl.sum(acc, axis=3, keep_dims=True)                           # [NG, A, B, 1]
    if SX:
        sxg = tl.load(sx_rows + g, mask=g_ok, other=0.0)                # [NG, 1, 1, 1]
    else:
        sxg = tl.sum(sx, axis=3, keep_dims=True)
    return tl.sum(tl.sum(sc * (16.0 * dot - (16.0 + zp) * sxg), axis=3), axis=0)  # [A, B]


@jit
def _int4_chunk(k0, w_rows, s_rows, z_rows, row_ok, word, grp, K, G: tl.constexpr, NG: tl.constexpr,
                EVEN_K: tl.constexpr, fills=None, fill_ok=None, FILL: tl.constexpr = False):
    """Words, scales and zero points of the K chunk at ``k0`` of packed rows; and the word indices and
    group mask the dot needs. Rows broadcast against ``word [NG, 1, 1, GW]`` and ``grp [NG, 1, 1, 1]``.
    With ``FILL`` the rows ``fill_ok`` marks are also stored as loaded at ``fills`` (words, scale and
    zero point row pointers)."""
    idx = k0 // 8 + word                                                # [NG, 1, 1, GW] word index
    g = k0 // G + grp                                                   # [NG, 1, 1, 1]
    g_in = _group_mask(g, K // G, NG, EVEN_K)
    w = tl.load(w_rows + idx, mask=row_ok & g_in, other=0)              # [NG, A, B, GW]
    g_ok = row_ok & (g < K // G)
    sc = tl.load(s_rows + g, mask=g_ok, other=0.0)                      # [NG, A, B, 1]
    zp = tl.load(z_rows + g, mask=g_ok, other=0)
    if FILL:
        tl.store(fills[0] + idx, w, mask=row_ok & g_in & fill_ok)
        tl.store(fills[1] + g, sc, mask=g_ok & fill_ok)
        tl.store(fills[2] + g, zp, mask=g_ok & fill_ok)
    return w, sc.to(tl.float32), zp.to(tl.float32), idx, g_in


@jit
def _x_prep_kernel(x_ptr, stride_x, xn_ptr, sx_ptr, K, K8, G: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    """Row ``t`` of ``x`` as float32, nibble-major (element ``n`` at ``(n % 8) * K/8 + n // 8``), and its
    sums over each group of ``G``: what every up program would otherwise gather and add up itself."""
    t = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    n = tl.arange(0, BLOCK)
    ok = n < K
    x = tl.load(x_ptr + t * stride_x + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(xn_ptr + t * K + (n % 8) * K8 + n // 8, x, mask=ok)
    gi = tl.arange(0, BLOCK // G)
    tl.store(sx_ptr + t * (K // G) + gi, tl.sum(tl.reshape(x, (BLOCK // G, G)), axis=1), mask=gi < K // G)


@jit
def _up_int4_kernel(xv_ptr, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr, ss_s, sz_s, ss_n,
                    sx_ptr, F, K, K8, one, hw_ptr, hs_ptr, hz_ptr, row_base, fill_row, TOP_K: tl.constexpr,
                    ROUND: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, PDL: tl.constexpr, HOST: tl.constexpr, FILL: tl.constexpr):
    """``h`` of pair ``program_id(0)``, outputs ``program_id(1) * BN ..``: the gate and up rows of one
    expert, SiLU·mul.

    ``x`` comes from :func:`_x_prep_kernel`: float32 nibble-major rows of ``K`` (``K8 = K / 8``) and
    their group sums at ``sx_ptr``, so its loads are contiguous and no program redoes the sums.

    ``PDL``: launched as a programmatic dependent (its launch overlaps the previous kernel), it waits
    for the previous kernel before reading anything: the routing ids and ``x`` may be its output.

    Tile [NG, 2, BN, GW]: NG groups of GW int32 words along K of the gate and up rows of BN outputs.
    Groups outermost: Triton spreads threads over the words of a group, then over rows, and warps
    over gate/up and rows; a thread holds its words in every group of the chunk. (Rows outermost
    would let a thread's vector loads serve several rows, but then Triton gives the vector, scale and
    tile loads different layouts and moves them through shared memory: slower on the H200.)"""
    GW: tl.constexpr = G // 8
    NG: tl.constexpr = BLOCK_K // G
    pair, nb = tl.program_id(0), tl.program_id(1)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :, None]                 # [1, 1, BN, 1]
    rows = n + tl.arange(0, 2)[None, :, None, None] * F                           # [1, 2, BN, 1]
    row_ok = n < F
    grp = tl.arange(0, NG)[:, None, None, None]                                    # [NG, 1, 1, 1]
    word = grp * GW + tl.arange(0, GW)[None, None, None, :]                        # [NG, 1, 1, GW]
    if PDL:
        gdc_wait()
        gdc_launch_dependents()  # the down kernel may launch: every up program is past its wait
    e = tl.load(ids_ptr + pair)
    slot = tl.load(slot_ptr + e).to(tl.int64)                           # int64: pools exceed 2 GiB
    key = (row_base + e).to(tl.int64)
    w_rows = _expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + rows * sw_n
    s_rows = _expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + rows * ss_n
    z_rows = _expert_ptr(z_ptr, hz_ptr, slot, key, sz_s, HOST) + rows * ss_n
    fill = _fill_of(fill_row, e, slot, FILL)
    fills = (_fill_ptr(w_ptr, fill, sw_s, FILL) + rows * sw_n, _fill_ptr(s_ptr, fill, ss_s, FILL) + rows * ss_n,
             _fill_ptr(z_ptr, fill, sz_s, FILL) + rows * ss_n)
    tok = (pair // TOP_K).to(tl.int64)
    x_row = xv_ptr + tok * K
    sx_row = sx_ptr + tok * (K // G)
    acc = tl.zeros([2, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w, sc, zp, idx, g_in = _int4_chunk(k0, w_rows, s_rows, z_rows, row_ok, word, grp, K, G, NG, EVEN_K,
                                           fills, (fill + 0 * rows) >= 0, FILL)
        g = k0 // G + grp
        acc += _int4_group_dots(w, x_row, idx, g_in, K8, sc, zp, one, sx_row, g, g < K // G, True)  # [2, BN]
    half = tl.arange(0, 2)[:, None]
    gate = tl.sum(tl.where(half == 0, acc, 0.0), axis=0)                # [BN]
    up = tl.sum(tl.where(half == 1, acc, 0.0), axis=0)
    h = gate / (1.0 + tl.exp(-gate)) * up
    if ROUND == 1:  # the activations' precision, as the reference keeps h
        h = h.to(tl.bfloat16).to(tl.float32)
    elif ROUND == 2:
        h = h.to(tl.float16).to(tl.float32)
    cols = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    # Nibble-major store: the down kernel reads the vector of each nibble position contiguously.
    tl.store(h_ptr + pair.to(tl.int64) * F + (cols % 8) * (F // 8) + cols // 8, h, mask=cols < F)


@jit
def _down_int4_kernel(h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr,
                      ss_s, sz_s, ss_n, D, F, F8, stride_o, one, hw_ptr, hs_ptr, hz_ptr, row_base, fill_row,
                      TOP_K: tl.constexpr, KP: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr, HOST: tl.constexpr,
                      FILL: tl.constexpr):
    # Tile [NG, KP, BN, GW]: BN rows of w2 of each of the token's k experts, groups outermost as in
    # the up kernel. h [NG, KP, 1, GW] is as large as the tile's words spread over the threads when
    # BLOCK_K >= 128 * num_warps, and then each thread's h values serve all its BN rows. F8 = F / 8 is
    # an argument of its own so that Triton sees its divisibility and reads h in 16-byte loads.
    GW: tl.constexpr = G // 8
    NG: tl.constexpr = BLOCK_K // G
    tok, db = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, KP)[None, :, None, None]                           # [1, KP, 1, 1]
    n = db * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :, None]       # [1, 1, BN, 1]
    j_ok = j < TOP_K                                                    # KP pads k to a power of two
    pair = tok * TOP_K + j
    e = tl.load(ids_ptr + pair, mask=j_ok, other=0)
    slot = tl.load(slot_ptr + e, mask=j_ok, other=0).to(tl.int64)
    key = (row_base + e).to(tl.int64)
    row_ok = j_ok & (n < D)                                             # [1, KP, BN, 1]
    w_rows = _expert_ptr(w_ptr, hw_ptr, slot, key, sw_s, HOST) + n * sw_n
    s_rows = _expert_ptr(s_ptr, hs_ptr, slot, key, ss_s, HOST) + n * ss_n
    z_rows = _expert_ptr(z_ptr, hz_ptr, slot, key, sz_s, HOST) + n * ss_n
    fill = _fill_of(fill_row, e, slot, FILL)                            # [1, KP, 1, 1]
    fills = (_fill_ptr(w_ptr, fill, sw_s, FILL) + n * sw_n, _fill_ptr(s_ptr, fill, ss_s, FILL) + n * ss_n,
             _fill_ptr(z_ptr, fill, sz_s, FILL) + n * ss_n)
    fill_ok = j_ok & (fill >= 0)
    h_row = h_ptr + pair.to(tl.int64) * F                               # [1, KP, 1, 1]
    grp = tl.arange(0, NG)[:, None, None, None]                         # [NG, 1, 1, 1]
    word = grp * GW + tl.arange(0, GW)[None, None, None, :]             # [NG, 1, 1, GW]
    # PDL: launched once every up program has passed its own wait (so the routing ids and the slot
    # table are final), while the up kernel runs; the first chunk of w2 is requested, then the wait
    # for h.
    w, sc, zp, idx, g_in = _int4_chunk(0, w_rows, s_rows, z_rows, row_ok, word, grp, F, G, NG, EVEN_K, fills,
                                       fill_ok, FILL)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    acc = _int4_group_dots(w, h_row, idx, j_ok & g_in, F8, sc, zp, one)  # [KP, BN]
    for k0 in range(BLOCK_K, F, BLOCK_K):
        w, sc, zp, idx, g_in = _int4_chunk(k0, w_rows, s_rows, z_rows, row_ok, word, grp, F, G, NG, EVEN_K,
                                           fills, fill_ok, FILL)
        acc += _int4_group_dots(w, h_row, idx, j_ok & g_in, F8, sc, zp, one)  # [KP, BN]
    tw = tl.load(tw_ptr + tok * TOP_K + tl.arange(0, KP), mask=tl.arange(0, KP) < TOP_K, other=0.0)
    y = tl.sum(acc * tw.to(tl.float32)[:, None], axis=0)                # [BN]: fixed-order sum over k
    cols = db * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + tok.to(tl.int64) * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=cols < D)


_ONE_BITS = 0x3F800000  # float32 1.0; a kernel argument, not a literal (see _nibble_floats)


def _block_k(tile: TileConfig, fmt: int, group: int, k: int) -> int:
    # No wider than K needs; int4 tiles hold whole groups. Triton needs powers of two.
    bk = min(tile.block_k, next_pow2(k))
    return max(bk, group) // group * group if fmt == FMT_INT4 else bk


def _int4_word_args(m: PoolMatrix, name: str) -> tuple:
    """``m.args()`` with the packed bytes as int32 words ``[S, N, K/8]`` (strides in words).

    The expert layout starts every tensor and slot on 256 bytes and K is a multiple of the group size
    (at least 32), so rows start on 16 bytes: whole-word and 16-byte loads."""
    w = m.w
    if m.k % 8 or w.data_ptr() % 16 or w.stride(0) % 16 or w.stride(1) % 16:
        raise ValueError(f"int4 pool view {name} must have rows of a multiple of 8 elements starting on "
                         f"16-byte boundaries (as ExpertLayout places them); got K = {m.k}, address "
                         f"{w.data_ptr()} and byte strides {w.stride()[:2]}")
    words = w.view(torch.int32)                                          # [S, N, K/8]
    return (words, words.stride(0), words.stride(1), *m.args()[3:])


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: a Hopper-or-later GPU and a Triton that exposes it."""
    return (device.type == "cuda" and gdc_wait is not None
            and torch.cuda.get_device_capability(device)[0] >= 9)


def _host_args(host: HostMatrices | None, m: PoolMatrix, which: int, int4: bool) -> tuple:
    """Pointer arguments of the host store's copy of matrix ``which`` (0: w13, 1: w2), the layer's
    first store row and its fill row; without ``host`` (or fill row) the pool's own pointers stand in
    (never dereferenced)."""
    h = m if host is None else host[which]
    w = _int4_word_args(h, "host")[0] if int4 else h.w
    base = 0 if host is None else host[2]
    fill = m.w if host is None or host[3] is None else host[3]
    return (w, h.scale, h.zero, base, fill) if int4 else (w, h.scale, base, fill)


def _fills(host: HostMatrices | None) -> bool:
    return host is not None and host[3] is not None


def _moe_decode_int4(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, slots: torch.Tensor,
                     w13: PoolMatrix, w2: PoolMatrix, group: int, up: TileConfig,
                     down: TileConfig, pdl: bool = False, host: HostMatrices | None = None) -> torch.Tensor:
    t, d = x.shape
    k = ids.shape[1]
    f = w13.n // 2
    launch = {"launch_pdl": True} if pdl else {}    # only Triton versions with PDL know the option
    w, sw_s, sw_n, *rest = _int4_word_args(w13, "w13")
    xn = torch.empty(t, d, dtype=torch.float32, device=x.device)       # [T, D]: nibble-major
    sx = torch.empty(t, d // group, dtype=torch.float32, device=x.device)
    h = torch.empty(t * k, f, dtype=torch.float32, device=x.device)    # [P, F]: nibble-major
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    _x_prep_kernel[(t,)](x, x.stride(0), xn, sx, d, d // 8, G=group, BLOCK=max(next_pow2(d), group), PDL=pdl,
                         **launch)
    bk = _block_k(up, FMT_INT4, group, d)
    _up_int4_kernel[(t * k, cdiv(f, up.block_n))](
        xn, ids, slots, h, w, sw_s, sw_n, *rest, sx, f, d, d // 8, _ONE_BITS, *_host_args(host, w13, 0, True),
        TOP_K=k, ROUND={torch.bfloat16: 1, torch.float16: 2}.get(x.dtype, 0), G=group, BLOCK_N=up.block_n,
        BLOCK_K=bk, EVEN_K=d % bk == 0, PDL=pdl, HOST=host is not None, FILL=_fills(host), num_warps=up.num_warps,
        num_stages=up.num_stages, **launch)
    w, sw_s, sw_n, *rest = _int4_word_args(w2, "w2")
    bk = _block_k(down, FMT_INT4, group, f)
    _down_int4_kernel[(t, cdiv(d, down.block_n))](
        h, ids, slots, tw, out, w, sw_s, sw_n, *rest, d, f, f // 8, out.stride(0), _ONE_BITS,
        *_host_args(host, w2, 1, True), TOP_K=k, KP=next_pow2(k), G=group, BLOCK_N=down.block_n, BLOCK_K=bk,
        EVEN_K=f % bk == 0, PDL=pdl, HOST=host is not None, FILL=_fills(host), num_warps=down.num_warps,
        num_stages=down.num_stages, **launch)
    return out


def moe_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               slot_of_expert: torch.Tensor, w13: PoolMatrix, w2: PoolMatrix, fmt: int, group: int,
               up: TileConfig, down: TileConfig, pdl: bool = False,
               host: HostMatrices | None = None) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype``: the MoE output, summed over each token's k experts.

    ``host`` (``(w13, w2, row_base)`` over the mapped host store): an expert whose slot is -1 is read
    from store row ``row_base + expert`` instead of the pool (see :func:`_expert_ptr`).

    ``pdl`` (int4; see :func:`pdl_supported`) launches both kernels as programmatic dependents: the
    up kernel's launch overlaps the previous kernel, the down kernel's the up kernel, and the down
    kernel requests its first chunk of w2 before it waits for ``h``.

    int4 group sizes are 32, 64 or 128 (:func:`engine.quant.int4.check_group_size`): powers of two of
    at least four int32 words (16 bytes), as the kernels' group tiles need."""
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    if fmt == FMT_INT4:
        return _moe_decode_int4(x, ids, tw, slot_of_expert, w13, w2, group, up, down, pdl, host)
    t, d = x.shape
    k = topk_ids.shape[1]
    f = w13.n // 2
    h = torch.empty(t * k, f, dtype=x.dtype, device=x.device)          # [P, F]
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    w, sw_s, sw_n, s, _, ss_s, _, ss_n = w13.args()
    _up_decode_kernel[(t * k, cdiv(f, up.block_n))](
        x, ids, slot_of_expert, h, w, sw_s, sw_n, s, ss_s, ss_n, f, d, x.stride(0), *_host_args(host, w13, 0, False),
        TOP_K=k, FMT=fmt, BLOCK_N=up.block_n, BLOCK_K=_block_k(up, fmt, group, d), HOST=host is not None,
        FILL=_fills(host), num_warps=up.num_warps, num_stages=up.num_stages)
    w, sw_s, sw_n, s, _, ss_s, _, ss_n = w2.args()
    _down_decode_kernel[(t, cdiv(d, down.block_n))](
        h, ids, slot_of_expert, tw, out, w, sw_s, sw_n, s, ss_s, ss_n, d, f, out.stride(0),
        *_host_args(host, w2, 1, False), TOP_K=k, KP=next_pow2(k), FMT=fmt, BLOCK_N=down.block_n,
        BLOCK_K=_block_k(down, fmt, group, f), HOST=host is not None, FILL=_fills(host), num_warps=down.num_warps,
        num_stages=down.num_stages)
    return out
