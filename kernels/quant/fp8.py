"""fp8 (e4m3) weights with one float32 scale per output row: ``w = q * scale[n]``.

Legend: N output rows, K reduction dim.
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` float -> ``(q float8_e4m3fn [N, K], scale float32 [N])``.

    Each row is scaled so that its largest magnitude maps to 448; all-zero rows get scale 1.
    """
    if w.dim() != 2:
        raise ValueError(f"quantize_fp8 expects a matrix [N, K], got shape {tuple(w.shape)}")
    wf = w.float()
    amax = wf.abs().amax(dim=1)                                        # [N]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = torch.clamp(wf / scale[:, None], -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``float8_e4m3fn [N, K]`` and ``float32 [N]`` -> ``[N, K]`` in ``dtype`` (computed in float32)."""
    return (q.float() * scale.float()[:, None]).to(dtype)
