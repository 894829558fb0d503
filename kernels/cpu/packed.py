"""4-bit experts (int4, mxfp4) on the CPU in integer arithmetic: the weights' codes against 16-bit
activations.

The float path (:mod:`kernels.cpu.dots`) widens every code to float32 and multiplies it into a float
accumulator: four vector instructions per eight weights on ports the multiply-adds also need, which
kept int4 at a quarter of one core's memory bandwidth and mxfp4 at a sixth. Here each activation
vector is quantised once per call to 16-bit fixed point with one scale per group (as the GPU's 4-bit
decode kernels do), held as two signed bytes, and :mod:`kernels.cpu.idot`'s loops split bytes of
packed codes into their nibbles and multiply them with ``pmaddubsw``-style instructions. A group's
integer sum is exact; it becomes float once:

    int4:  sum over the group of w * x = s_w * s_x * sum((code - zero) * q)
    mxfp4: sum over the group of w * x = 2**(e - 127) / 2 * s_x * sum(2v * q)

(``s_w``, ``zero``: the row's group scale and zero point; ``e``: mxfp4's group exponent and ``2v`` its
code's value doubled, an integer; ``s_x``, ``q``: the activations' group scale and 16-bit values).
mxfp4's codes are read as ``2v + 12`` (unsigned bytes), so both formats subtract an offset (``zero``,
or 12) times a sum of ``q``, in integers, for every 8 weights: each such partial sum stays exact.
:mod:`kernels.cpu.idot` computes a whole row per call; two tokens that use one expert share each
unpacking of its weights.

The passes mirror :mod:`kernels.cpu.driver` (gate/up into ``a [P, F]``, then down with one writer per
output column); the dot products differ, gate/up's threads take their blocks from a shared counter and
down's each take one equal run of the output columns.

Legend: T tokens, P (expert, token) pairs, D hidden, F expert FFN, G group size, K reduction dim.
"""
from __future__ import annotations


import numpy as np
from numba import njit, prange

from kernels.cpu.bits import fetch_add
from kernels.cpu.dots import INT4, MXFP4, ROWS, act
from kernels.cpu.idot import (LOW_RANGE, e2m1_row1, e2m1_row2, u4g32_row1, u4g32_row2, u4g64_row1, u4g64_row2,
                              u4g128_row1, u4g128_row2)

Q_MAX = np.float32(127.0)      # activations: two signed bytes per value, high * LOW + low
LOW = np.float32(LOW_RANGE)
TINY = np.float32(1e-30)       # a group below this is zeros (its step, 1/127 of it, would be subnormal)
EXP_BITS = np.uint32(0x7F800000)   # a float32's exponent: all ones in a NaN or an infinity
GROUPS = (32, 64, 128)         # the int4 group sizes the integer path reads
U = np.uint64


def supports(fmt: int, group: int, os13: int, os2: int) -> str | None:
    """Why the integer path cannot read this layout, or None when it can: it reads mxfp4 and int4 in
    groups of 32, 64 or 128 (every group size int4 has), with int4's fp16 scales at even byte offsets
    (every layout's, aligned to 256)."""
    if fmt == INT4 and group not in GROUPS:
        return f"int4 groups of {group} (the CPU kernels read groups of {', '.join(map(str, GROUPS))})"
    if fmt == INT4 and (os13 | os2) % 2:
        return "scales at an odd byte offset"
    return None


