"""One output row of one expert matrix dotted with one activation vector, read from the expert's bytes.

Each format dequantises as it streams: a byte (or 16-bit word) is loaded once, widened in registers
and multiplied into a float32 accumulator; scales apply per group or per row after the group's sum,
so no dequantised row is ever written. LLVM vectorises the inner loops for the CPU it runs on (AVX2,
AVX-512), with four independent accumulators (``fastmath`` lets it reassociate the sums).

Tricks that keep the inner loops to a few vector instructions:

* bf16 is the top half of a float32: shift left 16 and reinterpret;
* fp8 e4m3 shifted left 7 is an IEEE half worth ``value / 256`` (subnormals included), so it widens
  with the half conversion and the 256 joins the row scale;
* mxfp4 e2m1 shifted left 9 is a half worth ``value / 2**14``, likewise;
* int4 groups are summed as ``scale * (sum(q * x) - zero * sum(x))``, with ``sum(x)`` per group
  precomputed once per token (``xg``), and the packed nibbles meet ``x``'s even and odd elements
  split into two halves (``x2``) so every load is contiguous.

Inner loops index 2-D arrays (store row ``r``, token ``t``) with unsigned integers and take no array
slices: numba checks signed indices for wrap-around (which turns vector loads into gathers), and every
slice takes a reference on its array, an atomic add on one cache line that all threads share.

Legend: K reduction dim, G group size, NG = K / G groups, KH = K / 2 packed bytes per row.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kernels.cpu.bits import (f32_from_bits, f32_from_e2m1_pair_div16384, f32_from_e4m3_div256, f32_from_f16_bits,
                              f32_from_u4_pair)

# Format codes the compiled kernels branch on (one branch per row, not per element).
BF16, FP16, FP32, FP8, INT4, MXFP4 = range(6)
FORMAT_CODES = {"bf16": BF16, "fp16": FP16, "fp32": FP32, "fp8": FP8, "int4": INT4, "mxfp4": MXFP4}
NIBBLE_FORMATS = (INT4, MXFP4)   # these read x as even/odd halves

_FP8_UNIT = np.float32(256.0)          # e4m3 << 7 read as a half is value / 2**8
_FP4_UNIT = np.float32(16384.0)        # e2m1 << 9 read as a half is value / 2**14


U = np.uint64


@njit(fastmath=True, cache=True, inline="always")
def _dot_bf16(h, r, o, x, t, k):
    acc = np.float32(0.0)
    for j in range(k):
        acc += f32_from_bits(np.uint32(h[r, o + U(j)]) << 16) * x[t, U(j)]
    return acc


@njit(fastmath=True, cache=True, inline="always")
def _dot_fp16(h, r, o, x, t, k):
    acc = np.float32(0.0)
    for j in range(k):
        acc += f32_from_f16_bits(h[r, o + U(j)]) * x[t, U(j)]
    return acc


@njit(fastmath=True, cache=True, inline="always")
def _dot_fp32(f, r, o, x, t, k):
    acc = np.float32(0.0)
    for j in range(k):
        acc += f[r, o + U(j)] * x[t, U(j)]
    return acc


@njit(fastmath=True, cache=True, inline="always")
def _dot_fp8(b, r, o, x, t, k):
    acc = np.float32(0.0)
    for j in range(k):
        acc += f32_from_e4m3_div256(b[r, o + U(j)]) * x[t, U(j)]
    return acc


@njit(fastmath=True, cache=True, inline="always")
def _dot_int4(b, h, r, o, osc, oz, group, x2, xg, t, k):
    # Four groups in one loop: each group's sum is its own chain of adds, and one group alone is a
    # chain too short to hide the adds' latency (a single chain ran at a third of this speed).
    half = U(k // 2)
    gh = U(group // 2)
    ng = U(k // group)
    tot = np.float32(0.0)
    g = U(0)
    while g + U(4) <= ng:
        o0 = g * gh
        o1 = o0 + gh
        o2 = o1 + gh
        o3 = o2 + gh
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for j in range(gh):
            lo, hi = f32_from_u4_pair(b[r, o + o0 + U(j)])
            a0 += lo * x2[t, o0 + U(j)] + hi * x2[t, o0 + U(j) + half]
            lo, hi = f32_from_u4_pair(b[r, o + o1 + U(j)])
            a1 += lo * x2[t, o1 + U(j)] + hi * x2[t, o1 + U(j) + half]
            lo, hi = f32_from_u4_pair(b[r, o + o2 + U(j)])
            a2 += lo * x2[t, o2 + U(j)] + hi * x2[t, o2 + U(j) + half]
            lo, hi = f32_from_u4_pair(b[r, o + o3 + U(j)])
            a3 += lo * x2[t, o3 + U(j)] + hi * x2[t, o3 + U(j) + half]
        tot += (_u4_scaled(b, h, r, osc, oz, g, a0, xg, t) + _u4_scaled(b, h, r, osc, oz, g + U(1), a1, xg, t)) \
            + (_u4_scaled(b, h, r, osc, oz, g + U(2), a2, xg, t) + _u4_scaled(b, h, r, osc, oz, g + U(3), a3, xg, t))
        g += U(4)
    while g < ng:
        og = g * gh
        acc = np.float32(0.0)
        for j in range(gh):
            lo, hi = f32_from_u4_pair(b[r, o + og + U(j)])
            acc += lo * x2[t, og + U(j)] + hi * x2[t, og + U(j) + half]
        tot += _u4_scaled(b, h, r, osc, oz, g, acc, xg, t)
        g += U(1)
    return tot


@njit(fastmath=True, cache=True, inline="always")
def _u4_scaled(b, h, r, osc, oz, g, acc, xg, t):
    """Group ``g``'s ``sum(q * x)`` (``acc``) as ``scale * (sum(q * x) - zero * sum(x))``."""
    return f32_from_f16_bits(h[r, osc + g]) * (acc - np.float32(b[r, oz + g]) * xg[t, g])


