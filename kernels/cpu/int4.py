"""int4 experts on the CPU in integer arithmetic: the weights' 4-bit codes against 16-bit activations.

The float path (:mod:`kernels.cpu.dots`) widens every code to float32 and multiplies it into a float
accumulator: four vector instructions per eight weights on ports the multiply-adds also need, which
kept int4 at a quarter of one core's memory bandwidth. Here each activation vector is quantised once
per call to 16-bit fixed point with one scale per int4 group (as the GPU's 4-bit decode kernels do),
and :mod:`kernels.cpu.idot`'s loops take 16-bit words of packed codes apart with shifts and masks and
multiply them with ``pmaddwd``-style instructions. A group's integer sum is exact; it becomes float once:

    sum over the group of w * x = s_w * s_x * (sum(code * q) - zero * sum(q))

(``s_w``, ``zero``: the row's group scale and zero point; ``s_x``, ``q``: the activations' group scale
and 16-bit values). Up to four tokens that use one expert share each unpacking of its weights.

The passes mirror :mod:`kernels.cpu.driver` (gate/up into ``a [P, F]``, then down with one writer per
output column); only the dot products differ.

Legend: T tokens, P (expert, token) pairs, D hidden, F expert FFN, G group size, K reduction dim.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kernels.cpu.bits import f32_from_f16_bits
from kernels.cpu.idot import u4_dot1, u4_dot2, u4_dot4

ROWS = 16                      # rows per work item, as kernels.cpu.driver
Q_MAX = np.float32(32767.0)    # activations: symmetric 16-bit fixed point per group
U = np.uint64


@njit(cache=True)
def supports(group, ow13, osc13, ow2, osc2):
    """Whether the integer path reads this layout: groups of a multiple of 32 values (words of four
    codes in steps of eight) and the weight and scale matrices at even byte offsets."""
    return group % 32 == 0 and (ow13 | osc13 | ow2 | osc2) % 2 == 0


@njit(fastmath=True, cache=True)
def quantize_rows(v, group, q, s, sums):
    """Each row of ``v [N, K]`` float32 as 16-bit fixed point with one scale per group of ``group``:
    ``q [N, K]`` int16 in four phases (``q[i, p * K/4 + m]`` is element ``4m + p``), ``s [N, K/G]``
    float32 scales and ``sums [N, K/G]`` int64, the sum of each group's 16-bit values."""
    k = v.shape[1]
    k4 = k // 4
    for i in range(v.shape[0]):
        for g in range(k // group):
            m = np.float32(0.0)
            for j in range(g * group, (g + 1) * group):
                m = max(m, abs(v[i, j]))
            sc = m / Q_MAX if m > 0 else np.float32(1.0)
            inv = np.float32(1.0) / sc
            tot = 0
            for j in range(g * group, (g + 1) * group):
                qv = min(max(math.floor(v[i, j] * inv + np.float32(0.5)), -Q_MAX), Q_MAX)
                q[i, (j % 4) * k4 + j // 4] = np.int16(qv)
                tot += np.int64(qv)
            s[i, g] = sc
            sums[i, g] = tot


@njit(fastmath=True, cache=True, inline="always")
def _fix(h, b, r, osc, oz, g, acc, s, sums, t):
    """Group ``g``'s integer sum ``acc`` (token row ``t``) as a float: scale times (sum - zero * sum(q))."""
    whole = np.int64(acc) - np.int64(b[r, oz + g]) * sums[t, g]
    return f32_from_f16_bits(h[r, osc + g]) * s[t, g] * np.float32(whole)


@njit(fastmath=True, cache=True, inline="always")
def _offsets(ow, osc, oz, n, k, group):
    """Row ``n`` of the matrix at byte ``ow``: its first word, its first scale (in halves), its first
    zero point (in bytes)."""
    ng = U(k // group)
    return U(ow >> 1) + U(n) * U(k // 4), U(osc >> 1) + U(n) * ng, U(oz) + U(n) * ng


@njit(fastmath=True, cache=True, inline="always")
def row1(b, h, r, ow, osc, oz, n, k, group, q, s, sums, t):
    """Row ``n`` of an int4 matrix dotted with token row ``t`` of the quantised activations."""
    o, oc, ozr = _offsets(ow, osc, oz, n, k, group)
    gw, k4 = U(group // 4), U(k // 4)
    r, t = U(r), U(t)
    tot = np.float32(0.0)
    for g in range(k // group):
        gg = U(g)
        acc = u4_dot1(h, r, o + gg * gw, q, t, gg * gw, k4, gw)
        tot += _fix(h, b, r, oc, ozr, gg, acc, s, sums, t)
    return tot


@njit(fastmath=True, cache=True, inline="always")
def row2(b, h, r, ow, osc, oz, n, k, group, q, s, sums, t0, t1):
    """:func:`row1` for two token rows, one unpacking of the weights."""
    o, oc, ozr = _offsets(ow, osc, oz, n, k, group)
    gw, k4 = U(group // 4), U(k // 4)
    r, t0, t1 = U(r), U(t0), U(t1)
    y0 = np.float32(0.0)
    y1 = np.float32(0.0)
    for g in range(k // group):
        gg = U(g)
        a0, a1 = u4_dot2(h, r, o + gg * gw, q, t0, t1, gg * gw, k4, gw)
        y0 += _fix(h, b, r, oc, ozr, gg, a0, s, sums, t0)
        y1 += _fix(h, b, r, oc, ozr, gg, a1, s, sums, t1)
    return y0, y1


@njit(fastmath=True, cache=True, inline="always")
def row4(b, h, r, ow, osc, oz, n, k, group, q, s, sums, t0, t1, t2, t3):
    """:func:`row1` for four token rows, one unpacking of the weights."""
    o, oc, ozr = _offsets(ow, osc, oz, n, k, group)
    gw, k4 = U(group // 4), U(k // 4)
    r, t0, t1, t2, t3 = U(r), U(t0), U(t1), U(t2), U(t3)
    y0 = np.float32(0.0)
    y1 = np.float32(0.0)
    y2 = np.float32(0.0)
    y3 = np.float32(0.0)
    for g in range(k // group):
        gg = U(g)
        a0, a1, a2, a3 = u4_dot4(h, r, o + gg * gw, q, t0, t1, t2, t3, gg * gw, k4, gw)
        y0 += _fix(h, b, r, oc, ozr, gg, a0, s, sums, t0)
        y1 += _fix(h, b, r, oc, ozr, gg, a1, s, sums, t1)
        y2 += _fix(h, b, r, oc, ozr, gg, a2, s, sums, t2)
        y3 += _fix(h, b, r, oc, ozr, gg, a3, s, sums, t3)
    return y0, y1, y2, y3


@njit(fastmath=True, cache=True)
def _act(gate, up, kind, alpha, limit):
    if kind == 0:
        return gate / (np.float32(1.0) + math.exp(-gate)) * up
    gate = min(gate, limit)
    up = min(max(up, -limit), limit)
    return (up + np.float32(1.0)) * gate / (np.float32(1.0) + math.exp(-alpha * gate))


@njit(fastmath=True, cache=True, inline="always")
def _bias(f, r, ob, i):
    return f[r, (ob >> 2) + i] if ob >= 0 else np.float32(0.0)


@njit(fastmath=True, cache=True, inline="always")
def _pair_act(f, r, ob, n, f_, kind, alpha, limit, g, u, a, p):
    a[p, n] = _act(g + _bias(f, r, ob, n), u + _bias(f, r, ob, f_ + n), kind, alpha, limit)


@njit(fastmath=True, cache=True, inline="always")
def _gate_up_rows(b, h, f, d_, f_, grp, ow, osc, oz, ob, kind, alpha, limit, r, lo, hi, n0, n1, toks, q, s, sums, a):
    """Gate and up rows ``n0:n1`` of store row ``r`` for pairs ``lo:hi``."""
    for n in range(n0, n1):
        p = lo
        while p + 4 <= hi:
            g0, g1, g2, g3 = row4(b, h, r, ow, osc, oz, n, d_, grp, q, s, sums,
                                  toks[p], toks[p + 1], toks[p + 2], toks[p + 3])
            u0, u1, u2, u3 = row4(b, h, r, ow, osc, oz, f_ + n, d_, grp, q, s, sums,
                                  toks[p], toks[p + 1], toks[p + 2], toks[p + 3])
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g0, u0, a, p)
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g1, u1, a, p + 1)
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g2, u2, a, p + 2)
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g3, u3, a, p + 3)
            p += 4
        if p + 2 <= hi:
            g0, g1 = row2(b, h, r, ow, osc, oz, n, d_, grp, q, s, sums, toks[p], toks[p + 1])
            u0, u1 = row2(b, h, r, ow, osc, oz, f_ + n, d_, grp, q, s, sums, toks[p], toks[p + 1])
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g0, u0, a, p)
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g1, u1, a, p + 1)
            p += 2
        if p < hi:
            g0 = row1(b, h, r, ow, osc, oz, n, d_, grp, q, s, sums, toks[p])
            u0 = row1(b, h, r, ow, osc, oz, f_ + n, d_, grp, q, s, sums, toks[p])
            _pair_act(f, r, ob, n, f_, kind, alpha, limit, g0, u0, a, p)


@njit(fastmath=True, parallel=True, cache=True)
def gate_up(b, h, f, d_, f_, grp, ow, osc, oz, ob, kind, alpha, limit, rows, starts, toks, q, s, sums, a):
    """Pass 1: ``a [P, F]`` = act(gate, up) of every pair, from the quantised tokens ``q``/``s``/``sums``.
    The common group sizes are spelt out as constants, so that each group's loop compiles to
    straight-line code."""
    nb1 = (f_ + ROWS - 1) // ROWS
    for item in prange(rows.size * nb1):
        i = item // nb1
        r = rows[i]
        n0 = item % nb1 * ROWS
        n1 = min(f_, n0 + ROWS)
        if grp == 128:
            _gate_up_rows(b, h, f, d_, f_, 128, ow, osc, oz, ob, kind, alpha, limit, r, starts[i], starts[i + 1],
                          n0, n1, toks, q, s, sums, a)
        else:
            _gate_up_rows(b, h, f, d_, f_, grp, ow, osc, oz, ob, kind, alpha, limit, r, starts[i], starts[i + 1],
                          n0, n1, toks, q, s, sums, a)


@njit(fastmath=True, cache=True, inline="always")
def _down_rows(b, h, f, d_, f_, grp, ow, osc, oz, ob, r, lo, hi, d0, d1, toks, wts, q, s, sums, out):
    """Down rows ``d0:d1`` of store row ``r`` for pairs ``lo:hi``, added into ``out``."""
    for dd in range(d0, d1):
        bias = _bias(f, r, ob, dd)
        p = lo
        while p + 4 <= hi:
            y0, y1, y2, y3 = row4(b, h, r, ow, osc, oz, dd, f_, grp, q, s, sums, p, p + 1, p + 2, p + 3)
            out[toks[p], dd] += wts[p] * (y0 + bias)
            out[toks[p + 1], dd] += wts[p + 1] * (y1 + bias)
            out[toks[p + 2], dd] += wts[p + 2] * (y2 + bias)
            out[toks[p + 3], dd] += wts[p + 3] * (y3 + bias)
            p += 4
        if p + 2 <= hi:
            y0, y1 = row2(b, h, r, ow, osc, oz, dd, f_, grp, q, s, sums, p, p + 1)
            out[toks[p], dd] += wts[p] * (y0 + bias)
            out[toks[p + 1], dd] += wts[p + 1] * (y1 + bias)
            p += 2
        if p < hi:
            y0 = row1(b, h, r, ow, osc, oz, dd, f_, grp, q, s, sums, p)
            out[toks[p], dd] += wts[p] * (y0 + bias)


@njit(fastmath=True, parallel=True, cache=True)
def down(b, h, f, d_, f_, grp, ow, osc, oz, ob, rows, starts, toks, wts, q, s, sums, out):
    """Pass 2: ``out[t, d] += w * (w2[d] . a[p] + b2[d])`` over every pair (``q``/``s``/``sums``: ``a``
    quantised, one row per pair), one writer per ``d``; group sizes as in :func:`gate_up`."""
    nb2 = (d_ + ROWS - 1) // ROWS
    for item in prange(nb2):
        d0 = item * ROWS
        d1 = min(d_, d0 + ROWS)
        for i in range(rows.size):
            r, lo, hi = rows[i], starts[i], starts[i + 1]
            if grp == 128:
                _down_rows(b, h, f, d_, f_, 128, ow, osc, oz, ob, r, lo, hi, d0, d1, toks, wts, q, s, sums, out)
            else:
                _down_rows(b, h, f, d_, f_, grp, ow, osc, oz, ob, r, lo, hi, d0, d1, toks, wts, q, s, sums, out)
