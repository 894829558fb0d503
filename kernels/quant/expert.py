"""Quantise one routed expert into the tensors of its :class:`ExpertLayout`, and read them back.

``quantize_expert`` returns exactly the dict ``layout.pack`` takes; ``dequantize_expert_matrix``
rebuilds one dense matrix of one pool slot (the reference path and tests use it; kernels never do).
"""
from __future__ import annotations

import torch

from kernels.expert_layout import DENSE_DTYPES, ExpertLayout
from kernels.quant.fp8 import dequantize_fp8, quantize_fp8
from kernels.quant.int4 import dequantize_int4, quantize_int4
from kernels.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4


def quantize_matrix(w: torch.Tensor, name: str, layout: ExpertLayout) -> dict[str, torch.Tensor]:
    """Tensors named ``name``, ``name_scale``, ``name_zero`` (as the format needs) for ``w [N, K]``."""
    if layout.fmt in DENSE_DTYPES:
        return {name: w.to(DENSE_DTYPES[layout.fmt]).contiguous()}
    if layout.fmt == "fp8":
        q, scale = quantize_fp8(w)
        return {name: q, f"{name}_scale": scale}
    if layout.fmt == "mxfp4":
        blocks, scales = quantize_mxfp4(w)
        return {name: blocks, f"{name}_scale": scales}
    q, scale, zero = quantize_int4(w, layout.group_size)
    return {name: q, f"{name}_scale": scale, f"{name}_zero": zero}


def quantize_expert(w13: torch.Tensor, w2: torch.Tensor, layout: ExpertLayout, b13: torch.Tensor | None = None,
                    b2: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One expert's ``w13 [2F, D]`` and ``w2 [D, F]`` in ``layout``'s format, ready for ``layout.pack``;
    with ``layout.bias`` also its biases ``b13 [2F]`` and ``b2 [D]`` (kept in float32)."""
    want = {"w13": (2 * layout.ffn, layout.hidden), "w2": (layout.hidden, layout.ffn)}
    for name, w in (("w13", w13), ("w2", w2)):
        if tuple(w.shape) != want[name]:
            raise ValueError(f"{name}: expected shape {want[name]} for this layout, got {tuple(w.shape)}")
    out = {**quantize_matrix(w13, "w13", layout), **quantize_matrix(w2, "w2", layout)}
    if layout.bias:
        if b13 is None or b2 is None:
            raise ValueError("this layout carries expert biases: pass b13 [2F] and b2 [D]")
        out |= {"w13_bias": b13.to(torch.float32).reshape(2 * layout.ffn), "w2_bias": b2.to(torch.float32).reshape(layout.hidden)}
    return out


def dequantize_expert_matrix(views: dict[str, torch.Tensor], name: str, slot: int,
                             layout: ExpertLayout, dtype: torch.dtype) -> torch.Tensor:
    """Dense ``name`` (``"w13"`` or ``"w2"``) of the expert in pool ``slot``, in ``dtype``."""
    if layout.fmt in DENSE_DTYPES:
        return views[name][slot].to(dtype)
    if layout.fmt == "fp8":
        return dequantize_fp8(views[name][slot], views[f"{name}_scale"][slot], dtype)
    if layout.fmt == "mxfp4":
        return dequantize_mxfp4(views[name][slot], views[f"{name}_scale"][slot], dtype)
    return dequantize_int4(views[name][slot], views[f"{name}_scale"][slot], views[f"{name}_zero"][slot],
                           layout.group_size, dtype)