@njit(fastmath=True, error_model="numpy", parallel=True, cache=True)
def quantize_rows(v, group, q, s, qs, bad):
    """Each row of ``v [N, K]`` float32 as 16-bit fixed point with one scale per group of ``group``,
    each value ``high * 254 + low`` in two signed bytes: ``q [N, 2K]`` int8, the high bytes in
    ``q[:, :K]`` and the low ones in ``q[:, K:]``, each in two phases (``q[i, p * K/2 + m]`` is element
    ``2m + p``); ``s [N, K/G]`` float32, the scale of one unit of ``high * 254 + low``, and
    ``qs [N, K/8]`` int32 the sums of those units over each run of 8 elements. A group whose largest value is below
    :data:`TINY` (1/127 of it would not be a normal float) is all zeros. ``bad [N]`` is set where a row
    holds a NaN or an infinity (its group is zeroed: the caller makes what the row feeds NaN, as float
    arithmetic would).

    One work item per (row, group), in parallel; :func:`quantize_rows_serial` is the same on the
    calling thread, for a few rows, where entering a parallel region costs more than the work."""
    k = v.shape[1]
    ng = k // group
    for i in range(v.shape[0]):
        bad[i] = False
    for item in prange(v.shape[0] * ng):
        quantize_group(v, item // ng, item % ng, group, q, s, qs, bad)


@njit(fastmath=True, error_model="numpy", cache=True)
def quantize_rows_serial(v, group, q, s, qs, bad):
    """:func:`quantize_rows` on the calling thread."""
    for i in range(v.shape[0]):
        bad[i] = False
        for g in range(v.shape[1] // group):
            quantize_group(v, i, g, group, q, s, qs, bad)


@njit(fastmath=True, error_model="numpy", cache=True)
def quantize_group(v, i, g, group, q, s, qs, bad):
    """Group ``g`` of row ``i`` (:func:`quantize_rows`): the group's even elements go to phase 0 and
    its odd ones to phase 1, each phase one loop over contiguous bytes (loops the compiler turns into
    vector code: a loop writing the four planes at once did not vectorise and took 5 ns a value)."""
    k = v.shape[1]
    k2 = k // 2
    lo, n, p0 = g * group, group, g * group // 2
    row = v[i]
    bits = row.view(np.uint32)          # NaN and infinity tested on the bits: fastmath may assume neither
    m = np.float32(0.0)
    e = np.uint32(0)
    for j in range(lo, lo + n):
        m = max(m, abs(row[j]))
        e = max(e, bits[j] & EXP_BITS)
    h0, h1 = q[i, p0:p0 + n // 2], q[i, k2 + p0:k2 + p0 + n // 2]
    l0, l1 = q[i, k + p0:k + p0 + n // 2], q[i, k + k2 + p0:k + k2 + p0 + n // 2]
    sums = qs[i, lo // 8:(lo + n) // 8]
    if e == EXP_BITS or m < TINY:
        if e == EXP_BITS:
            bad[i] = True
        s[i, g] = np.float32(0.0)
        sums[:] = 0
        h0[:] = 0
        h1[:] = 0
        l0[:] = 0
        l1[:] = 0
        return
    sc = m / Q_MAX                                                      # one step of the high byte
    inv = np.float32(1.0) / sc
    for ph in range(2):
        hd, ld = (h0, l0) if ph == 0 else (h1, l1)
        src = row[lo + ph:lo + n:2]
        for p in range(n // 2):
            a = src[p] * inv
            ha = min(max(np.floor(a + np.float32(0.5)), -Q_MAX), Q_MAX)
            # the remainder is exact in float32 (a and its rounding are close); its 254 steps in float64
            la = min(max(np.floor(np.float64(a - ha) * 254.0 + 0.5), -127.0), 127.0)
            hd[p] = np.int8(ha)
            ld[p] = np.int8(la)
    for j8 in range(n // 8):                                            # 8 values: pairs 4 j8 .. 4 j8 + 3
        t = np.int32(0)
        for u in range(4 * j8, 4 * j8 + 4):
            t += (np.int32(h0[u]) + np.int32(h1[u])) * np.int32(LOW_RANGE) + np.int32(l0[u]) + np.int32(l1[u])
        sums[j8] = t
    s[i, g] = sc / LOW


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _args(fmt, ow, osc, oz, n, k, group):
    """Row ``n`` of the matrix at byte ``ow``: its first byte, its first scale (int4: in halves;
    mxfp4: in bytes), its first zero point (bytes), the half row length and the group count."""
    ng = U(k // group)
    sc = U(osc) + U(n) * ng if fmt == MXFP4 else U(osc >> 1) + U(n) * ng
    return U(ow) + U(n) * U(k // 2), sc, U(oz) + U(n) * ng, U(k // 2), ng


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def row1(fmt, b, h, r, ow, osc, oz, n, k, group, q, s, qs, t):
    """Row ``n`` of a 4-bit matrix dotted with token row ``t`` of the quantised activations."""
    o, sc, z, k2, ng = _args(fmt, ow, osc, oz, n, k, group)
    r, t = U(r), U(t)
    if fmt == MXFP4:
        return e2m1_row1(b, h, r, o, sc, z, q, s, qs, t, k2, ng)
    if group == 128:
        return u4g128_row1(b, h, r, o, sc, z, q, s, qs, t, k2, ng)
    if group == 64:
        return u4g64_row1(b, h, r, o, sc, z, q, s, qs, t, k2, ng)
    return u4g32_row1(b, h, r, o, sc, z, q, s, qs, t, k2, ng)


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def row2(fmt, b, h, r, ow, osc, oz, n, k, group, q, s, qs, t0, t1):
    """:func:`row1` for two token rows, one unpacking of the weights."""
    o, sc, z, k2, ng = _args(fmt, ow, osc, oz, n, k, group)
    r, t0, t1 = U(r), U(t0), U(t1)
    if fmt == MXFP4:
        return e2m1_row2(b, h, r, o, sc, z, q, s, qs, t0, t1, k2, ng)
    if group == 128:
        return u4g128_row2(b, h, r, o, sc, z, q, s, qs, t0, t1, k2, ng)
    if group == 64:
        return u4g64_row2(b, h, r, o, sc, z, q, s, qs, t0, t1, k2, ng)
    return u4g32_row2(b, h, r, o, sc, z, q, s, qs, t0, t1, k2, ng)


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _bias(f, r, ob, i):
    return f[r, (ob >> 2) + i] if ob >= 0 else np.float32(0.0)


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _pair_act(f, r, ob, n, f_, kind, alpha, limit, g, u, a, p):
    a[p, n] = act(g + _bias(f, r, ob, n), u + _bias(f, r, ob, f_ + n), kind, alpha, limit)


@njit(fastmath=True, error_model="numpy", cache=True)
def _gate_up_item(fmt, b, h, f, d_, f_, grp, ow, osc, oz, ob, kind, alpha, limit, r, lo, hi, n0, n1, toks, q, s, qs,
                  a):
    """Gate and up rows ``n0:n1`` of store row ``r`` for pairs ``lo:hi``: one work item of :func:`gate_up`."""
    for n in range(n0, n1):
        p = lo
        while p + 2 <= hi:
            g0, g1 = row2(fmt, b, h, r, ow, osc, oz, n, d_, grp, q, s, qs, toks[p], toks[p + 1])
            u0, u1 = row2(fmt, b, h, r, ow, osc, oz, f_ + n, d_, grp, q, s, qs, toks[p], toks[p + 1])
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g0, u0, a, p)
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g1, u1, a, p + 1)
            p += 2
        if p < hi:
            g0 = row1(fmt, b, h, r, ow, osc, oz, n, d_, grp, q, s, qs, toks[p])
            u0 = row1(fmt, b, h, r, ow, osc, oz, f_ + n, d_, grp, q, s, qs, toks[p])
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g0, u0, a, p)


@njit(fastmath=True, error_model="numpy", parallel=True, cache=True)
def gate_up(fmt, b, h, f, d_, f_, grp, ow, osc, oz, ob, kind, alpha, limit, rows, starts, toks, q, s, qs, a, qa, sa,
            qsa, bad_a, nt):
    """Pass 1: ``a [P, F]`` = act(gate, up) of every pair, from the quantised tokens ``q``/``s``, and
    ``a`` quantised as :func:`quantize_rows` would (``qa``, ``sa``, ``qsa``, ``bad_a``).

    Work items are blocks of ``ROWS`` rows of one expert, taken in turn by every thread from a shared
    counter, so that no thread waits at the end for work a static split gave another (a one-token
    call of a top-8 model has a few hundred items; 15 threads split them unevenly when each takes a
    fixed share). The block that completes a group of ``grp`` rows (the last of its blocks to arrive)
    quantises that group's activations, so the quantisation needs no parallel region of its own."""
    nb = f_ // ROWS                      # ROWS divides every group size, and so the expert FFN
    ng = f_ // grp
    per_group = grp // ROWS
    items = rows.size * nb
    for p in range(toks.size):
        bad_a[p] = False
    taken = np.zeros(1, np.int64)
    arrived = np.zeros(rows.size * ng, np.int64)
    for _ in prange(nt):                 # one worker a thread (``nt``: the call's thread count)
        item = fetch_add(taken, 0, 1)
        while item < items:
            i, n0 = item // nb, item % nb * ROWS
            lo, hi = starts[i], starts[i + 1]
            _gate_up_item(fmt, b, h, f, d_, f_, grp, ow, osc, oz, ob, kind, alpha, limit, rows[i], lo, hi, n0,
                          n0 + ROWS, toks, q, s, qs, a)
            g = n0 // grp
            if fetch_add(arrived, i * ng + g, 1) == per_group - 1:      # the group's last block: all of it is in
                for p in range(lo, hi):
                    quantize_group(a, p, g, grp, qa, sa, qsa, bad_a)
            item = fetch_add(taken, 0, 1)


@njit(fastmath=True, error_model="numpy", cache=True)
def _down_item(fmt, b, h, f, d_, f_, grp, ow, osc, oz, ob, rows, starts, d0, d1, toks, wts, q, s, qs, out):
    """Down rows ``d0:d1`` of every expert, added into ``out``: one work item of :func:`down`."""
    for i in range(rows.size):
        r, lo, hi = rows[i], starts[i], starts[i + 1]
        for dd in range(d0, d1):
            bias = _bias(f, r, ob, dd)
            p = lo
            while p + 2 <= hi:
                y0, y1 = row2(fmt, b, h, r, ow, osc, oz, dd, f_, grp, q, s, qs, p, p + 1)
                out[toks[p], dd] += wts[p] * (y0 + bias)
                out[toks[p + 1], dd] += wts[p + 1] * (y1 + bias)
                p += 2
            if p < hi:
                y0 = row1(fmt, b, h, r, ow, osc, oz, dd, f_, grp, q, s, qs, p)
                out[toks[p], dd] += wts[p] * (y0 + bias)


@njit(fastmath=True, error_model="numpy", parallel=True, cache=True)
def down(fmt, b, h, f, d_, f_, grp, ow, osc, oz, ob, rows, starts, toks, wts, q, s, qs, out, nt):
    """Pass 2: ``out[t, d] += w * (w2[d] . a[p] + b2[d])`` over every pair (``q``/``s``: ``a``
    quantised, one row per pair), one writer per ``d``. Each thread takes one equal run of the output
    rows (a multiple of 8), read expert by expert: long runs for the prefetchers, and no thread with
    more rows than another (fixed blocks of 64 gave 15 threads three rounds where 16 take two). ``nt``:
    the call's thread count (numba.get_num_threads() inside compiled code would keep it from the
    on-disk cache)."""
    per = ((d_ + nt - 1) // nt + 7) // 8 * 8
    for t in prange(nt):
        d0 = t * per
        if d0 < d_:
            _down_item(fmt, b, h, f, d_, f_, grp, ow, osc, oz, ob, rows, starts, d0, min(d_, d0 + per), toks, wts,
                       q, s, qs, out)


DOWN_ROWS = 128     # output rows of one down item of :func:`gate_up_down` (a multiple of 8)


@njit(fastmath=True, error_model="numpy", parallel=True, cache=True)
def gate_up_down(fmt, b, h, f, d_, f_, grp, ow13, os13, oz13, ob13, kind, alpha, limit, ow2, os2, oz2, ob2, rows,
                 starts, toks, wts, q, s, qs, a, qa, sa, qsa, bad_a, out, nt):
    """:func:`gate_up` then :func:`down` in one parallel region: a thread that finds no gate/up block
    left takes blocks of ``DOWN_ROWS`` output rows from a second counter and, for each expert in
    turn, waits until that expert's activations are all quantised (its groups' count), then adds its
    rows. No thread waits at a barrier for the slowest gate/up block, nor enters a second region, and
    down starts on the first experts while the last ones' gate/up blocks are still running. Each
    output value adds its experts in the same order as :func:`down`: the result is the same to the bit.

    No deadlock: a thread waits only for blocks already taken, and only threads that are running have
    taken any."""
    nb = f_ // ROWS
    ng = f_ // grp
    per_group = grp // ROWS
    items = rows.size * nb
    down_items = (d_ + DOWN_ROWS - 1) // DOWN_ROWS
    for p in range(toks.size):
        bad_a[p] = False
    taken = np.zeros(1, np.int64)
    arrived = np.zeros(rows.size * ng, np.int64)
    ready = np.zeros(rows.size, np.int64)        # groups of each expert quantised
    taken_down = np.zeros(1, np.int64)
    for _ in prange(nt):
        item = fetch_add(taken, 0, 1)
        while item < items:
            i, n0 = item // nb, item % nb * ROWS
            lo, hi = starts[i], starts[i + 1]
            _gate_up_item(fmt, b, h, f, d_, f_, grp, ow13, os13, oz13, ob13, kind, alpha, limit, rows[i], lo, hi,
                          n0, n0 + ROWS, toks, q, s, qs, a)
            g = n0 // grp
            if fetch_add(arrived, i * ng + g, 1) == per_group - 1:
                for p in range(lo, hi):
                    quantize_group(a, p, g, grp, qa, sa, qsa, bad_a)
                fetch_add(ready, i, 1)           # after the group's bytes: a reader of the count sees them
            item = fetch_add(taken, 0, 1)
        blk = fetch_add(taken_down, 0, 1)
        while blk < down_items:
            d0 = blk * DOWN_ROWS
            d1 = min(d_, d0 + DOWN_ROWS)
            for i in range(rows.size):
                while fetch_add(ready, i, 0) < ng:      # the expert's last groups are still being computed
                    pass
                _down_item(fmt, b, h, f, d_, f_, grp, ow2, os2, oz2, ob2, rows[i:i + 1], starts[i:i + 2], d0, d1,
                           toks, wts, qa, sa, qsa, out)
            blk = fetch_add(taken_down, 0, 1)

