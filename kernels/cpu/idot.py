"""Rows of packed 4-bit weights (int4, mxfp4) dotted with 16-bit activations held as two signed
bytes, as numba intrinsics that emit their own vector loop.

numba types every integer product as 64-bit, so its loops cannot ask for the instructions these
kernels want: a multiply of unsigned by signed bytes that adds neighbouring products into 16-bit
lanes (``pmaddubsw``), then one of 16-bit lanes by a constant into 32-bit lanes (``pmaddwd``), on
x86 from SSSE3 to AVX-512, called by name; elsewhere the same sums in plain IR, which LLVM lowers to
the target's multiply-adds. Integer sums are exact, so the order of the adds does not change them.

Why two bytes: a byte multiply takes 32 codes per instruction where a 16-bit one takes 16, and the
codes unpack from bytes with two operations per 64 instead of six plus a zero-point subtraction.
One byte of activation (1/127 of the group's largest value a step) moved the expert's outputs by
about 1% and changed greedy outputs of the tiny test models against the bus path; the second byte
refines each value to 1/32258 of that largest value, as precise as the 16-bit fixed point the GPU's
4-bit kernels use, for twice the multiplies.

Layout the loops read (Legend: K reduction dim, G group size, NG = K / G):

* weights: a row's K/2 bytes, byte ``j`` holding code ``2j`` in its low nibble and ``2j + 1`` in its
  high one (:mod:`kernels.quant`'s packing). Each code becomes an unsigned byte ``u``: int4's code
  itself, mxfp4's twice its e2m1 value plus 12 (0..24; ``pshufb`` where x86 has it, arithmetic
  elsewhere);
* activations ``x2 [T, 2K]`` int8: value ``q = high * 254 + low`` (:data:`LOW_RANGE`), the high bytes
  in ``x2[:, :K]`` and the low ones in ``x2[:, K:]``, each in two phases, ``x2[t, p * K/2 + m]`` for
  element ``2m + p``: the low nibbles of a run of bytes meet one contiguous stream and the high
  nibbles another, so no lane is shuffled; ``sx [T, NG]`` the float scale of one unit of ``q`` per
  group and ``qs [T, K/8]`` int32 the sums of ``q`` over each run of 8 values.

The loops sum ``u * q`` in 32-bit lanes of 8 values each, and take ``z * qs`` from each lane in
integers, so each lane holds the exact ``sum((u - z) * q)`` of its 8 weights, with ``z`` int4's zero
point or mxfp4's 12; lanes become float and are scaled by ``sw * sx`` (``sw`` int4's fp16 scale or
mxfp4's ``2**(e - 127) / 2``). Float sums then add true partial products: none cancels large terms,
whatever the signs. Nothing saturates or overflows: a byte pair's sum is at most 2 x 24 x 127 = 6096
and the two nibbles' together 12192, below 2**15; a lane's, times 254 and paired, about 6.2 million,
and its ``z * qs`` at most 24 x 8 x 32385, about 6.2 million too, far below 2**31 (and below 2**24, so
a lane turns float exactly).

``<fmt>_row1(b, h, r, o, osc, oz, x2, sx, qs, t, k2, ng)``: row ``r``'s bytes ``o:o + K/2`` of ``b``
(the store as uint8; ``h`` as uint16) against token row ``t``, as float32; the row's scales start
at ``osc`` (int4: halves of ``h``; mxfp4: exponent bytes of ``b``) and int4's zero points at byte
``oz`` of ``b``; ``k2`` is K/2. ``<fmt>_row2`` does two token rows with one unpacking of the
weights. Formats: ``e2m1`` (mxfp4) and ``u4g32``/``u4g64``/``u4g128`` (int4 by group size).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.cpu.bits import half_to_f32, target

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_FAST = ("fast",)
# Twice an e2m1 value is an integer: codes 0-7 are 0, 1, 2, 3, 4, 6, 8, 12 and bit 3 is the sign.
# Plus 12 it is an unsigned byte, the operand pmaddubsw wants unsigned.
_E2M1_X2 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
E2M1_OFFSET = 12
LOW_RANGE = 254           # an activation is high * 254 + low, both signed bytes (kernels.cpu.packed)


def _vec(ty, n):
    return ir.VectorType(ty, n)


def _splat(ty: ir.Type, value, n: int) -> ir.Constant:
    return ir.Constant(_vec(ty, n), [value] * n)


def _index(context, builder, ty, value):
    return context.cast(builder, value, ty, types.intp)


def _x86_intrinsics(context, table: tuple[tuple[str | None, int, str], ...]) -> dict[int, str]:
    """Of ``table``'s (CPU feature, None for x86-64 itself; width; intrinsic), those the code numba
    compiles may use, by width: none on other targets."""
    x86, feats = target(context)
    if not x86:
        return {}
    return {width: name for feat, width, name in table if feat is None or feat in feats}


# Tests set these to {} for the plain IR other targets get; None: chosen for numba's target.
_PMADD: dict[int, str] | None = None
_MADDUBS: dict[int, str] | None = None
_PSHUFB: dict[int, str] | None = None


def _x86_pmadd(context) -> dict[int, str]:
    """x86 16-bit multiply-adds by width in 16-bit lanes."""
    if _PMADD is not None:
        return _PMADD
    return _x86_intrinsics(context, ((None, 8, "llvm.x86.sse2.pmadd.wd"), ("avx2", 16, "llvm.x86.avx2.pmadd.wd"),
                                     ("avx512bw", 32, "llvm.x86.avx512.pmaddw.d.512")))


def _x86_maddubs(context) -> dict[int, str]:
    """x86 unsigned-by-signed byte multiply-adds by width in bytes."""
    if _MADDUBS is not None:
        return _MADDUBS
    return _x86_intrinsics(context, (("ssse3", 16, "llvm.x86.ssse3.pmadd.ub.sw.128"),
                                     ("avx2", 32, "llvm.x86.avx2.pmadd.ub.sw"),
                                     ("avx512bw", 64, "llvm.x86.avx512.pmaddubs.w.512")))


def _x86_pshufb(context) -> dict[int, str]:
    """x86 byte lookups by width in bytes."""
    if _PSHUFB is not None:
        return _PSHUFB
    return _x86_intrinsics(context, (("ssse3", 16, "llvm.x86.ssse3.pshuf.b.128"), ("avx2", 32, "llvm.x86.avx2.pshuf.b"),
                                     ("avx512bw", 64, "llvm.x86.avx512.pshuf.b.512")))


def _concat(builder, parts):
    while len(parts) > 1:
        n = parts[0].type.count
        mask = ir.Constant(_vec(_I32, 2 * n), list(range(2 * n)))
        parts = [builder.shuffle_vector(parts[i], parts[i + 1], mask) for i in range(0, len(parts), 2)]
    return parts[0]


def _by_width(builder, widths: dict[int, str], args, n: int, out_ty, lanes_out: int):
    """The x86 intrinsic of the widest width in ``widths`` that fits ``n`` input lanes, applied to
    each ``width``-lane piece of ``args`` and the results joined; None when none fits."""
    fits = [w for w in sorted(widths, reverse=True) if w <= n]
    if not fits:
        return None
    w = fits[0]
    in_ty = args[0].type.element
    fnty = ir.FunctionType(_vec(out_ty, w * lanes_out // n), [_vec(in_ty, w)] * len(args))
    fn = cgutils.get_or_insert_function(builder.module, fnty, widths[w])
    parts = []
    for c in range(n // w):
        lanes = ir.Constant(_vec(_I32, w), list(range(c * w, (c + 1) * w)))
        parts.append(builder.call(fn, [builder.shuffle_vector(a, a, lanes) for a in args]))
    return _concat(builder, parts)


def _pairs(builder, a, b, n, ext_a, wide):
    """``a[2i] * b[2i] + a[2i+1] * b[2i+1]`` in plain IR, each operand widened to ``wide`` lanes."""
    half = _vec(wide, n // 2)
    out = []
    for start in (0, 1):
        m = ir.Constant(_vec(_I32, n // 2), list(range(start, n, 2)))
        x = ext_a(builder.shuffle_vector(a, a, m), half)
        y = builder.sext(builder.shuffle_vector(b, b, m), half)
        out.append(builder.mul(x, y, flags=["nsw"]))
    return builder.add(*out)


def _maddubs(builder, u, s, n, widths):
    """Unsigned bytes ``u`` times signed bytes ``s`` (``<n x i8>``), neighbours added: ``<n/2 x i16>``."""
    got = _by_width(builder, widths, [u, s], n, _I16, n // 2)
    return got if got is not None else _pairs(builder, u, s, n, builder.zext, _I16)


def _widen_sum(builder, v, n, widths, factor: int):
    """Neighbouring lanes of ``<n x i16>`` added, times ``factor``, into ``<n/2 x i32>`` (pmaddwd by
    a constant)."""
    got = _by_width(builder, widths, [v, _splat(_I16, factor, n)], n, _I32, n // 2)
    if got is not None:
        return got
    half = _vec(_I32, n // 2)
    even = ir.Constant(_vec(_I32, n // 2), list(range(0, n, 2)))
    odd = ir.Constant(_vec(_I32, n // 2), list(range(1, n, 2)))
    pair = builder.add(builder.sext(builder.shuffle_vector(v, v, even), half),
                       builder.sext(builder.shuffle_vector(v, v, odd), half))
    return pair if factor == 1 else builder.mul(pair, _splat(_I32, factor, n // 2))


def _e2m1_bytes(builder, c, n, widths):
    """Codes 0-15 (``<n x i8>``) as twice their e2m1 value plus 12."""
    table = [v + E2M1_OFFSET for v in _E2M1_X2]
    fits = [w for w in widths if w <= n]
    if fits:
        w = max(fits)
        tab = ir.Constant(_vec(_I8, w), table * (w // 16))
        fnty = ir.FunctionType(_vec(_I8, w), [_vec(_I8, w)] * 2)
        fn = cgutils.get_or_insert_function(builder.module, fnty, widths[w])
        parts = []
        for k in range(n // w):
            lanes = ir.Constant(_vec(_I32, w), list(range(k * w, (k + 1) * w)))
            parts.append(builder.call(fn, [tab, builder.shuffle_vector(c, c, lanes)]))
        return _concat(builder, parts)
    usub = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(_I8, n), [_vec(_I8, n)] * 2),
                                          f"llvm.usub.sat.v{n}i8")
    m = builder.and_(c, _splat(_I8, 7, n))
    t = builder.call(usub, [m, _splat(_I8, 4, n)])                           # 0 0 0 0 0 1 2 3
    v = builder.add(builder.add(m, t), builder.shl(builder.call(usub, [t, _splat(_I8, 2, n)]),
                                                  _splat(_I8, 1, n)))       # 0 1 2 3 4 6 8 12
    neg = builder.sub(_splat(_I8, 0, n), builder.lshr(c, _splat(_I8, 3, n)))
    return builder.add(builder.sub(builder.xor(v, neg), neg), _splat(_I8, E2M1_OFFSET, n))


def _load(builder, base, offset, ty, n, align):
    ptr = builder.bitcast(builder.gep(base, [offset]), _vec(ty, n).as_pointer())
    return builder.load(ptr, align=align)


class _Format:
    """What differs between the 4-bit formats inside a row: how a code becomes an unsigned byte, each
    group's offset and its float scale. ``gb``: bytes per group (two codes a byte)."""

    def __init__(self, kind: str, gb: int) -> None:
        self.kind, self.gb = kind, gb

    def codes(self, builder, v8, n, pshufb):
        """The low and the high nibbles of ``<n x i8>`` as unsigned bytes."""
        lo = builder.and_(v8, _splat(_I8, 15, n))
        hi = builder.lshr(v8, _splat(_I8, 4, n))
        if self.kind == "e2m1":
            return _e2m1_bytes(builder, lo, n, pshufb), _e2m1_bytes(builder, hi, n, pshufb)
        return lo, hi

    def offsets(self, builder, z_base, g, k):
        """``<k x i32>`` offsets of groups ``g:g + k``: int4's zero points, mxfp4's 12. The zero points
        are read one byte at a time: a ``<2 x i8>`` load widened to ``<2 x i32>`` compiles to an
        instruction sequence that ran a whole row 25 times slower on an AMD host."""
        if self.kind == "e2m1":
            return _splat(_I32, E2M1_OFFSET, k)
        out = ir.Constant(_vec(_I32, k), [0] * k)
        for j in range(k):
            z = builder.load(builder.gep(z_base, [builder.add(g, ir.Constant(_I64, j))]))
            out = builder.insert_element(out, builder.zext(z, _I32), ir.Constant(_I32, j))
        return out

    def scales(self, context, builder, s_base, g, k):
        """``<k x float>`` scales of groups ``g:g + k``: int4's fp16 scales, mxfp4's ``2**(e-127) / 2``
        (its values are doubled)."""
        if self.kind == "e2m1":
            e = builder.zext(_load(builder, s_base, g, _I8, k, 1), _vec(_I32, k))
            sc = builder.bitcast(builder.shl(e, _splat(_I32, 23, k)), _vec(_F32, k))
            return builder.fmul(sc, _splat(_F32, 0.5, k), flags=_FAST)
        return half_to_f32(context, builder, _load(builder, s_base, g, _I16, k, 2))


