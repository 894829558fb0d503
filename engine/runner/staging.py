"""Host staging: what a step reads back (sampled tokens, logprobs) lands in page-locked host buffers.

A CUDA step's results are copied to the host asynchronously, into views of buffers that live as long as
the runner: a buffer grows only when a step needs more room, so in steady state no step allocates and the
host addresses stay stable (CUDA graphs' sampling tails copy into them). On the CPU the tensors are
already on the host and are returned as they are.
"""
from __future__ import annotations

import torch

MIN_ROOM = 64          # elements a buffer holds at least, so small batches never regrow it


class HostStaging:
    """Named host buffers for a step's read-back, and the event that says when they are filled.

    ``copies``: stage into buffers (a device whose tensors are not host memory); ``pinned``: page-lock
    them, so the copies are asynchronous (CUDA). Read a staged view only after :meth:`wait`.
    """

    def __init__(self, copies: bool, pinned: bool) -> None:
        self.copies, self.pinned = copies, pinned
        self._buffers: dict[str, torch.Tensor] = {}     # key -> 1-D buffer of at least MIN_ROOM elements
        self._ready: torch.cuda.Event | None = None

    @classmethod
    def for_device(cls, device: torch.device) -> "HostStaging":
        on_cuda = device.type == "cuda"
        return cls(copies=on_cuda, pinned=on_cuda)

    def stage(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the host: itself without copies; else a view (shape of ``t``) of buffer ``key`` that an
        asynchronous copy fills, valid after :meth:`wait`."""
        if not self.copies:
            return t
        n = t.numel()
        buf = self._buffers.get(key)
        if buf is None or buf.dtype != t.dtype or buf.numel() < n:
            buf = self._buffers[key] = torch.empty(max(n, MIN_ROOM), dtype=t.dtype, pin_memory=self.pinned)
        view = buf[:n].view(t.shape)
        view.copy_(t, non_blocking=True)
        return view

    def mark(self) -> None:
        """Record, on the current CUDA stream, the point after the copies queued so far (CUDA only)."""
        if not self.pinned:
            return
        if self._ready is None:
            self._ready = torch.cuda.Event()
        self._ready.record()

    def wait(self) -> None:
        """Block the host until the copies queued before :meth:`mark` have landed."""
        if self._ready is not None:
            self._ready.synchronize()

    def buffer(self, key: str) -> torch.Tensor | None:
        """Buffer ``key`` as it stands (None before its first stage): for checking it stays put."""
        return self._buffers.get(key)
