"""Bit casts the CPU expert kernels need and numba does not offer: a 32-bit pattern as float32, and a
16-bit pattern as an IEEE half widened to float32.

The half path is what makes fp16 values and fp8 e4m3 cheap: each fits inside a half's
bit pattern once shifted (see :mod:`kernels.cpu.dots`), and LLVM turns the widening into one vector
instruction (``vcvtph2ps``) that handles subnormals at full speed, where a float32 subnormal multiply
would take a microcode assist. An x86 target without that instruction (F16C; e.g. numba told to
compile for a generic CPU) gets the widening in integer operations instead: LLVM would call a
runtime helper there that numba's JIT does not provide.

:func:`target` says what numba compiles for, for the intrinsics that pick instructions.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def target(context) -> tuple[bool, set[str]]:
    """Whether numba compiles for x86-64, and the CPU features it compiles for (its own setting, which
    ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` may narrow below the host's: an instruction chosen from
    the host's features would not compile then)."""
    import llvmlite.binding as llvm
    cg = context.codegen()
    triple = getattr(getattr(cg, "_tm", None), "triple", "") or llvm.get_process_triple()
    feats = getattr(cg, "_tm_features", None)
    if feats is None:
        feats = llvm.get_host_cpu_features().flatten()
    return triple.startswith("x86_64"), {f[1:] for f in feats.split(",") if f.startswith("+")}


def half_to_f32(context, builder, bits16: ir.Value) -> ir.Value:
    """An ``i16`` (or ``<n x i16>``) half bit pattern widened exactly to float32."""
    vec = isinstance(bits16.type, ir.VectorType)
    n = bits16.type.count if vec else 1

    def ty(t):
        return ir.VectorType(t, n) if vec else t

    x86, feats = target(context)
    if not x86 or "f16c" in feats:
        return builder.fpext(builder.bitcast(bits16, ty(ir.HalfType())), ty(ir.FloatType()))
    i32 = ir.IntType(32)

    def c(v, t=i32):
        return ir.Constant(ty(t), [v] * n) if vec else ir.Constant(t, v)

    h = builder.zext(bits16, ty(i32))
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    e = builder.and_(builder.lshr(h, c(10)), c(0x1F))
    m = builder.and_(h, c(0x3FF))
    normal = builder.or_(builder.shl(builder.add(e, c(112)), c(23)), builder.shl(m, c(13)))
    special = builder.or_(c(0x7F800000), builder.shl(m, c(13)))                    # infinity, NaN
    tiny = builder.bitcast(builder.fmul(builder.uitofp(m, ty(ir.FloatType())), c(2.0 ** -24, ir.FloatType())),
                           ty(i32))                                                  # subnormal, zero
    bits = builder.select(builder.icmp_unsigned("==", e, c(0)), tiny,
                          builder.select(builder.icmp_unsigned("==", e, c(31)), special, normal))
    return builder.bitcast(builder.or_(bits, sign), ty(ir.FloatType()))


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
        return half_to_f32(context, builder, _to_width(builder, args[0], 16))
    return types.float32(bits), codegen


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
        return half_to_f32(context, builder, bits)
    return types.float32(byte), codegen


@intrinsic
def fetch_add(typingctx, arr, i, v):
    """``arr[i] += v`` as one atomic operation on an int64 1-D array; returns the value before. Ordered
    both ways (acquire and release): what a thread wrote before its add is seen by a thread that
    reads the sum after its own (the last of several workers then reads what all of them wrote)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1
            and isinstance(i, types.Integer) and isinstance(v, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        from numba.core import cgutils
        a = context.make_array(sig.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        val = context.cast(builder, args[2], sig.args[2], types.int64)
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], a, [idx], wraparound=False)
        return builder.atomic_rmw("add", ptr, val, "acq_rel")
    return types.int64(arr, i, v), codegen
