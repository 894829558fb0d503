"""Checkpoints that ship their matrices in fp8 with block scales (``quant_method: fp8`` with
``weight_block_size``): DeepSeek-V3 / R1, the -FP8 releases of Qwen3 and GLM-4.5.

Such a matrix ``W [N, K]`` is stored as e4m3 values beside ``<name>_scale_inv``, one float32 scale per
block of ``rows x cols`` values (``[ceil(N / rows), ceil(K / cols)]``): ``W = values x scale`` of the
value's block. :class:`Fp8BlockSource` reads such a checkpoint as if it were dense: each of these
matrices dequantised to float32 when it is read (one matrix at a time, at load or in ``convert``), the
scales hidden, every other tensor as stored. What the load makes of them is then what it makes of any
checkpoint: resident weights in the compute dtype (or 8 bits with ``--resident-weights``), experts in the
chosen format (Strata's fp8 by default: engine/placement.expert_layout).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.checkpoint.reader import TensorSource, dtype_name
from engine.errors import ModelLoadError

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec
    from kernels.qlinear import QuantWeight

SCALE_SUFFIX = "_scale_inv"


def dequantise_blocks(values: torch.Tensor, scales: torch.Tensor, block: tuple[int, int], name: str,
                      where: str) -> torch.Tensor:
    """``values [N, K]`` e4m3 times each block's scale (``scales [ceil(N / rows), ceil(K / cols)]``) as float32."""
    if values.dim() != 2 or values.dtype != torch.float8_e4m3fn:
        raise ModelLoadError(f"{where}: tensor '{name}' has a block scale beside it but is {dtype_name(values.dtype)} "
                             f"{list(values.shape)}, not an e4m3 matrix; the checkpoint is damaged — fetch it again")
    rows, cols = block
    n, k = values.shape
    want = (-(-n // rows), -(-k // cols))
    if tuple(scales.shape) != want:
        raise ModelLoadError(f"{where}: tensor '{name}{SCALE_SUFFIX}' has shape {list(scales.shape)} but a {n} x {k} "
                             f"matrix in blocks of {rows} x {cols} needs {list(want)}; the weights do not match "
                             "config.json's weight_block_size")
    if not bool(torch.isfinite(scales).all()) or bool((scales <= 0).any()):
        raise ModelLoadError(f"{where}: tensor '{name}{SCALE_SUFFIX}' holds scales that are not finite numbers above "
                             "0; the file is damaged — fetch it again")
    full = scales.float().repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]   # [N, K]
    return values.float() * full


class Fp8BlockSource(TensorSource):
    """``source`` with its block-scaled e4m3 matrices read dequantised (float32) and their scales hidden."""

    def __init__(self, source: TensorSource, block: tuple[int, int]) -> None:
        self.source, self.block = source, block
        self.dir = getattr(source, "dir", None)
        names = source.names()
        self._scaled = {n for n in names if n + SCALE_SUFFIX in names}
        self._names = names - {n + SCALE_SUFFIX for n in self._scaled}

    def names(self) -> set[str]:
        return self._names

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def dtype(self, name: str) -> str:
        return "float32" if name in self._scaled else self.source.dtype(name)

    def get(self, name: str) -> torch.Tensor:
        values = self.source.get(name)
        if name not in self._scaled:
            return values
        where = str(self.source.file_of(name) or "checkpoint")
        return dequantise_blocks(values, self.source.get(name + SCALE_SUFFIX), self.block, name, where)

    def file_of(self, name: str) -> Path | None:
        return self.source.file_of(name)

    def stored_quant(self, name: str, fmt: str) -> "QuantWeight | None":
        return self.source.stored_quant(name, fmt)


def with_fp8_blocks(source: TensorSource, spec: ModelSpec) -> TensorSource:
    """``source`` read through :class:`Fp8BlockSource` where the checkpoint ships fp8 with block scales."""
    if spec.expert_storage != "fp8" or not any(n.endswith(SCALE_SUFFIX) for n in source.names()):
        return source
    return Fp8BlockSource(source, spec.weight_block)