@njit(fastmath=True, cache=True, inline="always")
def _mxfp4_group(b, r, o, x2, t, og, half):
    """``sum(w * x)`` of the 32 values in bytes ``og:og+16`` of the row, in units of the group's scale."""
    acc = np.float32(0.0)
    for j in range(16):
        i = og + U(j)
        lo, hi = f32_from_e2m1_pair_div16384(b[r, o + i])
        acc += lo * x2[t, i] + hi * x2[t, i + half]
    return acc


@njit(fastmath=True, cache=True, inline="always")
def _dot_mxfp4(b, r, o, osc, x2, t, k):
    # Four groups in flight: a single 16-byte group is too short for the vectoriser's own
    # interleaving, and one running sum would chain every group's adds behind the last.
    ng = U(k // 32)
    half = U(k // 2)
    t0 = np.float32(0.0)
    t1 = np.float32(0.0)
    t2 = np.float32(0.0)
    t3 = np.float32(0.0)
    g = U(0)
    while g + U(4) <= ng:
        og = g * U(16)
        t0 += _mxfp4_group(b, r, o, x2, t, og, half) * _e8m0(b[r, osc + g])
        t1 += _mxfp4_group(b, r, o, x2, t, og + U(16), half) * _e8m0(b[r, osc + g + U(1)])
        t2 += _mxfp4_group(b, r, o, x2, t, og + U(32), half) * _e8m0(b[r, osc + g + U(2)])
        t3 += _mxfp4_group(b, r, o, x2, t, og + U(48), half) * _e8m0(b[r, osc + g + U(3)])
        g += U(4)
    while g < ng:
        t0 += _mxfp4_group(b, r, o, x2, t, g * U(16), half) * _e8m0(b[r, osc + g])
        g += U(1)
    return ((t0 + t1) + (t2 + t3)) * _FP4_UNIT


@njit(fastmath=True, cache=True, inline="always")
def _e8m0(e):
    return f32_from_bits(np.uint32(e) << 23)   # 2 ** (e - 127); e = 0 reads as 0


@njit(fastmath=True, cache=True, inline="always")
def row_dot(fmt, b, h, f, r, ow, osc, oz, n, k, group, x, x2, xg, t):
    """Row ``n`` of the matrix at byte ``ow`` of store row ``r`` (``b``/``h``/``f``: the store as
    uint8, uint16 and float32; ``osc``/``oz``: the matrix's scale and zero offsets) dotted with
    ``x[t] [K]`` float32 (``x2[t] [K]``: its even elements, then its odd ones, and ``xg[t] [K/G]``: its
    group sums, for the nibble formats). All indices are non-negative."""
    r, t, n = U(r), U(t), U(n)
    if fmt == BF16:
        return _dot_bf16(h, r, U(ow >> 1) + n * U(k), x, t, k)
    if fmt == FP16:
        return _dot_fp16(h, r, U(ow >> 1) + n * U(k), x, t, k)
    if fmt == FP32:
        return _dot_fp32(f, r, U(ow >> 2) + n * U(k), x, t, k)
    if fmt == FP8:
        return _dot_fp8(b, r, U(ow) + n * U(k), x, t, k) * (f[r, U(osc >> 2) + n] * _FP8_UNIT)
    o = U(ow) + n * U(k // 2)
    if fmt == INT4:
        ng = U(k // group)
        return _dot_int4(b, h, r, o, U(osc >> 1) + n * ng, U(oz) + n * ng, group, x2, xg, t, k)
    return _dot_mxfp4(b, r, o, U(osc) + n * U(k // 32), x2, t, k)


@njit(fastmath=True, cache=True, inline="always")
def _dot2_bf16(h, r, o, x, t0, t1, k):
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    for j in range(k):
        w = f32_from_bits(np.uint32(h[r, o + U(j)]) << 16)
        a0 += w * x[t0, U(j)]
        a1 += w * x[t1, U(j)]
    return a0, a1


@njit(fastmath=True, cache=True, inline="always")
def _dot2_fp16(h, r, o, x, t0, t1, k):
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    for j in range(k):
        w = f32_from_f16_bits(h[r, o + U(j)])
        a0 += w * x[t0, U(j)]
        a1 += w * x[t1, U(j)]
    return a0, a1


@njit(fastmath=True, cache=True, inline="always")
def _dot2_fp32(f, r, o, x, t0, t1, k):
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    for j in range(k):
        w = f[r, o + U(j)]
        a0 += w * x[t0, U(j)]
        a1 += w * x[t1, U(j)]
    return a0, a1


@njit(fastmath=True, cache=True, inline="always")
def _dot2_fp8(b, r, o, x, t0, t1, k):
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    for j in range(k):
        w = f32_from_e4m3_div256(b[r, o + U(j)])
        a0 += w * x[t0, U(j)]
        a1 += w * x[t1, U(j)]
    return a0, a1


@njit(fastmath=True, cache=True, inline="always")
def row_dot2(fmt, b, h, f, r, ow, osc, n, k, x, t0, t1):
    """:func:`row_dot` of a float format (bf16, fp16, fp32, fp8) for two token rows of ``x``: each
    weight is loaded and widened once for both."""
    r, t0, t1, n = U(r), U(t0), U(t1), U(n)
    if fmt == BF16:
        return _dot2_bf16(h, r, U(ow >> 1) + n * U(k), x, t0, t1, k)
    if fmt == FP16:
        return _dot2_fp16(h, r, U(ow >> 1) + n * U(k), x, t0, t1, k)
    if fmt == FP32:
        return _dot2_fp32(f, r, U(ow >> 2) + n * U(k), x, t0, t1, k)
    a0, a1 = _dot2_fp8(b, r, U(ow) + n * U(k), x, t0, t1, k)
    s = f[r, U(osc >> 2) + n] * _FP8_UNIT
    return a0 * s, a1 * s
