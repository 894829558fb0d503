"""Asymmetric 4-bit weights: per output row, per group of ``G`` along K, two values per byte.

Byte layout (the contract of :mod:`kernels.expert_layout`): byte ``j`` of a row holds element
``k = 2j`` in its low nibble and ``k = 2j + 1`` in its high nibble. Each group has a float16 scale
and a uint8 zero point in 0..15; ``w = (q - zero) * scale``.

The quantisation range of a group always includes 0 (``[min(lo, 0), max(hi, 0)]``) so that the
integer zero point lies in 0..15 and no group ever needs clamping by more than rounding.

Legend: N output rows, K reduction dim, G group size, NG = K / G groups per row.
"""
from __future__ import annotations

import torch

from kernels.errors import ConfigError

INT4_GROUP_SIZES = (32, 64, 128)
_QMAX = 15


def check_group_size(k: int, group_size: int) -> None:
    """Raise :class:`ConfigError` unless ``group_size`` is supported and divides ``k``."""
    if group_size not in INT4_GROUP_SIZES:
        raise ConfigError(f"int4 group size {group_size} is not supported; choose 32, 64 or 128")
    if k % group_size:
        raise ConfigError(f"int4 group size {group_size} does not divide the reduction dim {k}; "
                          "choose a group size of 32, 64 or 128 that divides it")


def int4_params(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float16 scale and uint8 zero of groups whose values span ``[lo, hi]`` (any shape, float32)."""
    lo = torch.clamp(lo, max=0.0)
    hi = torch.clamp(hi, min=0.0)
    scale = ((hi - lo) / _QMAX).to(torch.float16)
    if torch.isinf(scale).any():
        raise ConfigError("a weight group spans more than float16 can scale; the checkpoint holds "
                          "non-finite or huge weights, so convert it with --weights fp8 or bf16")
    # Zero-range guard: an all-zero (or float16-underflowing) group gets scale 1, so q == zero.
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = torch.clamp(torch.round(-lo / scale.float()), 0, _QMAX).to(torch.uint8)
    return scale, zero


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """``uint8 [N, K]`` values 0..15 -> ``uint8 [N, K/2]``, even k in the low nibble."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``uint8 [N, K/2]`` -> ``uint8 [N, K]`` values 0..15 (inverse of :func:`pack_nibbles`)."""
    n, kh = packed.shape
    out = torch.empty(n, kh, 2, dtype=torch.uint8, device=packed.device)
    out[..., 0] = packed & 0xF
    out[..., 1] = packed >> 4
    return out.view(n, 2 * kh)


def quantize_int4_with_range(w: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                             group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise ``w [N, K]`` with the given per-group range ``lo, hi [N, K/G]`` (values outside clip)."""
    n, k = w.shape
    scale, zero = int4_params(lo.float(), hi.float())                  # [N, NG]
    wg = w.float().view(n, k // group_size, group_size)                # [N, NG, G]
    q = torch.round(wg / scale.float()[..., None]) + zero.float()[..., None]
    q = torch.clamp(q, 0, _QMAX).to(torch.uint8).view(n, k)            # [N, K]
    return pack_nibbles(q), scale, zero


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric int4 of ``w [N, K]`` (float).

    Returns ``(q uint8 [N, K/2], scale float16 [N, K/G], zero uint8 [N, K/G])``.
    """
    if w.dim() != 2:
        raise ValueError(f"quantize_int4 expects a matrix [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    check_group_size(k, group_size)
    wg = w.float().view(n, k // group_size, group_size)                # [N, NG, G]
    return quantize_int4_with_range(w, wg.amin(-1), wg.amax(-1), group_size)


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``uint8 [N, K/2]`` + ``scale/zero [N, K/G]`` -> ``[N, K]`` in ``dtype`` (computed in float32)."""
    vals = unpack_nibbles(q).float()                                   # [N, K]
    n, k = vals.shape
    vals = vals.view(n, k // group_size, group_size)                   # [N, NG, G]
    w = (vals - zero.float()[..., None]) * scale.float()[..., None]
    return w.view(n, k).to(dtype)