def _sums(builder, lo, hi, x_base, k2, off, n, kinds):
    """Exact ``sum(u * q)`` of ``n`` weight bytes against one token's two-byte values, per 4 bytes:
    ``<n/4 x i32>``."""
    maddubs, pmadd = kinds
    parts = []
    for plane in (0, 2):                  # the high bytes, then the low ones
        x0 = _load(builder, x_base, builder.add(off, builder.mul(k2, ir.Constant(_I64, plane))), _I8, n, 1)
        x1 = _load(builder, x_base, builder.add(off, builder.mul(k2, ir.Constant(_I64, plane + 1))), _I8, n, 1)
        parts.append(builder.add(_maddubs(builder, lo, x0, n, maddubs), _maddubs(builder, hi, x1, n, maddubs)))
    high = _widen_sum(builder, parts[0], n // 2, pmadd, LOW_RANGE)
    return builder.add(high, _widen_sum(builder, parts[1], n // 2, pmadd, 1))


def _expand(builder, vec, reps: int):
    """``<k x T>`` with each element repeated ``reps`` times: ``<k * reps x T>``."""
    k = vec.type.count
    mask = ir.Constant(_vec(_I32, k * reps), [i // reps for i in range(k * reps)])
    return builder.shuffle_vector(vec, vec, mask)


def _hsum(builder, v):
    """The lanes of a float vector added: a tree, in the order fast-math allows."""
    if not isinstance(v.type, ir.VectorType):
        return v
    while v.type.count > 1:
        n = v.type.count // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi, flags=_FAST)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _loop(builder, start, stop, inits, body, name: str) -> list:
    """``for i in range(start, stop): carried = body(i, carried)`` in IR, ``carried`` starting as
    ``inits``; returns the carried values after the loop (``inits`` when the range is empty)."""
    pre = builder.basic_block
    loop = builder.append_basic_block(name)
    after = builder.append_basic_block(name + ".after")
    builder.cbranch(builder.icmp_signed("<", start, stop), loop, after)
    builder.position_at_end(loop)
    i = builder.phi(start.type)
    i.add_incoming(start, pre)
    phis = []
    for v in inits:
        phi = builder.phi(v.type)
        phi.add_incoming(v, pre)
        phis.append(phi)
    outs = body(i, phis)
    last = builder.basic_block
    nxt = builder.add(i, ir.Constant(start.type, 1))
    i.add_incoming(nxt, last)
    for phi, v in zip(phis, outs):
        phi.add_incoming(v, last)
    builder.cbranch(builder.icmp_signed("<", nxt, stop), loop, after)
    builder.position_at_end(after)
    done = []
    for v0, v in zip(inits, outs):
        phi = builder.phi(v0.type)
        phi.add_incoming(v0, pre)
        phi.add_incoming(v, last)
        done.append(phi)
    return done


STEP = 64                 # weight bytes per step of the block loop: 128 values, 16 lanes of sums


def _row_codegen(fmt: _Format, nt: int):
    """A whole row: steps of 64 bytes while whole steps fit, each token's exact integer sums per lane
    made exact per lane in integers (each lane's offset times its values' sum taken off), turned float
    and scaled by their group's scales (lanes of one group share them), added into 16 float lanes
    summed once at the end. Then the groups left over, one at a time."""
    gb = fmt.gb
    gps = STEP // gb                      # groups per step
    lanes = STEP // 4

    def codegen(context, builder, sig, args):
        kinds = (_x86_maddubs(context), _x86_pmadd(context))
        pshufb = _x86_pshufb(context)
        bty, hty, xty, sty, qty = (sig.args[i] for i in (0, 1, 6, 7, 8))
        b = context.make_array(bty)(context, builder, args[0])
        h = context.make_array(hty)(context, builder, args[1])
        x = context.make_array(xty)(context, builder, args[6])
        sx = context.make_array(sty)(context, builder, args[7])
        qs = context.make_array(qty)(context, builder, args[8])
        r, o, osc, oz = (_index(context, builder, sig.args[i], args[i]) for i in (2, 3, 4, 5))
        ts = [_index(context, builder, sig.args[9 + i], args[9 + i]) for i in range(nt)]
        k2, ng = (_index(context, builder, sig.args[9 + nt + i], args[9 + nt + i]) for i in range(2))
        zero = ir.Constant(_I64, 0)

        def at(ty, arr, row, col):
            return cgutils.get_item_pointer(context, builder, ty, arr, [row, col], wraparound=False)

        w_base = at(bty, b, r, o)
        s_base = at(bty, b, r, osc) if fmt.kind == "e2m1" else at(hty, h, r, osc)
        z_base = at(bty, b, r, oz)
        x_bases = [at(xty, x, t, zero) for t in ts]
        sx_bases = [at(sty, sx, t, zero) for t in ts]
        qs_bases = [at(qty, qs, t, zero) for t in ts]

        def exact(sums, z, off, k, t):
            """``sums`` (``<n x i32>``: lane ``i`` the 8 values of weight bytes ``off + 4i .. + 3``, the
            lanes of each of the ``k`` groups together) less offset times those values' sum of ``q``:
            every lane then holds its own exact ``sum((u - z) * q)``, small as the products are, so
            that no float sum cancels large terms."""
            n = sums.type.count
            lane_q = _load(builder, qs_bases[t], builder.udiv(off, ir.Constant(_I64, 4)), _I32, n, 4)
            return builder.sub(sums, builder.mul(_expand(builder, z, n // k), lane_q))

        def block(g, off, nbytes, k, acc, whole):
            """Groups ``g:g + k`` (``nbytes`` weight bytes from ``off``) added into ``acc``: per token its
            exact group sums scaled by their groups' scales, as a vector over a whole step's lanes, else
            as a scalar."""
            lo, hi = fmt.codes(builder, _load(builder, w_base, off, _I8, nbytes, 1), nbytes, pshufb)
            sc = fmt.scales(context, builder, s_base, g, k)
            z = fmt.offsets(builder, z_base, g, k)
            out = []
            for t in range(nt):
                sums = exact(_sums(builder, lo, hi, x_bases[t], k2, off, nbytes, kinds), z, off, k, t)
                n = sums.type.count
                sxv = _load(builder, sx_bases[t], g, _F32, k, 4)
                term = builder.fmul(builder.sitofp(sums, _vec(_F32, n)),
                                    _expand(builder, builder.fmul(sc, sxv, flags=_FAST), n // k), flags=_FAST)
                out.append(builder.fadd(acc[t], term if whole else _hsum(builder, term), flags=_FAST))
            return out

        nb = builder.udiv(ng, ir.Constant(_I64, gps))
        steps = _loop(builder, zero, nb, [_splat(_F32, 0.0, lanes)] * nt,
                      lambda j, acc: block(builder.mul(j, ir.Constant(_I64, gps)),
                                           builder.mul(j, ir.Constant(_I64, STEP)), STEP, gps, acc, True),
                      "row.steps")
        outs = [_hsum(builder, v) for v in steps]

        # the groups after the last whole step, one at a time
        if gps > 1:
            outs = _loop(builder, builder.mul(nb, ir.Constant(_I64, gps)), ng, outs,
                         lambda g, acc: block(g, builder.mul(g, ir.Constant(_I64, gb)), gb, 1, acc, False),
                         "row.tail")
        if nt == 1:
            return outs[0]
        return context.make_tuple(builder, sig.return_type, outs)
    return codegen


def _check_row(b, h, x, sx, qs, ints) -> bool:
    def arr(a, dt):
        return isinstance(a, types.Array) and a.dtype == dt and a.ndim == 2
    return (arr(b, types.uint8) and arr(h, types.uint16) and arr(x, types.int8) and arr(sx, types.float32)
            and arr(qs, types.int32) and all(isinstance(i, types.Integer) for i in ints))


def _row_intrinsics(kind: str, gb: int):
    """``(row1, row2)`` for one format and group width: see the module docstring."""
    fmt = _Format(kind, gb)

    @intrinsic
    def row1(typingctx, b, h, r, o, osc, oz, x2, sx, qs, t0, k2, ng):
        if not _check_row(b, h, x2, sx, qs, (r, o, osc, oz, t0, k2, ng)):
            return None
        return types.float32(b, h, r, o, osc, oz, x2, sx, qs, t0, k2, ng), _row_codegen(fmt, 1)

    @intrinsic
    def row2(typingctx, b, h, r, o, osc, oz, x2, sx, qs, t0, t1, k2, ng):
        if not _check_row(b, h, x2, sx, qs, (r, o, osc, oz, t0, t1, k2, ng)):
            return None
        return (types.UniTuple(types.float32, 2)(b, h, r, o, osc, oz, x2, sx, qs, t0, t1, k2, ng),
                _row_codegen(fmt, 2))

    return row1, row2


e2m1_row1, e2m1_row2 = _row_intrinsics("e2m1", 16)
u4g32_row1, u4g32_row2 = _row_intrinsics("u4", 16)
u4g64_row1, u4g64_row2 = _row_intrinsics("u4", 32)
u4g128_row1, u4g128_row2 = _row_intrinsics("u4", 64)
