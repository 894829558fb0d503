"""A replayed decode step's kernel waits, boundedly, for a flag the host sets while following it.

The join of the host CPU's share of a MoE layer (kernels/cpu_share.py) waits this way for the host's
experts. The wait is bounded: past its limit the kernel gives up, sets ``err`` and lets the step go on
(its output is then not valid, and the host reports the step as failed), so a host that failed cannot
hang the GPU.
"""
from __future__ import annotations

from kernels._triton import jit, tl


@jit
def _clock(v, GPU: tl.constexpr):
    """Nanoseconds of the GPU's global timer (``v`` only gives the value its shape); 0 elsewhere."""
    if GPU:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [v], dtype=tl.int64,
                                         is_pure=False, pack=1)
    return v.to(tl.int64) * 0


@jit
def wait_for_flag(flag, err, limit, GPU: tl.constexpr):
    """Poll ``flag`` (int32, mapped host memory) until it is non-zero and return it, acquired at system
    scope on a GPU (what was written before it is seen after); past ``limit`` (nanoseconds on a GPU, polls
    under the interpreter) set ``err`` and return -1."""
    v = tl.load(flag, volatile=True)
    t0 = _clock(v, GPU)
    polls = t0 * 0
    while v == 0:
        v = tl.load(flag, volatile=True)
        polls += 1
        if GPU:
            late = _clock(v, GPU) - t0 > limit
        else:
            late = polls > limit
        if late:
            tl.store(err, 1)
            v = v * 0 - 1
    if GPU:
        v = tl.inline_asm_elementwise("fence.acq_rel.sys;\n mov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                      is_pure=False, pack=1)
    return v
