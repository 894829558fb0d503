"""Pointer and stride arguments of one expert matrix in the pool, and the per-call constants of the
MoE GEMM kernels.

The kernels read ``w[slot]`` (and its scale/zero/bias) straight from the typed pool views; slots live
in one uint8 buffer, so ``stride(0)`` is the slot size and is passed to the kernel as is.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.expert_layout import DENSE_DTYPES, ExpertAct, ExpertLayout

FMT_DENSE, FMT_FP8, FMT_INT4, FMT_MXFP4 = 0, 1, 2, 3
ACT_SILU, ACT_SWIGLU_OAI = 0, 1
_FORMATS = {"fp8": FMT_FP8, "int4": FMT_INT4, "mxfp4": FMT_MXFP4}


@dataclass(frozen=True)
class ExpertFormat:
    """What every MoE kernel of one call is compiled for, read from the expert layout: the weight
    format (``FMT_*``), its group size along K (int4, mxfp4), the activation (``ACT_*``, with
    swiglu_oai's ``alpha`` and ``limit``) and whether the experts carry biases."""

    fmt: int
    group: int
    act: int = ACT_SILU
    alpha: float = 1.702
    limit: float = 7.0
    bias: bool = False

    @property
    def epi(self) -> tuple:
        """The kernels' epilogue constexpr ``(act, alpha, limit, bias)``."""
        return (self.act, self.alpha, self.limit, self.bias)


def expert_format(layout: ExpertLayout) -> ExpertFormat:
    """:class:`ExpertFormat` of ``layout``; silu layouts share one (alpha and limit do not apply)."""
    act = layout.act if layout.act.kind == "swiglu_oai" else ExpertAct()
    return ExpertFormat(format_code(layout), layout.group_size, ACT_SWIGLU_OAI if act.kind == "swiglu_oai" else ACT_SILU,
                     float(act.alpha), float(act.limit), layout.bias)


@dataclass(frozen=True)
class PoolMatrix:
    """One matrix (``w13`` or ``w2``) of every slot: ``w [S, N, K or K/2]`` plus scale/zero views."""

    w: torch.Tensor
    scale: torch.Tensor      # fp8: [S, N] f32; int4: [S, N, K/G] f16; mxfp4: [S, N, K/32] u8; dense: w (unused)
    zero: torch.Tensor       # int4: [S, N, K/G] u8; otherwise w itself (unused)
    n: int                   # output rows
    k: int                   # reduction length in elements
    bias: torch.Tensor | None = None   # [S, N] f32 with the layout's biases

    def args(self) -> tuple:
        """``(w, w_stride_slot, w_stride_row, scale, zero, scale_stride_slot, zero_stride_slot,
        scale_stride_row)``; scale and zero share their row stride (checked by :func:`pool_matrix`)."""
        s0, s1 = (self.scale.stride(0), self.scale.stride(1)) if self.scale is not self.w else (0, 0)
        z0 = self.zero.stride(0) if self.zero is not self.w else 0
        return (self.w, self.w.stride(0), self.w.stride(1), self.scale, self.zero, s0, z0, s1)

    def bias_args(self) -> tuple:
        """``(bias, bias_stride_slot)``; without biases ``(w, 0)`` (never read)."""
        return (self.w, 0) if self.bias is None else (self.bias, self.bias.stride(0))


def format_code(layout: ExpertLayout) -> int:
    """Kernel constant for ``layout.fmt``."""
    return FMT_DENSE if layout.fmt in DENSE_DTYPES else _FORMATS[layout.fmt]


def pool_matrix(views: dict[str, torch.Tensor], name: str, layout: ExpertLayout) -> PoolMatrix:
    """Check the views of ``name`` against ``layout`` and wrap them for a kernel launch."""
    spec = layout.slice(name)
    w = views[name]
    n, k = (2 * layout.ffn, layout.hidden) if name == "w13" else (layout.hidden, layout.ffn)
    if w.dim() != 3 or tuple(w.shape[1:]) != spec.shape or w.dtype != spec.dtype:
        raise ValueError(f"pool view {name} must be {spec.dtype} [S, {', '.join(map(str, spec.shape))}], "
                         f"got {w.dtype} {tuple(w.shape)}")
    if w.stride(2) != 1 or w.stride(1) != spec.shape[1]:
        raise ValueError(f"pool view {name} must have contiguous rows (strides [*, {spec.shape[1]}, 1]), "
                         f"got {w.stride()}")
    scale = views.get(f"{name}_scale", w)
    zero = views.get(f"{name}_zero", w)
    if layout.fmt == "int4" and scale.stride()[1:] != zero.stride()[1:]:
        raise ValueError(f"{name}_scale and {name}_zero views must have the same row strides")
    bias = views[f"{name}_bias"] if layout.bias else None
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape[1:]) != (n,) or bias.stride(1) != 1):
        raise ValueError(f"pool view {name}_bias must be contiguous float32 [S, {n}], got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    return PoolMatrix(w, scale, zero, n, k, bias)


@dataclass(frozen=True)
class HostExperts:
    """Where a layer's experts without a pool slot (slot -1) are read from: typed views over the host
    store's rows ``[L * E, ...]`` (mapped into the GPU's address space on CUDA) and the store row of
    the layer's expert 0, ``layer * E``. The views have the pool views' strides, so one set of
    strides addresses both. ``fill`` (optional): for each expert, the pool slot that the kernels
    reading it from the store write it into as they read it (-1: none), so that it is resident for
    the next step without a second trip over the bus."""

    views: dict[str, torch.Tensor]
    row_base: int
    fill: torch.Tensor | None = None   # [E] int32 on the device: pool slot to write a read expert into, or -1


def host_matrices(host: HostExperts, layout: ExpertLayout, w13: PoolMatrix,
                  w2: PoolMatrix) -> tuple[PoolMatrix, PoolMatrix, int, torch.Tensor | None]:
    """``(w13, w2, row_base, fill)`` of the host store for a kernel launch, checked against the pool's
    strides."""
    out = []
    for name, pool in (("w13", w13), ("w2", w2)):
        m = pool_matrix(host.views, name, layout)
        for a, b in ((m.w, pool.w), (m.scale, pool.scale), (m.zero, pool.zero), (m.bias, pool.bias)):
            if a is None:
                continue
            if a.stride() != b.stride():
                raise ValueError(f"host store view {name} has strides {a.stride()} but the pool's are "
                                 f"{b.stride()}; both must come from the same ExpertLayout")
        out.append(m)
    if host.fill is not None and (host.fill.dtype != torch.int32 or host.fill.dim() != 1
                                  or host.fill.device != w13.w.device):
        raise ValueError(f"the fill row must be int32 [E] on {w13.w.device}, got {host.fill.dtype} "
                         f"{tuple(host.fill.shape)} on {host.fill.device}")
    return out[0], out[1], host.row_base, host.fill
