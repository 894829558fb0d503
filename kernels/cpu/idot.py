"""Integer dot products of packed 4-bit weights with 16-bit activations, as numba intrinsics that
emit their own vector loop.

numba types every integer product as 64-bit, so its loops cannot ask for the instruction this
kernel wants: a multiply of 16-bit lanes that adds neighbouring products into 32-bit lanes
(``pmaddwd`` on x86, from SSE2 to AVX-512; ``smlal`` on Arm). These intrinsics write the loop in LLVM
IR with vector types: products of zero-extended 4-bit codes and sign-extended 16-bit activations,
summed into 32-bit lanes that are only ever added up at the end, a pattern LLVM lowers to that
instruction on every target it knows. Integer sums are exact, so the order of the adds does not
change the result.

Layout the loops read (Legend: K reduction dim, W words of the weights):

* weights: a row of packed 4-bit codes read as 16-bit words, each word four codes of consecutive
  weights, lowest nibble first (the byte order of :mod:`kernels.quant`'s int4 packing read on a
  little-endian host);
* activations ``x4 [T, K]`` int16 in four phases: ``x4[t, p * K/4 + m] = x[t, 4m + p]``, so nibble
  ``p`` of every word meets one contiguous stream and no lane is shuffled.

``u4_dot1/2/4(h, r, o, x4, t..., xo, k4, nw)``: the sums ``sum(code * x)`` over words
``o:o + nw`` of row ``r`` of ``h`` (uint16 view of the store) against words ``xo:xo + nw`` of each
phase of token rows ``t`` of ``x4`` (phase stride ``k4``), as int32, for 1, 2 or 4 tokens that share
one unpacking of the weights. ``nw`` must be a multiple of 8 (int4 groups of 32, 64 or 128 values).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
# Words per step by token count: a loop of the first, then at most one step of each smaller width.
# More tokens take narrower steps, so that the accumulators and the unpacked codes stay in registers.
_STEPS = {1: (32, 16, 8), 2: (32, 16, 8), 4: (16, 8)}


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


def _x86_pmadd() -> dict[int, str]:
    """The x86 multiply-add intrinsics this process's code may use, by width in 16-bit lanes."""
    import llvmlite.binding as llvm
    if not llvm.get_process_triple().startswith(("x86_64", "i686", "i386")):
        return {}
    feats = llvm.get_host_cpu_features()
    out = {8: "llvm.x86.sse2.pmadd.wd"}
    if feats.get("avx2"):
        out[16] = "llvm.x86.avx2.pmadd.wd"
    if feats.get("avx512bw"):
        out[32] = "llvm.x86.avx512.pmaddw.d.512"
    return out


_PMADD = _x86_pmadd()


def _concat(builder, parts):
    while len(parts) > 1:
        n = parts[0].type.count
        mask = ir.Constant(ir.VectorType(_I32, 2 * n), list(range(2 * n)))
        parts = [builder.shuffle_vector(parts[i], parts[i + 1], mask) for i in range(0, len(parts), 2)]
    return parts[0]


