"""Where a replayed decode step takes back the host CPU's share of a MoE layer.

A direct-read decode step recorded in one CUDA graph can hand some of a layer's missing experts to
the host CPU (engine/experts/cold.py): the layer's publish kernel (:func:`kernels.publish_ids.
publish_direct`) marks them ``SLOT_CPU`` in the slot-table snapshot, so the MoE kernels skip them, and
hands ``x`` and the routing weights to the host. The host computes their sum into mapped host memory
and sets a flag; :func:`cpu_share_join`, recorded after the layer's MoE kernels, waits for that flag
and adds the sum to the layer's output. A layer without such experts passes straight through.

The wait is bounded: past ``limit_s`` the kernel gives up, sets ``err`` and adds nothing, so a host
that failed without setting the flag cannot hang the GPU (the host then reports the step as failed);
once ``err`` is set the step's later joins pass without waiting.

Legend: T tokens (the recording's), k experts per token, D hidden, N = T * k pairs.
"""
from __future__ import annotations

import time

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.host_flag import wait_for_flag
from kernels.publish_ids import SLOT_CPU

_BLOCK_D = 1024


@jit
def _join_kernel(out, ids, snap_row, flag, cpu_out, err, N, T, D, stride_o, limit, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, GPU: tl.constexpr):
    # Every program (a block of D) waits for the flag, then adds its block of every token's row.
    # ``limit``: nanoseconds on a GPU, polls under the interpreter.
    i = tl.arange(0, BLOCK_N)
    slots = tl.load(snap_row + tl.load(ids + i, mask=i < N, other=0), mask=i < N, other=0)
    # SLOT_CPU; after one join of the step gave up, the rest pass at once (the step has failed)
    if (tl.sum((slots == -3).to(tl.int32), axis=0) > 0) & (tl.load(err, volatile=True) == 0):
        v = wait_for_flag(flag, err, limit, GPU)              # acquired: the sum is read after the flag
        if v > 0:
            d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
            ok = d < D
            for t in range(T):
                c = tl.load(cpu_out + t * D + d, mask=ok, other=0.0, volatile=True)     # fresh from the host
                o = tl.load(out + t * stride_o + d, mask=ok, other=0.0)
                tl.store(out + t * stride_o + d, (o.to(tl.float32) + c).to(out.dtype.element_ty), mask=ok)


def cpu_share_join(out: torch.Tensor, ids: torch.Tensor, snap_row: torch.Tensor, flag: torch.Tensor,
                   cpu_out: torch.Tensor, err: torch.Tensor, limit_s: float = 10.0) -> torch.Tensor:
    """Device work only (graph-capturable): when any of ``ids`` (``[T, k]``) has ``SLOT_CPU`` in
    ``snap_row`` ([E] int32), wait until ``flag`` (int32 [1], mapped host memory) is non-zero, then
    ``out [T, D] += cpu_out`` (float32 ``[T * D]``, mapped host memory) in place. Past ``limit_s``
    seconds of waiting: ``err`` (int32 [1]) <- 1 and ``out`` unchanged. Returns ``out``."""
    t, d = out.shape
    n = ids.numel()
    if cpu_out.numel() < t * d:
        raise ValueError(f"the host's share holds {cpu_out.numel()} floats; out [{t}, {d}] needs {t * d}")
    gpu = out.device.type == "cuda"
    limit = int(limit_s * 1e9) if gpu else max(1, int(limit_s * 1e4))
    _join_kernel[(cdiv(d, _BLOCK_D),)](out, ids, snap_row, flag, cpu_out, err, n, t, d, out.stride(0), limit,
                                       BLOCK_N=next_pow2(max(n, 1)), BLOCK_D=_BLOCK_D, GPU=gpu)
    return out


def cpu_share_join_ref(out: torch.Tensor, ids: torch.Tensor, snap_row: torch.Tensor, flag: torch.Tensor,
                       cpu_out: torch.Tensor, err: torch.Tensor, limit_s: float = 10.0) -> torch.Tensor:
    """:func:`cpu_share_join` in plain torch (the host's thread waits, polling)."""
    if not bool((snap_row[ids.reshape(-1).long()] == SLOT_CPU).any()) or int(err.view(-1)[0]) != 0:
        return out
    deadline = time.monotonic() + limit_s
    while int(flag.view(-1)[0]) == 0:
        if time.monotonic() > deadline:
            err.fill_(1)
            return out
        time.sleep(0)
    t, d = out.shape
    out.copy_((out.float() + cpu_out[:t * d].view(t, d).to(out.device)).to(out.dtype))
    return out
