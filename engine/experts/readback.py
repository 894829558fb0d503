"""Reading routing ids back to the host without the copy engines.

A device-to-host ``.cpu()`` of the ids is a DMA, and DMA queues can be shared with the expert
copies in flight: the read of a few bytes then waits behind megabytes of prefetch traffic. On CUDA
we instead let a tiny kernel store the ids straight into mapped pinned host memory, wait for that
kernel's event (a counted sync on the compute stream only), and copy them out. If the kernel
cannot run here the reader falls back to a DMA into the same pinned buffer for good. On the CPU
it is ``.cpu()``. A decode step replayed from CUDA graphs records the store kernel inside its
graphs (``publish``), so the host only waits (``wait``) and reads.
"""
from __future__ import annotations

import torch

from kernels.publish_ids import store_ids


class HostReader:
    """``read(t)``: an int64 device tensor ``[N]`` as a CPU tensor, synchronising the compute stream only.

    ``publish(t, region)`` is the device half alone (it can be recorded in a CUDA graph): ``t`` lands
    in the pinned host tensor ``region``; ``wait()`` is the host half, after which it can be read.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.zero_copy = device.type == "cuda"
        self._buf: torch.Tensor | None = None       # int64 [capacity], pinned and mapped
        self._done: torch.cuda.Event | None = None

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """Copy of ``t`` (int64, contiguous, 1-D) on the host."""
        if self.device.type != "cuda":
            return t.cpu()
        n = t.numel()
        if self._buf is None or self._buf.numel() < n:
            self._buf = pinned_ids(max(n, 4096))
        self.publish(t, self._buf)
        self.wait()
        return self._buf[:n].clone()

    def publish(self, t: torch.Tensor, region: torch.Tensor) -> None:
        """Write ``t`` (int64 [N], on the device) into ``region`` (pinned int64, at least N) without a sync."""
        n = t.numel()
        if self.zero_copy:
            try:
                store_ids(t, region)
                return
            except Exception:   # no Triton, or mapped host memory refused: the DMA still works
                self.zero_copy = False
        region[:n].copy_(t, non_blocking=True)

    def wait(self) -> None:
        """Block the host until the compute stream's work so far (the last publish included) is done."""
        if self.device.type == "cuda":
            if self._done is None:
                self._done = torch.cuda.Event()    # one event, recorded again each time
            self._done.record()
            self._done.synchronize()


def pinned_ids(n: int) -> torch.Tensor:
    """int64 [n] page-locked host memory (mapped into the GPU's address space under UVA)."""
    return torch.empty(n, dtype=torch.int64, pin_memory=True)
