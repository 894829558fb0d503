"""Bit casts the CPU expert kernels need and numba does not offer: a 32-bit pattern as float32, and a
16-bit pattern as an IEEE half widened to float32.

The half path is what makes fp16 scales, fp8 e4m3 and mxfp4 e2m1 cheap: each fits inside a half's
bit pattern once shifted (see :mod:`kernels.cpu.dots`), and LLVM turns the widening into one vector
instruction (``vcvtph2ps``) that handles subnormals at full speed, where a float32 subnormal multiply
would take a microcode assist.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _to_width(builder, value, width: int):
    have = value.type.width
    if have > width:
        return builder.trunc(value, ir.IntType(width))
    if have < width:
        return builder.zext(value, ir.IntType(width))
    return value


@intrinsic
def f32_from_bits(typingctx, bits):
    """The low 32 bits of an integer, read as a float32."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_to_width(builder, args[0], 32), ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def f32_from_f16_bits(typingctx, bits):
    """The low 16 bits of an integer, read as an IEEE half and widened exactly to float32."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        half = builder.bitcast(_to_width(builder, args[0], 16), ir.HalfType())
        return builder.fpext(half, ir.FloatType())
    return types.float32(bits), codegen
