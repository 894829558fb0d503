"""Zeroed counters that a kernel's programs count their arrivals in, so that the last to finish can
combine what the others wrote (split-KV attention's splits, the router's expert blocks) without a
second launch. The last program zeroes its counter again, so one buffer serves every call; calls on a
device run one after another on its compute stream.
"""
from __future__ import annotations

import torch

_HELD: dict[tuple[str, torch.device], list[torch.Tensor]] = {}


def arrival_counts(device: torch.device, n: int, owner: str) -> torch.Tensor:
    """``[>= n] int32`` zeros on ``device`` for ``owner``'s kernel (each owner has its own). A larger
    buffer replaces a smaller one, which stays alive: a CUDA graph may have recorded it."""
    held = _HELD.setdefault((owner, device), [])
    if not held or held[-1].numel() < n:
        held.append(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
    return held[-1]
