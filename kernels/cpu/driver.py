"""The compiled bodies of :func:`kernels.cpu.forward.cpu_expert_forward`: :func:`expert_forward` for
the float formats and :func:`packed_forward` for int4 and mxfp4 (:mod:`kernels.cpu.packed`), each two
parallel passes over the experts' rows, and each compiled on its first call only.

1. gate/up: work items are (expert, block of ``ROWS`` gate rows); an item reads gate row ``n`` and up
   row ``F + n`` for each of the expert's tokens and writes the activation straight into ``a [P, F]``,
   so ``h [2F]`` never exists. Weights are widened in registers inside the dot, and an expert's
   tokens go two at a time, each weight widened once for both. (The 4-bit path's threads take
   their items from a shared counter, and the item that completes a group quantises it.)
2. down: work items are blocks of ``ROWS`` output columns ``d`` (the 4-bit path's: one equal run
   per thread); an item visits every expert and token pair in order and accumulates
   ``w * (w2[d] . a[p] + b2[d])`` into ``out[t, d]``. Each output element has one writer and a fixed
   order, so the result is deterministic and needs no atomics.

Legend: T tokens, P (expert, token) pairs, D hidden, F expert FFN, G group size.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from kernels.cpu import packed
from kernels.cpu.dots import MXFP4, ROWS, act, row_dot, row_dot2

# Token values up to which the 4-bit path quantises its input on the calling thread (about 5 us for
# 2048 values; a parallel region costs 5-10 us to enter on 16 cores): a token or two of a large model.
SERIAL_VALUES = 8192
# Indices into the int64 ``meta`` vector (see kernels.cpu.forward._meta).
(M_FMT, M_D, M_F, M_G, M_W13, M_S13, M_Z13, M_W2, M_S2, M_Z2, M_B13, M_B2, M_ACT) = range(13)


@njit(fastmath=True, error_model="numpy", cache=True)
def expert_forward(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out, nt):
    """``out [T, D]`` float32 (zeroed by the caller) += the routed experts of ``rows`` on ``x [T, D]``,
    for the float formats (bf16, fp16, fp32, fp8).

    ``b``/``h``/``f``: the store ``[R, nbytes]`` as uint8, uint16 and float32; ``meta``: the layout
    (``M_*``); expert ``i`` is row ``rows[i]`` for pairs ``starts[i]:starts[i+1]`` of ``toks``/``wts``;
    ``nt``: the call's thread count (the 4-bit path's passes share their work by it)."""
    a = np.zeros((toks.size, meta[M_F]), np.float32)                        # [P, F]
    _gate_up(b, h, f, meta, alpha, limit, rows, starts, toks, x, a)
    _down(b, h, f, meta, rows, starts, toks, wts, a, out)


@njit(fastmath=True, error_model="numpy", cache=True)
def packed_forward(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out, nt):
    """:func:`expert_forward` for int4 and mxfp4 in integer arithmetic (:mod:`kernels.cpu.packed`):
    tokens, then each pair's activation, quantised to 16 bits per group before the pass that reads
    them (a few tokens on the calling thread, the activations inside the gate/up pass: two parallel
    regions a call). A separate entry point, so that a store of another format never compiles it."""
    _packed(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out, nt, False)


@njit(fastmath=True, error_model="numpy", cache=True)
def packed_forward_one(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out, nt):
    """:func:`packed_forward` with gate/up and down in one parallel region (:func:`packed.gate_up_down`):
    the same result to the bit."""
    _packed(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out, nt, True)


@njit(fastmath=True, error_model="numpy", cache=True)
def _packed(b, h, f, meta, alpha, limit, rows, starts, toks, wts, x, out, nt, one_region):
    fmt, d_, f_ = meta[M_FMT], meta[M_D], meta[M_F]
    grp = 32 if fmt == MXFP4 else meta[M_G]
    t_, p_ = x.shape[0], toks.size
    q = np.empty((t_, 2 * d_), np.int8)
    s = np.empty((t_, d_ // grp), np.float32)
    qs = np.empty((t_, d_ // 8), np.int32)
    bad_x = np.empty(t_, np.bool_)
    if t_ * d_ <= SERIAL_VALUES:
        packed.quantize_rows_serial(x, grp, q, s, qs, bad_x)
    else:
        packed.quantize_rows(x, grp, q, s, qs, bad_x)
    a = np.empty((p_, f_), np.float32)
    qa = np.empty((p_, 2 * f_), np.int8)
    sa = np.empty((p_, f_ // grp), np.float32)
    qsa = np.empty((p_, f_ // 8), np.int32)
    bad_a = np.empty(p_, np.bool_)
    if one_region:
        packed.gate_up_down(fmt, b, h, f, d_, f_, grp, meta[M_W13], meta[M_S13], meta[M_Z13], meta[M_B13],
                            meta[M_ACT], alpha, limit, meta[M_W2], meta[M_S2], meta[M_Z2], meta[M_B2], rows, starts,
                            toks, wts, q, s, qs, a, qa, sa, qsa, bad_a, out, nt)
    else:
        packed.gate_up(fmt, b, h, f, d_, f_, grp, meta[M_W13], meta[M_S13], meta[M_Z13], meta[M_B13], meta[M_ACT],
                       alpha, limit, rows, starts, toks, q, s, qs, a, qa, sa, qsa, bad_a, nt)
        packed.down(fmt, b, h, f, d_, f_, grp, meta[M_W2], meta[M_S2], meta[M_Z2], meta[M_B2], rows, starts, toks,
                    wts, qa, sa, qsa, out, nt)
    for p in range(p_):                 # a NaN or infinity in a token's input (or its activation) makes
        if bad_x[toks[p]] or bad_a[p]:  # its output NaN, as in float arithmetic
            out[toks[p], :] = np.float32(np.nan)


@njit(fastmath=True, error_model="numpy", parallel=True, cache=True)
def _gate_up(b, h, f, meta, alpha, limit, rows, starts, toks, x, a):
    """Pass 1: ``a [P, F]`` = act(gate, up) of every pair; an expert's tokens two at a time, each
    weight widened once for both."""
    fmt, d_, f_ = meta[M_FMT], meta[M_D], meta[M_F]
    nb1 = (f_ + ROWS - 1) // ROWS
    for item in prange(rows.size * nb1):
        i = item // nb1
        r = rows[i]
        hi = starts[i + 1]
        for n in range(item % nb1 * ROWS, min(f_, item % nb1 * ROWS + ROWS)):
            p = starts[i]
            while p < hi:
                two = p + 1 < hi
                g0 = g1 = u0 = u1 = np.float32(0.0)
                for half in range(2):   # one call site each: the dot code is inlined, and compiled, once
                    if two:
                        v0, v1 = row_dot2(fmt, b, h, f, r, meta[M_W13], meta[M_S13], half * f_ + n, d_, x, toks[p],
                                          toks[p + 1])
                    else:
                        v0 = row_dot(fmt, b, h, f, r, meta[M_W13], meta[M_S13], half * f_ + n, d_, x, toks[p])
                        v1 = np.float32(0.0)
                    if meta[M_B13] >= 0:
                        v0 += f[r, (meta[M_B13] >> 2) + half * f_ + n]
                        v1 += f[r, (meta[M_B13] >> 2) + half * f_ + n]
                    if half == 0:
                        g0, g1 = v0, v1
                    else:
                        u0, u1 = v0, v1
                a[p, n] = act(g0, u0, meta[M_ACT], alpha, limit)
                if two:
                    a[p + 1, n] = act(g1, u1, meta[M_ACT], alpha, limit)
                p += 2 if two else 1


@njit(fastmath=True, error_model="numpy", parallel=True, cache=True)
def _down(b, h, f, meta, rows, starts, toks, wts, a, out):
    """Pass 2: ``out[t, d] += w * (w2[d] . a[p] + b2[d])`` over every pair, one writer per ``d``; two
    pairs at a time, as in :func:`_gate_up`."""
    fmt, d_, f_ = meta[M_FMT], meta[M_D], meta[M_F]
    nb2 = (d_ + ROWS - 1) // ROWS
    for item in prange(nb2):
        for i in range(rows.size):
            r = rows[i]
            hi = starts[i + 1]
            for dd in range(item * ROWS, min(d_, item * ROWS + ROWS)):
                bias = f[r, (meta[M_B2] >> 2) + dd] if meta[M_B2] >= 0 else np.float32(0.0)
                p = starts[i]
                while p < hi:
                    if p + 1 < hi:
                        y0, y1 = row_dot2(fmt, b, h, f, r, meta[M_W2], meta[M_S2], dd, f_, a, p, p + 1)
                        out[toks[p], dd] += wts[p] * (y0 + bias)
                        out[toks[p + 1], dd] += wts[p + 1] * (y1 + bias)
                        p += 2
                    else:
                        y = row_dot(fmt, b, h, f, r, meta[M_W2], meta[M_S2], dd, f_, a, p)
                        out[toks[p], dd] += wts[p] * (y + bias)
                        p += 1
