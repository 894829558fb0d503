"""The plain-torch RMSNorm and rotary rotation that the model's reference path and the fused decode
kernels' references share.

Legend: T tokens, N normalised width, hd head dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, scaled in the input dtype. x [..., N], weight [N]."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)              # one fused op, same arithmetic
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, hd] rotated by gathered cos / sin tables [T, 1, hd] (rotate-half convention, the
    sign of the rotation carried by the sine table)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin
