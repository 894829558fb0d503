"""MXFP4 (OCP microscaling FP4): e2m1 values, two per byte, with one e8m0 scale per 32 values.

This is how gpt-oss ships its experts (``*_blocks`` / ``*_scales``). Byte layout, the same nibble
order as int4 (:mod:`kernels.expert_layout`): byte ``j`` of a row holds element ``k = 2j`` in its low
nibble and ``k = 2j + 1`` in its high nibble. A nibble is sign (bit 3), exponent (bits 2-1) and
mantissa (bit 0): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. Scale byte ``s`` means ``2 ** (s - 127)``;
``w = value * 2 ** (s - 127)``.

Legend: N output rows, K reduction dim (a multiple of 32), NG = K / 32 groups per row.
"""
from __future__ import annotations

import torch

MXFP4_GROUP = 32
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)   # round-to-nearest boundaries between magnitudes


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``uint8 [N, K/2]`` values and ``uint8 [N, K/32]`` scales -> ``[N, K]`` in ``dtype`` (exact in float32)."""
    n, kh = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    vals = torch.empty(n, kh, 2, dtype=torch.float32, device=blocks.device)
    vals[..., 0] = lut[(blocks & 0xF).long()]
    vals[..., 1] = lut[(blocks >> 4).long()]
    vals = vals.view(n, -1, MXFP4_GROUP)                                 # [N, NG, 32]
    exp = scales.to(torch.int32) - 127                                   # [N, NG]
    return torch.ldexp(vals, exp[..., None]).view(n, 2 * kh).to(dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> ``(blocks uint8 [N, K/2], scales uint8 [N, K/32])``.

    Each group's scale is the smallest power of two that puts its largest magnitude at or below 6,
    and values round to the nearest e2m1 value (for tests, benchmarks and conversion)."""
    if w.dim() != 2 or w.shape[1] % MXFP4_GROUP:
        raise ValueError(f"quantize_mxfp4 expects [N, K] with K a multiple of {MXFP4_GROUP}, got {tuple(w.shape)}")
    n, k = w.shape
    wg = w.float().contiguous().reshape(n, k // MXFP4_GROUP, MXFP4_GROUP)   # [N, NG, 32]
    amax = wg.abs().amax(-1)                                             # [N, NG]
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0))
    exp = exp.clamp(-127, 127)
    scaled = wg / torch.ldexp(torch.ones_like(amax), exp.to(torch.int32))[..., None]
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=w.device)
    mag = torch.bucketize(scaled.abs().clamp(max=6.0), mids)             # 0..7, ties to the larger
    code = (mag | ((scaled < 0).to(torch.int64) << 3)).to(torch.uint8).view(n, k)
    blocks = (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous()
    return blocks, (exp + 127).to(torch.uint8)
