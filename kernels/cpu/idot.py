"""Rows of packed 4-bit weights (int4, mxfp4) dotted with 16-bit activations, as numba intrinsics
that emit their own vector loop.

numba types every integer product as 64-bit, so its loops cannot ask for the instruction these
kernels want: a multiply of 16-bit lanes that adds neighbouring products into 32-bit lanes
(``pmaddwd`` on x86, from SSE2 to AVX-512, called by name; elsewhere the same sum in plain IR, which
LLVM lowers to the target's multiply-adds). Integer sums are exact, so the order of the adds does not
change them.

Layout the loops read (Legend: K reduction dim, G group size, NG = K / G):

* weights: a row of packed 4-bit codes read as 16-bit words, each word four codes of consecutive
  weights, lowest nibble first (the byte order of :mod:`kernels.quant`'s packing read on a
  little-endian host); int4 codes less the group's zero point, mxfp4 codes looked up as twice their
  e2m1 value (an integer: ``pshufb`` where x86 has it, arithmetic elsewhere);
* activations ``x4 [T, K]`` int16 in four phases: ``x4[t, p * K/4 + m] = x[t, 4m + p]``, so nibble
  ``p`` of every word meets one contiguous stream and no lane is shuffled; ``sx [T, NG]`` their float
  scale per group.

``<fmt>_row1(h, b, r, o, osc, oz, x4, sx, t, k4, ng)``: row ``r``'s words ``o:o + K/4`` of ``h`` (the
store as uint16; ``b`` as uint8) against token row ``t``, as float32; the row's scales start at
``osc`` (int4: halves of ``h``; mxfp4: exponent bytes of ``b``) and int4's zero points at byte ``oz``
of ``b``. ``<fmt>_row2`` does two token rows with one unpacking of the weights. Formats: ``e2m1``
(mxfp4) and ``u4g32``/``u4g64``/``u4g128`` (int4 by group size).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.cpu.bits import half_to_f32, target

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _splat(ty: ir.IntType, value: int, n: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ty, n), [value] * n)


def _index(context, builder, ty, value):
    return context.cast(builder, value, ty, types.intp)


def _ptr16(context, builder, aryty, ary, row, col):
    """``&ary[row, col]`` of a 2-D C-contiguous int16/uint16 array, as ``i16*``."""
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [row, col], wraparound=False)
    return builder.bitcast(ptr, _I16.as_pointer())


def _load(builder, base, offset, n):
    ptr = builder.bitcast(builder.gep(base, [offset]), ir.VectorType(_I16, n).as_pointer())
    return builder.load(ptr, align=2)


def _x86_intrinsics(context, table: tuple[tuple[str | None, int, str], ...]) -> dict[int, str]:
    """Of ``table``'s (CPU feature, None for x86-64 itself; width; intrinsic), those the code numba
    compiles may use, by width: none on other targets."""
    x86, feats = target(context)
    if not x86:
        return {}
    return {width: name for feat, width, name in table if feat is None or feat in feats}


def _x86_pmadd(context) -> dict[int, str]:
    """The x86 multiply-add intrinsics the code numba compiles may use, by width in 16-bit lanes."""
    if _PMADD is not None:
        return _PMADD
    return _x86_intrinsics(context, ((None, 8, "llvm.x86.sse2.pmadd.wd"), ("avx2", 16, "llvm.x86.avx2.pmadd.wd"),
                                     ("avx512bw", 32, "llvm.x86.avx512.pmaddw.d.512")))


_PMADD: dict[int, str] | None = None     # tests set {} for the plain IR


def _concat(builder, parts):
    while len(parts) > 1:
        n = parts[0].type.count
        mask = ir.Constant(ir.VectorType(ir.IntType(32), 2 * n), list(range(2 * n)))
        parts = [builder.shuffle_vector(parts[i], parts[i + 1], mask) for i in range(0, len(parts), 2)]
    return parts[0]


def _pmadd(builder, a, b, n, pmadd):
    """``a[2i] * b[2i] + a[2i+1] * b[2i+1]`` of two ``<n x i16>`` as ``<n/2 x i32>``: the x86
    instruction (``pmadd``: by width, from :func:`_x86_pmadd`) in the widest form the target has, or
    the same sum in plain IR elsewhere."""
    widths = [w for w in sorted(pmadd, reverse=True) if w <= n]
    if widths:
        w = widths[0]
        fnty = ir.FunctionType(ir.VectorType(_I32, w // 2), [ir.VectorType(_I16, w)] * 2)
        fn = cgutils.get_or_insert_function(builder.module, fnty, pmadd[w])
        parts = []
        for c in range(n // w):
            lanes = ir.Constant(ir.VectorType(_I32, w), list(range(c * w, (c + 1) * w)))
            parts.append(builder.call(fn, [builder.shuffle_vector(a, a, lanes), builder.shuffle_vector(b, b, lanes)]))
        return _concat(builder, parts)
    even = ir.Constant(ir.VectorType(_I32, n // 2), list(range(0, n, 2)))
    odd = ir.Constant(ir.VectorType(_I32, n // 2), list(range(1, n, 2)))
    wide = ir.VectorType(_I32, n // 2)
    prod = [builder.mul(builder.sext(builder.shuffle_vector(a, a, m), wide),
                        builder.sext(builder.shuffle_vector(b, b, m), wide), flags=["nsw"]) for m in (even, odd)]
    return builder.add(*prod)


def _reduce(builder, vec: ir.Value, n: int) -> ir.Value:
    mod = builder.module
    fnty = ir.FunctionType(_I32, [ir.VectorType(_I32, n)])
    fn = cgutils.get_or_insert_function(mod, fnty, f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [vec])


# ---- mxfp4: e2m1 codes as small integers --------------------------------------------------------
# Twice an e2m1 value is an integer: codes 0-7 are 0, 1, 2, 3, 4, 6, 8, 12 and bit 3 is the sign. So
# an mxfp4 row meets the activations' 16-bit values in the same multiply-adds as int4, with the
# group's scale 2**(e - 127) / 2 applied to each group's exact sum.
_E2M1_X2 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
_I8, _F32 = ir.IntType(8), ir.FloatType()


def _x86_pshufb(context) -> dict[int, str]:
    """The x86 byte-lookup intrinsics the code numba compiles may use, by width in bytes."""
    if _PSHUFB is not None:
        return _PSHUFB
    return _x86_intrinsics(context, (("ssse3", 16, "llvm.x86.ssse3.pshuf.b.128"), ("avx2", 32, "llvm.x86.avx2.pshuf.b"),
                                     ("avx512bw", 64, "llvm.x86.avx512.pshuf.b.512")))


_PSHUFB: dict[int, str] | None = None    # tests set {} for the plain IR


def _lookup_bytes(builder, v16, n, pshufb):
    """Each byte (a code 0-15) of ``<n x i16>`` replaced by its signed ``_E2M1_X2`` value."""
    nbytes = 2 * n
    w = max(k for k in pshufb if k <= nbytes)
    vb = builder.bitcast(v16, ir.VectorType(_I8, nbytes))
    fnty = ir.FunctionType(ir.VectorType(_I8, w), [ir.VectorType(_I8, w)] * 2)
    fn = cgutils.get_or_insert_function(builder.module, fnty, pshufb[w])
    table = ir.Constant(ir.VectorType(_I8, w), [v & 0xFF for v in _E2M1_X2] * (w // 16))
    parts = []
    for c in range(nbytes // w):
        lanes = ir.Constant(ir.VectorType(_I32, w), list(range(c * w, (c + 1) * w)))
        parts.append(builder.call(fn, [table, builder.shuffle_vector(vb, vb, lanes)]))
    return builder.bitcast(_concat(builder, parts), ir.VectorType(_I16, n))


def _e2m1_phases(builder, words, n, pshufb):
    """The four codes of each word of ``<n x i16>`` as signed twice-values, one vector per phase."""
    if pshufb and min(pshufb) <= 2 * n:
        m = _splat(_I16, 0x0F0F, n)
        lo = _lookup_bytes(builder, builder.and_(words, m), n, pshufb)                   # codes 0, 2
        hi = _lookup_bytes(builder, builder.and_(builder.lshr(words, _splat(_I16, 4, n)), m), n, pshufb)
        eight = _splat(_I16, 8, n)
        low = lambda v: builder.ashr(builder.shl(v, eight), eight)   # noqa: E731  (the low byte, signed)
        return [low(lo), low(hi), builder.ashr(lo, eight), builder.ashr(hi, eight)]
    usub = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VectorType(_I16, n), [ir.VectorType(_I16, n)] * 2),
        f"llvm.usub.sat.v{n}i16")
    out = []
    for p in range(4):
        c = builder.and_(builder.lshr(words, _splat(_I16, 4 * p, n)) if p else words, _splat(_I16, 15, n))
        m = builder.and_(c, _splat(_I16, 7, n))
        t = builder.call(usub, [m, _splat(_I16, 4, n)])                   # 0 0 0 0 0 1 2 3
        v = builder.add(builder.add(m, t), builder.shl(builder.call(usub, [t, _splat(_I16, 2, n)]),
                                                      _splat(_I16, 1, n)))  # 0 1 2 3 4 6 8 12
        neg = builder.sub(_splat(_I16, 0, n), builder.lshr(c, _splat(_I16, 3, n)))
        out.append(builder.sub(builder.xor(v, neg), neg))
    return out


def _products(builder, phases, x_base, k4, off, n, pmadd):
    """``sum over phases of pmadd(phase, x)``: ``<n/2 x i32>``, lane ``i`` from words ``2i, 2i+1``."""
    acc = None
    for p in range(4):
        xo = builder.add(off, builder.mul(k4, ir.Constant(_I64, p))) if p else off
        prod = _pmadd(builder, phases[p], _load(builder, x_base, xo, n), n, pmadd)
        acc = prod if acc is None else builder.add(acc, prod)
    return acc


def _expand(builder, vec, reps: int):
    """``<k x T>`` with each element repeated ``reps`` times: ``<k * reps x T>``."""
    k = vec.type.count
    mask = ir.Constant(ir.VectorType(_I32, k * reps), [i // reps for i in range(k * reps)])
    return builder.shuffle_vector(vec, vec, mask)


class _Format:
    """What differs between the 4-bit formats inside a row: how a word's codes become signed 16-bit
    values, and each group's float scale. ``gw``: words per group (four 4-bit values a word: a
    group of G values is G/4 words)."""

    def __init__(self, kind: str, gw: int) -> None:
        self.kind, self.gw = kind, gw

    def values(self, builder, words, n, zeros, pshufb):
        """The four phases of ``<n x i16>`` words as signed values; ``zeros``: ``<n x i16>`` zero
        points (int4) or None."""
        if self.kind == "e2m1":
            return _e2m1_phases(builder, words, n, pshufb)
        mask = _splat(_I16, 15, n)
        out = []
        for p in range(4):
            c = builder.lshr(words, _splat(_I16, 4 * p, n)) if p else words
            out.append(builder.sub(builder.and_(c, mask) if p < 3 else c, zeros))
        return out

    def zeros(self, builder, z_base, g, k):
        """``<k x i16>`` zero points of groups ``g:g + k`` (int4), or None."""
        if self.kind == "e2m1":
            return None
        ptr = builder.bitcast(builder.gep(z_base, [g]), ir.VectorType(_I8, k).as_pointer())
        return builder.zext(builder.load(ptr, align=1), ir.VectorType(_I16, k))

    def scales(self, context, builder, s_base, g, k):
        """``<k x float>`` scales of groups ``g:g + k``: int4's fp16 scales, mxfp4's ``2**(e-127) / 2``
        (its values are doubled)."""
        if self.kind == "e2m1":
            ptr = builder.bitcast(builder.gep(s_base, [g]), ir.VectorType(_I8, k).as_pointer())
            e = builder.zext(builder.load(ptr, align=1), ir.VectorType(_I32, k))
            sc = builder.bitcast(builder.shl(e, _splat(_I32, 23, k)), ir.VectorType(_F32, k))
            return builder.fmul(sc, ir.Constant(ir.VectorType(_F32, k), [0.5] * k), flags=_FAST)
        ptr = builder.bitcast(builder.gep(s_base, [g]), ir.VectorType(_I16, k).as_pointer())
        return half_to_f32(context, builder, builder.load(ptr, align=2))


_FAST = ("fast",)


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


STEP = 32                 # words per step of the block loop: 128 values, 16 lanes of sums


def _row_codegen(fmt: _Format, nt: int):
    """A whole row: steps of 32 words while whole steps fit, each token's exact integer sums per
    lane turned float and scaled by their group's scale times the activations' (lanes of one
    group share it), added into 16 float lanes that are summed once at the end; then the groups
    left over one at a time."""
    gw = fmt.gw
    gps = STEP // gw                      # groups per step
    lanes = STEP // 2

    def codegen(context, builder, sig, args):
        pmadd, pshufb = _x86_pmadd(context), _x86_pshufb(context)
        hty, bty, xty, sty = sig.args[0], sig.args[1], sig.args[6], sig.args[7]
        h = context.make_array(hty)(context, builder, args[0])
        b = context.make_array(bty)(context, builder, args[1])
        x = context.make_array(xty)(context, builder, args[6])
        sx = context.make_array(sty)(context, builder, args[7])
        r, o, osc, oz = (_index(context, builder, sig.args[i], args[i]) for i in (2, 3, 4, 5))
        ts = [_index(context, builder, sig.args[8 + i], args[8 + i]) for i in range(nt)]
        k4, ng = (_index(context, builder, sig.args[8 + nt + i], args[8 + nt + i]) for i in range(2))
        zero = ir.Constant(_I64, 0)
        w_base = _ptr16(context, builder, hty, h, r, o)
        if fmt.kind == "e2m1":            # scales: bytes of b
            s_base = cgutils.get_item_pointer(context, builder, bty, b, [r, osc], wraparound=False)
        else:                             # scales: halves of h, zero points: bytes of b
            s_base = _ptr16(context, builder, hty, h, r, osc)
        z_base = cgutils.get_item_pointer(context, builder, bty, b, [r, oz], wraparound=False)
        x_bases = [_ptr16(context, builder, xty, x, t, zero) for t in ts]
        sx_bases = [cgutils.get_item_pointer(context, builder, sty, sx, [t, zero], wraparound=False) for t in ts]
        fl = ir.VectorType(_F32, lanes)
        fzero = ir.Constant(fl, [0.0] * lanes)

        nb = builder.udiv(ng, ir.Constant(_I64, gps))

        def whole_step(j, phis):
            off = builder.mul(j, ir.Constant(_I64, STEP))
            g = builder.mul(j, ir.Constant(_I64, gps))
            z = fmt.zeros(builder, z_base, g, gps)
            values = fmt.values(builder, _load(builder, w_base, off, STEP), STEP,
                                None if z is None else _expand(builder, z, gw), pshufb)
            sc = fmt.scales(context, builder, s_base, g, gps)
            accs = []
            for x_base, sx_base, phi in zip(x_bases, sx_bases, phis):
                sums = _products(builder, values, x_base, k4, off, STEP, pmadd)           # <16 x i32>
                sxp = builder.bitcast(builder.gep(sx_base, [g]), ir.VectorType(_F32, gps).as_pointer())
                scale = _expand(builder, builder.fmul(sc, builder.load(sxp, align=4), flags=_FAST), lanes // gps)
                accs.append(builder.fadd(phi, builder.fmul(builder.sitofp(sums, fl), scale, flags=_FAST),
                                         flags=_FAST))
            return accs

        tots = []
        for v in _loop(builder, zero, nb, [fzero] * nt, whole_step, "row.steps"):
            while v.type.count > 1:       # halves added: a tree, in the order fast-math allows
                n = v.type.count // 2
                lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
                hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
                v = builder.fadd(lo, hi, flags=_FAST)
            tots.append(builder.extract_element(v, ir.Constant(_I32, 0)))

        def one_group(g, phis):
            off = builder.mul(g, ir.Constant(_I64, gw))
            z = fmt.zeros(builder, z_base, g, 1)
            values = fmt.values(builder, _load(builder, w_base, off, gw), gw,
                                None if z is None else _expand(builder, z, gw), pshufb)
            sc = builder.extract_element(fmt.scales(context, builder, s_base, g, 1), ir.Constant(_I32, 0))
            new = []
            for x_base, sx_base, phi in zip(x_bases, sx_bases, phis):
                total = _reduce(builder, _products(builder, values, x_base, k4, off, gw, pmadd), gw // 2)
                scale = builder.fmul(sc, builder.load(builder.gep(sx_base, [g])), flags=_FAST)
                new.append(builder.fadd(phi, builder.fmul(builder.sitofp(total, _F32), scale, flags=_FAST),
                                        flags=_FAST))
            return new

        # the groups after the last whole step, one at a time
        outs = tots if gps == 1 else _loop(builder, builder.mul(nb, ir.Constant(_I64, gps)), ng, tots,
                                           one_group, "row.tail")
        if nt == 1:
            return outs[0]
        return context.make_tuple(builder, sig.return_type, outs)
    return codegen


def _check_row(h, b, x, sx, ints) -> bool:
    return (isinstance(h, types.Array) and h.dtype == types.uint16 and h.ndim == 2
            and isinstance(b, types.Array) and b.dtype == types.uint8 and b.ndim == 2
            and isinstance(x, types.Array) and x.dtype == types.int16 and x.ndim == 2
            and isinstance(sx, types.Array) and sx.dtype == types.float32 and sx.ndim == 2
            and all(isinstance(i, types.Integer) for i in ints))


def _row_intrinsics(kind: str, gw: int):
    """``(row1, row2)`` for one format and group width: see the module docstring."""
    fmt = _Format(kind, gw)

    @intrinsic
    def row1(typingctx, h, b, r, o, osc, oz, x4, sx, t0, k4, ng):
        if not _check_row(h, b, x4, sx, (r, o, osc, oz, t0, k4, ng)):
            return None
        return types.float32(h, b, r, o, osc, oz, x4, sx, t0, k4, ng), _row_codegen(fmt, 1)

    @intrinsic
    def row2(typingctx, h, b, r, o, osc, oz, x4, sx, t0, t1, k4, ng):
        if not _check_row(h, b, x4, sx, (r, o, osc, oz, t0, t1, k4, ng)):
            return None
        return types.UniTuple(types.float32, 2)(h, b, r, o, osc, oz, x4, sx, t0, t1, k4, ng), _row_codegen(fmt, 2)

    return row1, row2


e2m1_row1, e2m1_row2 = _row_intrinsics("e2m1", 8)
u4g32_row1, u4g32_row2 = _row_intrinsics("u4", 8)
u4g64_row1, u4g64_row2 = _row_intrinsics("u4", 16)
u4g128_row1, u4g128_row2 = _row_intrinsics("u4", 32)