def _pmadd(builder, a, b, n):
    """``a[2i] * b[2i] + a[2i+1] * b[2i+1]`` of two ``<n x i16>`` as ``<n/2 x i32>``: the x86
    instruction, in the widest form this CPU has, or the same sum in plain IR elsewhere."""
    widths = [w for w in sorted(_PMADD, reverse=True) if w <= n]
    if widths:
        w = widths[0]
        fnty = ir.FunctionType(ir.VectorType(_I32, w // 2), [ir.VectorType(_I16, w)] * 2)
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PMADD[w])
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


def _step(builder, n, w_base, x_bases, k4, off, accs):
    """One step of ``n`` words at word ``off``: each token's ``<n/2 x i32>`` accumulator plus its
    products with the four codes of every word."""
    words = _load(builder, w_base, off, n)
    mask = _splat(_I16, 15, n)
    codes = []
    for p in range(4):
        c = builder.lshr(words, _splat(_I16, 4 * p, n)) if p else words
        codes.append(builder.and_(c, mask) if p < 3 else c)
    out = []
    for x_base, acc in zip(x_bases, accs):
        for p in range(4):
            xo = builder.add(off, builder.mul(k4, ir.Constant(_I64, p))) if p else off
            acc = builder.add(acc, _pmadd(builder, codes[p], _load(builder, x_base, xo, n), n))
        out.append(acc)
    return out


def _reduce(builder, vec: ir.Value, n: int) -> ir.Value:
    mod = builder.module
    fnty = ir.FunctionType(_I32, [ir.VectorType(_I32, n)])
    fn = cgutils.get_or_insert_function(mod, fnty, f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [vec])


def _codegen(nt: int):
    def codegen(context, builder, sig, args):
        hty, xty = sig.args[0], sig.args[3]
        h = context.make_array(hty)(context, builder, args[0])
        x = context.make_array(xty)(context, builder, args[3])
        r, o = (_index(context, builder, sig.args[i], args[i]) for i in (1, 2))
        ts = [_index(context, builder, sig.args[4 + i], args[4 + i]) for i in range(nt)]
        xo, k4, nw = (_index(context, builder, sig.args[4 + nt + i], args[4 + nt + i]) for i in range(3))
        w_base = _ptr16(context, builder, hty, h, r, o)
        x_bases = [_ptr16(context, builder, xty, x, t, xo) for t in ts]

        steps = _STEPS[nt]
        n = steps[0]                      # the loop
        zero = ir.Constant(_I64, 0)
        full = builder.and_(nw, ir.Constant(_I64, ~(n - 1)))
        pre = builder.basic_block
        loop = builder.append_basic_block("u4dot.loop")
        after = builder.append_basic_block("u4dot.after")
        builder.cbranch(builder.icmp_signed(">", full, zero), loop, after)
        builder.position_at_end(loop)
        j = builder.phi(_I64)
        j.add_incoming(zero, pre)
        acc_phis = []
        for _ in range(nt):
            phi = builder.phi(ir.VectorType(_I32, n // 2))
            phi.add_incoming(_splat(_I32, 0, n // 2), pre)
            acc_phis.append(phi)
        accs = _step(builder, n, w_base, x_bases, k4, j, acc_phis)
        jn = builder.add(j, ir.Constant(_I64, n))
        j.add_incoming(jn, builder.basic_block)
        for phi, acc in zip(acc_phis, accs):
            phi.add_incoming(acc, builder.basic_block)
        builder.cbranch(builder.icmp_signed("<", jn, full), loop, after)
        builder.position_at_end(after)
        vecs = []
        for acc in accs:                  # every phi first: a block starts with its phis
            s = builder.phi(ir.VectorType(_I32, n // 2))
            s.add_incoming(_splat(_I32, 0, n // 2), pre)
            s.add_incoming(acc, loop)
            vecs.append(s)
        sums = [_reduce(builder, s, n // 2) for s in vecs]

        # at most one step of each smaller width, where the count has that bit
        off = full
        for n in steps[1:]:
            pre = builder.basic_block
            body = builder.append_basic_block(f"u4dot.step{n}")
            done = builder.append_basic_block(f"u4dot.done{n}")
            has = builder.icmp_signed("!=", builder.and_(nw, ir.Constant(_I64, n)), zero)
            builder.cbranch(has, body, done)
            builder.position_at_end(body)
            part = _step(builder, n, w_base, x_bases, k4, off, [_splat(_I32, 0, n // 2)] * nt)
            part = [builder.add(s, _reduce(builder, v, n // 2)) for s, v in zip(sums, part)]
            off_in = builder.add(off, ir.Constant(_I64, n))
            builder.branch(done)
            builder.position_at_end(done)
            merged = []
            for s, v in zip(sums, part):
                m = builder.phi(_I32)
                m.add_incoming(s, pre)
                m.add_incoming(v, body)
                merged.append(m)
            o2 = builder.phi(_I64)
            o2.add_incoming(off, pre)
            o2.add_incoming(off_in, body)
            sums, off = merged, o2
        if nt == 1:
            return sums[0]
        return context.make_tuple(builder, sig.return_type, sums)
    return codegen


def _check(h, x, ints) -> bool:
    return (isinstance(h, types.Array) and h.dtype in (types.uint16, types.int16) and h.ndim == 2
            and isinstance(x, types.Array) and x.dtype == types.int16 and x.ndim == 2
            and all(isinstance(i, types.Integer) for i in ints))


@intrinsic
def u4_dot1(typingctx, h, r, o, x4, t0, xo, k4, nw):
    if not _check(h, x4, (r, o, t0, xo, k4, nw)):
        return None
    return types.int32(h, r, o, x4, t0, xo, k4, nw), _codegen(1)


@intrinsic
def u4_dot2(typingctx, h, r, o, x4, t0, t1, xo, k4, nw):
    if not _check(h, x4, (r, o, t0, t1, xo, k4, nw)):
        return None
    return types.UniTuple(types.int32, 2)(h, r, o, x4, t0, t1, xo, k4, nw), _codegen(2)


@intrinsic
def u4_dot4(typingctx, h, r, o, x4, t0, t1, t2, t3, xo, k4, nw):
    if not _check(h, x4, (r, o, t0, t1, t2, t3, xo, k4, nw)):
        return None
    return types.UniTuple(types.int32, 4)(h, r, o, x4, t0, t1, t2, t3, xo, k4, nw), _codegen(4)
