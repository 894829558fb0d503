"""Activation-aware int4: choose each group's clipping range to minimise the error of ``x @ w.T``.

Round-to-nearest spends the 16 levels on the full ``[min, max]`` of a group; one outlier weight
then coarsens every other weight of the group. Shrinking the range clips the outlier but rounds the
rest more finely. Which wins depends on the activations that meet those weights, so the search
scores each candidate shrink ratio by the group's partial-product error on calibration inputs.

Legend: N output rows, K reduction dim, G group size, NG groups per row, M calibration rows.
"""
from __future__ import annotations

import torch

from kernels.quant.int4 import check_group_size, dequantize_int4, quantize_int4_with_range


def quantize_int4_calibrated(w: torch.Tensor, x: torch.Tensor, group_size: int = 128,
                             ratios: int = 10, min_ratio: float = 0.5,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Int4 of ``w [N, K]`` with per-group clipping searched on activations ``x [M, K]``.

    Tries ``ratios`` shrink factors from 1.0 down to ``min_ratio`` and keeps, per (row, group), the one
    with the smallest mean squared partial product error. Ratio 1.0 is plain round-to-nearest, so the
    result is never worse than :func:`quantize_int4` on ``x``. Returns the same tuple as it.
    """
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"calibration activations must be [M, {w.shape[1]}], got {tuple(x.shape)}")
    n, k = w.shape
    check_group_size(k, group_size)
    ng = k // group_size
    wg = w.float().view(n, ng, group_size)                              # [N, NG, G]
    xg = x.float().view(-1, ng, group_size)                             # [M, NG, G]
    lo, hi = wg.amin(-1), wg.amax(-1)                                   # [N, NG]
    best_err = torch.full((n, ng), float("inf"))
    best_lo, best_hi = lo.clone(), hi.clone()
    for r in torch.linspace(1.0, min_ratio, ratios).tolist():
        q, s, z = quantize_int4_with_range(w, lo * r, hi * r, group_size)
        diff = wg - dequantize_int4(q, s, z, group_size).view(n, ng, group_size)  # [N, NG, G]
        err = torch.einsum("ngk,mgk->nmg", diff, xg).pow(2).mean(1)     # [N, NG]
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_lo = torch.where(better, lo * r, best_lo)
        best_hi = torch.where(better, hi * r, best_hi)
    return quantize_int4_with_range(w, best_lo, best_hi, group_size)
