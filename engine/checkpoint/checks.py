"""What a loaded tensor must be: a floating dtype the loader reads, and finite values.

Run once per tensor at load and in ``convert``, never per step. The finiteness test is one float32
reduction per tensor (NaN and Inf survive a sum); only a tensor whose sum is not finite is scanned
element by element, to tell NaN/Inf apart from huge values whose sum overflowed.
"""
from __future__ import annotations

import torch

from engine.checkpoint.reader import dtype_name
from engine.errors import ModelLoadError, UnsupportedModelError

FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def check_dtype(found: str, name: str, where: str, architecture: str) -> None:
    """Refuse a weight whose stored dtype is not floating point (or is a pre-quantised fp8 tensor)."""
    if found in FLOAT_DTYPES:
        return
    if found in FP8_DTYPES:
        from engine.checkpoint.converted import convert_command     # (it reads checkpoints through this module)
        raise UnsupportedModelError(
            f"{where}: tensor '{name}' is stored as {found} without a block scale ('{name}_scale_inv') and a "
            "quantization_config saying how to read it; Strata reads fp8 checkpoints with block scales (DeepSeek-V3, "
            "the -FP8 releases of Qwen3 and GLM-4.5) — use such a release or the model's bfloat16 one "
            f"({convert_command()} --weights fp8 makes Strata's own fp8)")
    raise ModelLoadError(
        f"{where}: tensor '{name}' is {found} but {architecture} weights are floating point "
        f"({', '.join(FLOAT_DTYPES[:3])}); the file is damaged or holds other data — fetch it again")


def all_finite(t: torch.Tensor) -> bool:
    if torch.isfinite(t.sum(dtype=torch.float32)):
        return True
    return bool(torch.isfinite(t).all())


def check_finite(t: torch.Tensor, name: str, where: str) -> None:
    """Refuse a tensor holding NaN or Inf, naming it and its file."""
    if not all_finite(t):
        bad = int((~torch.isfinite(t)).sum())
        raise ModelLoadError(f"{where}: tensor '{name}' holds {bad} NaN or infinite value{'s' * (bad != 1)}; the "
                             "weights are damaged — fetch the checkpoint again (Strata refuses to load them)")


def check_cast(source: torch.Tensor, cast: torch.Tensor, name: str, where: str) -> None:
    """Refuse a tensor that is non-finite, or that became so when cast to the compute dtype."""
    if all_finite(cast):
        return
    check_finite(source, name, where)
    peak = float(source.abs().max())
    raise ModelLoadError(f"{where}: tensor '{name}' holds values up to {peak:.3g}, beyond what "
                         f"{dtype_name(cast.dtype)} can hold; load it with dtype bfloat16 or float32 (--dtype)")
