"""Models that never touch the disk: tensors in a dict (e.g. a transformers model's state_dict)."""
from __future__ import annotations

import torch

from engine.checkpoint.reader import TensorSource


class DictSource(TensorSource):
    """Named tensors already in memory, on any device."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def names(self) -> set[str]:
        return set(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def get(self, name: str) -> torch.Tensor:
        return self.tensors[name]
