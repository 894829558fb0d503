"""The compiled body of :func:`kernels.cpu.forward.cpu_expert_forward`: two parallel passes over the
experts' rows.

1. gate/up: work items are (expert, block of ``ROWS`` gate rows); an item reads gate row ``n`` and up
   row ``F + n`` for each of the expert's tokens and writes the activation straight into ``a [P, F]``
   (and in its even-then-odd order), so ``h [2F]`` never exists. Weights are widened in registers
   inside the dot; the float formats take an expert's tokens two at a time, each weight widened once
   for both. (int4 and mxfp4 normally take the integer path, :mod:`kernels.cpu.packed`; this one
   reads int4 groups that path does not.)
2. down: work items are blocks of ``ROWS`` output columns ``d``; an item visits every expert and
   token pair in order and accumulates ``w * (w2[d] . a[p] + b2[d])`` into ``out[t, d]``. Each output
   element has one writer and a fixed order, so the result is deterministic and needs no atomics.

Legend: T tokens, P (expert, token) pairs, D hidden, F expert FFN, G int4 group size.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kernels.cpu import packed
from kernels.cpu.dots import INT4, MXFP4, row_dot, row_dot2

ROWS = 16   # rows per work item: enough work to amortise the scheduling, enough items to balance 16+ threads

# Indices into the int64 ``meta`` vector (see kernels.cpu.forward._meta).
(M_FMT, M_D, M_F, M_G, M_W13, M_S13, M_Z13, M_W2, M_S2, M_Z2, M_B13, M_B2, M_ACT) = range(13)


@njit(fastmath=True, cache=True)
def _act(gate, up, kind, alpha, limit):
    if kind == 0:
        return gate / (np.float32(1.0) + math.exp(-gate)) * up
    gate = min(gate, limit)
    up = min(max(up, -limit), limit)
    return (up + np.float32(1.0)) * gate / (np.float32(1.0) + math.exp(-alpha * gate))


@njit(fastmath=True, cache=True)
def _split(v, v2):
    half = v.size // 2
    for j in range(half):
        v2[j] = v[2 * j]
        v2[half + j] = v[2 * j + 1]


@njit(fastmath=True, cache=True)
def _group_sums(v, group, out):
    for g in range(out.size):
        out[g] = v[g * group:(g + 1) * group].sum()


@njit(fastmath=True, cache=True)
def expert_forward(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out):
    """``out [T, D]`` float32 (zeroed by the caller) += the routed experts of ``rows`` on ``x [T, D]``.

    ``b``/``h``/``f``: the store ``[R, nbytes]`` as uint8, uint16 and float32; ``meta``: the layout
    (``M_*``); expert ``i`` is row ``rows[i]`` for pairs ``starts[i]:starts[i+1]`` of ``toks``/``wts``."""
    fmt, d_, f_, grp = meta[M_FMT], meta[M_D], meta[M_F], meta[M_G]
    t_ = x.shape[0]
    p_ = toks.size
    nib = fmt == INT4 or fmt == MXFP4
    # Activations in the form each format reads: x, its even/odd halves, its group sums.
    x2 = np.zeros((t_, d_ if nib else 1), np.float32)                        # [T, D] even, then odd
    xg = np.zeros((t_, d_ // grp if fmt == INT4 else 1), np.float32)        # [T, D/G]
    a = np.zeros((p_, f_), np.float32)                                       # [P, F]
    a2 = np.zeros((p_, f_ if nib else 1), np.float32)                        # [P, F] even, then odd
    ag = np.zeros((p_, f_ // grp if fmt == INT4 else 1), np.float32)        # [P, F/G]
    for t in range(t_):
        if nib:
            _split(x[t], x2[t])
        if fmt == INT4:
            _group_sums(x[t], grp, xg[t])
    _gate_up(b, h, f, meta, alpha, limit, rows, starts, toks, x, x2, xg, a, a2)
    if fmt == INT4:
        for p in range(p_):
            _group_sums(a[p], grp, ag[p])
    _down(b, h, f, meta, rows, starts, toks, wts, a, a2, ag, out)


@njit(fastmath=True, cache=True)
def packed_forward(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out):
    """:func:`expert_forward` for int4 and mxfp4 in integer arithmetic (:mod:`kernels.cpu.packed`):
    tokens, then each pair's activation, quantised to 16 bits per group before the pass that reads
    them. A separate entry point, so that a store of another format never compiles it."""
    fmt, d_, f_ = meta[M_FMT], meta[M_D], meta[M_F]
    grp = 32 if fmt == MXFP4 else meta[M_G]
    t_, p_ = x.shape[0], toks.size
    q = np.empty((t_, d_), np.int16)
    s = np.empty((t_, d_ // grp), np.float32)
    packed.quantize_rows(x, grp, q, s)
    a = np.empty((p_, f_), np.float32)
    packed.gate_up(fmt, b, h, f, d_, f_, grp, meta[M_W13], meta[M_S13], meta[M_Z13], meta[M_B13], meta[M_ACT],
                   alpha, limit, rows, starts, toks, q, s, a)
    qa = np.empty((p_, f_), np.int16)
    sa = np.empty((p_, f_ // grp), np.float32)
    packed.quantize_rows(a, grp, qa, sa)
    packed.down(fmt, b, h, f, d_, f_, grp, meta[M_W2], meta[M_S2], meta[M_Z2], meta[M_B2], rows, starts, toks, wts,
                qa, sa, out)


@njit(fastmath=True, parallel=True, cache=True)
def _gate_up(b, h, f, meta, alpha, limit, rows, starts, toks, x, x2, xg, a, a2):
    """Pass 1: ``a [P, F]`` (and ``a2``, even then odd) = act(gate, up) of every pair; the float
    formats take an expert's tokens two at a time, each weight widened once for both."""
    fmt, d_, f_, grp = meta[M_FMT], meta[M_D], meta[M_F], meta[M_G]
    nib = fmt == INT4 or fmt == MXFP4
    nb1 = (f_ + ROWS - 1) // ROWS
    for item in prange(rows.size * nb1):
        i = item // nb1
        r = rows[i]
        hi = starts[i + 1]
        for n in range(item % nb1 * ROWS, min(f_, item % nb1 * ROWS + ROWS)):
            p = starts[i]
            while p < hi:
                two = not nib and p + 1 < hi
                g0 = g1 = u0 = u1 = np.float32(0.0)
                for half in range(2):   # one call site each: the dot code is inlined, and compiled, once
                    if two:
                        v0, v1 = row_dot2(fmt, b, h, f, r, meta[M_W13], meta[M_S13], half * f_ + n, d_, x, toks[p],
                                          toks[p + 1])
                    else:
                        v0 = row_dot(fmt, b, h, f, r, meta[M_W13], meta[M_S13], meta[M_Z13], half * f_ + n, d_,
                                     grp, x, x2, xg, toks[p])
                        v1 = np.float32(0.0)
                    if meta[M_B13] >= 0:
                        v0 += f[r, (meta[M_B13] >> 2) + half * f_ + n]
                        v1 += f[r, (meta[M_B13] >> 2) + half * f_ + n]
                    if half == 0:
                        g0, g1 = v0, v1
                    else:
                        u0, u1 = v0, v1
                for j in range(2 if two else 1):
                    v = _act(g0 if j == 0 else g1, u0 if j == 0 else u1, meta[M_ACT], alpha, limit)
                    a[p + j, n] = v
                    if nib:
                        a2[p + j, n // 2 + (n % 2) * (f_ // 2)] = v
                p += 2 if two else 1


@njit(fastmath=True, parallel=True, cache=True)
def _down(b, h, f, meta, rows, starts, toks, wts, a, a2, ag, out):
    """Pass 2: ``out[t, d] += w * (w2[d] . a[p] + b2[d])`` over every pair, one writer per ``d``;
    float formats two pairs at a time, as in :func:`_gate_up`."""
    fmt, d_, f_, grp = meta[M_FMT], meta[M_D], meta[M_F], meta[M_G]
    nib = fmt == INT4 or fmt == MXFP4
    nb2 = (d_ + ROWS - 1) // ROWS
    for item in prange(nb2):
        for i in range(rows.size):
            r = rows[i]
            hi = starts[i + 1]
            for dd in range(item * ROWS, min(d_, item * ROWS + ROWS)):
                bias = f[r, (meta[M_B2] >> 2) + dd] if meta[M_B2] >= 0 else np.float32(0.0)
                p = starts[i]
                while p < hi:
                    if not nib and p + 1 < hi:
                        y0, y1 = row_dot2(fmt, b, h, f, r, meta[M_W2], meta[M_S2], dd, f_, a, p, p + 1)
                        out[toks[p], dd] += wts[p] * (y0 + bias)
                        out[toks[p + 1], dd] += wts[p + 1] * (y1 + bias)
                        p += 2
                    else:
                        y = row_dot(fmt, b, h, f, r, meta[M_W2], meta[M_S2], meta[M_Z2], dd, f_, grp, a, a2, ag, p)
                        out[toks[p], dd] += wts[p] * (y + bias)
                        p += 1
