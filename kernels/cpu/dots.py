"""One output row of one float-format expert matrix (bf16, fp16, fp32, fp8) dotted with one or two
activation vectors, read from the expert's bytes; the format codes and helpers the CPU passes share.
(int4 and mxfp4 run in integers: :mod:`kernels.cpu.packed`.)

Each format dequantises as it streams: a byte (or 16-bit word) is loaded once, widened in registers
and multiplied into a float32 accumulator; fp8's row scale applies after the row's sum, so no
dequantised row is ever written. LLVM vectorises the inner loops for the CPU it runs on (AVX2,
AVX-512), with four independent accumulators (``fastmath`` lets it reassociate the sums).

Tricks that keep the inner loops to a few vector instructions:

* bf16 is the top half of a float32: shift left 16 and reinterpret;
* fp8 e4m3 shifted left 7 is an IEEE half worth ``value / 256`` (subnormals included), so it widens
  with the half conversion and the 256 joins the row scale.

Inner loops index 2-D arrays (store row ``r``, token ``t``) with unsigned integers and take no array
slices: numba checks signed indices for wrap-around (which turns vector loads into gathers), and every
slice takes a reference on its array, an atomic add on one cache line that all threads share.

Legend: K reduction dim.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from kernels.cpu.bits import f32_from_bits, f32_from_e4m3_div256, f32_from_f16_bits

# Format codes the compiled kernels branch on (one branch per row, not per element).
BF16, FP16, FP32, FP8, INT4, MXFP4 = range(6)
FORMAT_CODES = {"bf16": BF16, "fp16": FP16, "fp32": FP32, "fp8": FP8, "int4": INT4, "mxfp4": MXFP4}

_FP8_UNIT = np.float32(256.0)          # e4m3 << 7 read as a half is value / 2**8
ROWS = 16   # rows per work item of the passes: enough work to amortise the scheduling, enough items for 16+ threads
U = np.uint64


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _widen(fmt, b, h, f, r, i):
    """Element ``i`` of store row ``r`` in format ``fmt`` (a constant where this is inlined, so the
    branch folds away) as float32; fp8 without its row scale."""
    if fmt == BF16:
        return f32_from_bits(np.uint32(h[r, i]) << 16)
    if fmt == FP16:
        return f32_from_f16_bits(h[r, i])
    if fmt == FP32:
        return f[r, i]
    return f32_from_e4m3_div256(b[r, i])


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _dot(fmt, b, h, f, r, o, x, t, k):
    acc = np.float32(0.0)
    for j in range(k):
        acc += _widen(fmt, b, h, f, r, o + U(j)) * x[t, U(j)]
    return acc


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _dot2(fmt, b, h, f, r, o, x, t0, t1, k):
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    for j in range(k):
        w = _widen(fmt, b, h, f, r, o + U(j))
        a0 += w * x[t0, U(j)]
        a1 += w * x[t1, U(j)]
    return a0, a1


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def _first(fmt, ow, n, k):
    """Index of row ``n``'s first element in the view its format reads (uint16, float32 or uint8)."""
    shift = 1 if fmt == BF16 or fmt == FP16 else (2 if fmt == FP32 else 0)
    return U(ow >> shift) + U(n) * U(k)


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def row_dot(fmt, b, h, f, r, ow, osc, n, k, x, t):
    """Row ``n`` of the matrix at byte ``ow`` of store row ``r`` (``b``/``h``/``f``: the store as
    uint8, uint16 and float32; ``osc``: fp8's per-row scales) dotted with ``x[t] [K]`` float32. All
    indices are non-negative. Each format's loop is spelt with its code as a constant."""
    r, t = U(r), U(t)
    if fmt == BF16:
        return _dot(BF16, b, h, f, r, _first(BF16, ow, n, k), x, t, k)
    if fmt == FP16:
        return _dot(FP16, b, h, f, r, _first(FP16, ow, n, k), x, t, k)
    if fmt == FP32:
        return _dot(FP32, b, h, f, r, _first(FP32, ow, n, k), x, t, k)
    return _dot(FP8, b, h, f, r, _first(FP8, ow, n, k), x, t, k) * (f[r, U(osc >> 2) + U(n)] * _FP8_UNIT)


@njit(fastmath=True, error_model="numpy", cache=True, inline="always")
def row_dot2(fmt, b, h, f, r, ow, osc, n, k, x, t0, t1):
    """:func:`row_dot` for two token rows of ``x``: each weight is loaded and widened once for both."""
    r, t0, t1 = U(r), U(t0), U(t1)
    if fmt == BF16:
        return _dot2(BF16, b, h, f, r, _first(BF16, ow, n, k), x, t0, t1, k)
    if fmt == FP16:
        return _dot2(FP16, b, h, f, r, _first(FP16, ow, n, k), x, t0, t1, k)
    if fmt == FP32:
        return _dot2(FP32, b, h, f, r, _first(FP32, ow, n, k), x, t0, t1, k)
    a0, a1 = _dot2(FP8, b, h, f, r, _first(FP8, ow, n, k), x, t0, t1, k)
    s = f[r, U(osc >> 2) + U(n)] * _FP8_UNIT
    return a0 * s, a1 * s


@njit(fastmath=True, error_model="numpy", cache=True)
def act(gate, up, kind, alpha, limit):
    """The expert's activation of one (gate, up) pair: SiLU (``kind`` 0), or gpt-oss's clamped
    SwiGLU with ``alpha`` and ``limit`` (1)."""
    if kind == 0:
        return gate / (np.float32(1.0) + math.exp(-gate)) * up
    gate = min(gate, limit)
    up = min(max(up, -limit), limit)
    return (up + np.float32(1.0)) * gate / (np.float32(1.0) + math.exp(-alpha * gate))
