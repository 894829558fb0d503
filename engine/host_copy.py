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
