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
  split into two arrays (``xe``, ``xo``) so every load is contiguous.

Legend: K reduction dim, G group size, NG = K / G groups, KH = K / 2 packed bytes per row.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kernels.cpu.bits import f32_from_bits, f32_from_f16_bits

# Format codes the compiled kernels branch on (one branch per row, not per element).
BF16, FP16, FP32, FP8, INT4, MXFP4 = range(6)
FORMAT_CODES = {"bf16": BF16, "fp16": FP16, "fp32": FP32, "fp8": FP8, "int4": INT4, "mxfp4": MXFP4}
NIBBLE_FORMATS = (INT4, MXFP4)   # these read x as even/odd halves

_FP8_UNIT = np.float32(256.0)          # e4m3 << 7 read as a half is value / 2**8
_FP4_UNIT = np.float32(16384.0)        # e2m1 << 9 read as a half is value / 2**14


@njit(fastmath=True, cache=True)
def _dot_bf16(w, x):
    acc = np.float32(0.0)
    for k in range(x.size):
        acc += f32_from_bits(np.uint32(w[k]) << 16) * x[k]
    return acc


@njit(fastmath=True, cache=True)
def _dot_fp16(w, x):
    acc = np.float32(0.0)
    for k in range(x.size):
        acc += f32_from_f16_bits(w[k]) * x[k]
    return acc


@njit(fastmath=True, cache=True)
def _dot_fp32(w, x):
    acc = np.float32(0.0)
    for k in range(x.size):
        acc += w[k] * x[k]
    return acc


@njit(fastmath=True, cache=True)
def _dot_fp8(w, x):
    acc = np.float32(0.0)
    for k in range(x.size):
        v = np.int32(w[k])
        acc += f32_from_f16_bits(((v & 0x80) << 8) | ((v & 0x7F) << 7)) * x[k]
    return acc


@njit(fastmath=True, cache=True)
def _dot_int4(q, scale16, zero, group, xe, xo, xg):
    gh = group // 2
    tot = np.float32(0.0)
    for g in range(xg.size):
        qs = q[g * gh:(g + 1) * gh]
        es = xe[g * gh:(g + 1) * gh]
        od = xo[g * gh:(g + 1) * gh]
        acc = np.float32(0.0)
        for j in range(gh):
            v = qs[j]
            acc += np.float32(np.int32(v & 15)) * es[j] + np.float32(np.int32(v >> 4)) * od[j]
        tot += f32_from_f16_bits(scale16[g]) * (acc - np.float32(zero[g]) * xg[g])
    return tot


@njit(fastmath=True, cache=True)
def _dot_mxfp4(q, scale8, xe, xo):
    tot = np.float32(0.0)
    for g in range(scale8.size):
        qs = q[g * 16:(g + 1) * 16]
        es = xe[g * 16:(g + 1) * 16]
        od = xo[g * 16:(g + 1) * 16]
        acc = np.float32(0.0)
        for j in range(16):
            v = np.int32(qs[j])
            lo = ((v & 0x08) << 12) | ((v & 0x07) << 9)
            hi = ((v & 0x80) << 8) | ((v & 0x70) << 5)
            acc += f32_from_f16_bits(lo) * es[j] + f32_from_f16_bits(hi) * od[j]
        tot += acc * f32_from_bits(np.uint32(scale8[g]) << 23)   # 2 ** (e - 127); e = 0 reads as 0
    return tot * _FP4_UNIT


@njit(fastmath=True, cache=True)
def row_dot(fmt, b, h, f, ow, osc, oz, n, k, group, x, xe, xo, xg):
    """Row ``n`` of the matrix at byte ``ow`` of one expert (``b``/``h``/``f``: its bytes as uint8,
    uint16 and float32; ``osc``/``oz``: its scale and zero offsets) dotted with ``x [K]`` float32
    (``xe``/``xo [K/2]`` even/odd elements and ``xg [K/G]`` group sums for the nibble formats)."""
    if fmt == BF16:
        o = (ow >> 1) + n * k
        return _dot_bf16(h[o:o + k], x)
    if fmt == FP16:
        o = (ow >> 1) + n * k
        return _dot_fp16(h[o:o + k], x)
    if fmt == FP32:
        o = (ow >> 2) + n * k
        return _dot_fp32(f[o:o + k], x)
    if fmt == FP8:
        o = ow + n * k
        return _dot_fp8(b[o:o + k], x) * (f[(osc >> 2) + n] * _FP8_UNIT)
    kh = k // 2
    o = ow + n * kh
    if fmt == INT4:
        ng = k // group
        s = (osc >> 1) + n * ng
        z = oz + n * ng
        return _dot_int4(b[o:o + kh], h[s:s + ng], b[z:z + ng], group, xe, xo, xg)
    ng = k // 32
    s = osc + n * ng
    return _dot_mxfp4(b[o:o + kh], b[s:s + ng], xe, xo)
