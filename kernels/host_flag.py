"""A replayed decode step waits for copies the host issued while following it.

In a direct-read decode step recorded in one CUDA graph, a layer's missing experts can be copied in by
the copy engine rather than by the gather's copy kernel (engine/experts/gather.py, ``gather_copies``
"copy_engine"): the host, following the step, sees the layer's publish, queues the copies on a stream
of its own and then :func:`set_flag` on that stream; :func:`wait_flag`, recorded where the copy kernel
would be, holds the layer's MoE kernels until the flag is set. A layer with nothing to copy (the
publish kernel's ``work`` count is 0) passes at once.

The wait is bounded: past ``limit_s`` the kernel gives up, sets ``err`` and lets the step go on (its
output is then not valid, and the host reports the step as failed), so a host that failed cannot hang
the GPU; once ``err`` is set the step's later waits pass at once.
"""
from __future__ import annotations

import time

import torch

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


@jit
def _wait_kernel(flag, err, work, limit, GPU: tl.constexpr):
    if (tl.load(work) > 0) & (tl.load(err, volatile=True) == 0):
        wait_for_flag(flag, err, limit, GPU)


@jit
def _set_kernel(flag, GPU: tl.constexpr):
    v = tl.load(flag, volatile=True) * 0 + 1
    if GPU:  # release at system scope: whoever sees the flag sees the copies queued before it
        v = tl.inline_asm_elementwise("fence.acq_rel.sys;\n mov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                      is_pure=False, pack=1)
    tl.store(flag, v)


def wait_flag(flag: torch.Tensor, err: torch.Tensor, work: torch.Tensor, limit_s: float = 10.0) -> None:
    """Device work only (graph-capturable): where ``work[0]`` (int64, on the device) is non-zero, wait
    until ``flag`` (int32 [1], mapped host memory) is non-zero; past ``limit_s`` seconds ``err`` (int32
    [1]) <- 1 and the wait ends."""
    gpu = work.device.type == "cuda"
    limit = int(limit_s * 1e9) if gpu else max(1, int(limit_s * 1e4))
    _wait_kernel[(1,)](flag, err, work, limit, GPU=gpu, num_warps=1)


def set_flag(flag: torch.Tensor, device: torch.device) -> None:
    """``flag`` (int32 [1], mapped host memory) <- 1 on ``device``'s current stream, after the work queued
    on it before."""
    gpu = device.type == "cuda"
    _set_kernel[(1,)](flag, GPU=gpu, num_warps=1)


def wait_flag_ref(flag: torch.Tensor, err: torch.Tensor, work: torch.Tensor, limit_s: float = 10.0) -> None:
    """:func:`wait_flag` in plain torch (the calling thread polls)."""
    if int(work[0]) == 0 or int(err.view(-1)[0]) != 0:
        return
    deadline = time.monotonic() + limit_s
    while int(flag.view(-1)[0]) == 0:
        if time.monotonic() > deadline:
            err.fill_(1)
            return
        time.sleep(0)


def set_flag_ref(flag: torch.Tensor, device: torch.device) -> None:
    """:func:`set_flag` in plain torch."""
    flag.fill_(1)
