"""Small host values onto the device without making the host wait for the device."""
from __future__ import annotations

from collections.abc import Sequence

import torch


def host_to(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A small host list as a tensor on ``device``. On CUDA it goes through page-locked memory with an
    asynchronous copy on the current stream (the caching host allocator keeps that memory until the
    copy has run), so queueing work never makes the host wait for the work queued before it."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class StagedInts:
    """A fixed int32 device buffer that the host rewrites step after step: ``send`` writes the values
    into page-locked staging and copies them asynchronously on the current stream. The staging is
    reused only once the last copy from it has run (a step later, so the wait costs nothing), and the
    device buffer keeps its address for the kernels recorded against it."""

    def __init__(self, size: int, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.tensor = torch.zeros(size, dtype=torch.int32, device=device)
        self._host = torch.zeros(size, dtype=torch.int32, pin_memory=cuda)
        self._sent = torch.cuda.Event() if cuda else None

    def send(self, values: Sequence[int]) -> None:
        """``tensor[:len(values)] <- values``, queued on the current stream."""
        n = len(values)
        if self._sent is not None:
            self._sent.synchronize()
        self._host.numpy()[:n] = values
        self.tensor[:n].copy_(self._host[:n], non_blocking=True)
        if self._sent is not None:
            self._sent.record()

