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


def _half_to_f32(builder, bits16):
    return builder.fpext(builder.bitcast(bits16, ir.HalfType()), ir.FloatType())


def _masked_shift(builder, x, mask: int, shift: int):
    i16 = ir.IntType(16)
    return builder.shl(builder.and_(x, ir.Constant(i16, mask)), ir.Constant(i16, shift))


@intrinsic
def f32_from_e4m3_div256(typingctx, byte):
    """An fp8 e4m3 byte as float32, divided by 256: its sign, exponent and mantissa shifted into a
    half's bit pattern, in 16-bit lanes (numba's own integer arithmetic would widen to 64 bits)."""
    if not isinstance(byte, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        x = _to_width(builder, _to_width(builder, args[0], 8), 16)
        bits = builder.or_(_masked_shift(builder, x, 0x80, 8), _masked_shift(builder, x, 0x7F, 7))
        return _half_to_f32(builder, bits)
    return types.float32(byte), codegen


@intrinsic
def f32_from_e2m1_pair_div16384(typingctx, byte):
    """The two e2m1 nibbles of an mxfp4 byte (low nibble first) as float32, divided by 2**14."""
    if not isinstance(byte, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        x = _to_width(builder, _to_width(builder, args[0], 8), 16)
        lo = builder.or_(_masked_shift(builder, x, 0x08, 12), _masked_shift(builder, x, 0x07, 9))
        hi = builder.or_(_masked_shift(builder, x, 0x80, 8), _masked_shift(builder, x, 0x70, 5))
        pair = context.make_tuple(builder, signature.return_type,
                                  (_half_to_f32(builder, lo), _half_to_f32(builder, hi)))
        return pair
    return types.UniTuple(types.float32, 2)(byte), codegen


@intrinsic
def f32_from_u4_pair(typingctx, byte):
    """The two unsigned nibbles of an int4 byte (low nibble first) as float32, in 32-bit lanes."""
    if not isinstance(byte, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        x = _to_width(builder, _to_width(builder, args[0], 8), 32)
        lo = builder.uitofp(builder.and_(x, ir.Constant(i32, 15)), ir.FloatType())
        hi = builder.uitofp(builder.lshr(x, ir.Constant(i32, 4)), ir.FloatType())
        return context.make_tuple(builder, signature.return_type, (lo, hi))
    return types.UniTuple(types.float32, 2)(byte), codegen
