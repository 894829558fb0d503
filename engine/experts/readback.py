"""Reading routing ids back to the host without the copy engines.

A device-to-host ``.cpu()`` of the ids is a DMA, and DMA queues can be shared with the expert
copies in flight: the read of a few bytes then waits behind megabytes of prefetch traffic. On CUDA
we instead let a tiny kernel store the ids straight into mapped pinned host memory, wait for that
kernel's event (a counted sync on the compute stream only), and copy them out. If the kernel
cannot run here the reader falls back to ``.cpu()`` for good. On the CPU it is ``.cpu()``.
"""
from __future__ import annotations

import torch

_BLOCK = 1024


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _store_ids_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    return _store_ids_kernel


class HostReader:
    """``read(t)``: an int64 device tensor ``[N]`` as a CPU tensor, synchronising the compute stream only."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.zero_copy = device.type == "cuda"
        self._buf: torch.Tensor | None = None       # int64 [capacity], pinned and mapped
        self._fn = None

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """Copy of ``t`` (int64, contiguous, 1-D) on the host."""
        if not self.zero_copy:
            return t.cpu()
        n = t.numel()
        if self._buf is None or self._buf.numel() < n:
            self._buf = torch.empty(max(n, 4096), dtype=torch.int64, pin_memory=True)
        try:
            if self._fn is None:
                self._fn = _kernel()
            self._fn[(triton_cdiv(n, _BLOCK),)](t, self._buf, n, BLOCK=_BLOCK)
        except Exception:     # no Triton, or mapped host memory refused: the DMA read still works
            self.zero_copy = False
            return t.cpu()
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
        return self._buf[:n].clone()


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
