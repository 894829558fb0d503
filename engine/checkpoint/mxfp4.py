"""Routed experts shipped as MXFP4 (gpt-oss): ``*_blocks`` / ``*_scales`` into the host rows, one expert at a time.

Legend: E experts, D hidden, F expert FFN, N output rows, K reduction dim, NG = K / 32 scale groups.

A layer stores, under the family's fused names (``{p}.experts.gate_up_proj`` and ``{p}.experts.down_proj``):

* ``gate_up_proj_blocks`` uint8 ``[E, 2F, D/32, 16]`` and ``gate_up_proj_scales`` uint8 ``[E, 2F, D/32]``;
* ``down_proj_blocks`` uint8 ``[E, D, F/32, 16]`` and ``down_proj_scales`` uint8 ``[E, D, F/32]``;
* ``gate_up_proj_bias`` ``[E, 2F]`` and ``down_proj_bias`` ``[E, D]`` (floating point).

Rows are output features (``[N, K]``); a row's 16-byte blocks flattened are the ``[K/2]`` bytes of
:mod:`kernels.quant.mxfp4` (low nibble = even k). gate_up rows alternate gate, up, gate, up: row ``2j`` is
gate ``j`` and row ``2j + 1`` up ``j``. Strata's layout wants gate rows ``0..F-1`` then up rows ``F..2F-1``,
so the rows of blocks, scales and bias are permuted — the bytes themselves are kept.

Each expert is read on its own (a safetensors slice of the leading dim), so packing a layer holds one
expert's bytes at a time — and, only when another format is asked for, one expert's float32 matrices.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.checkpoint.checks import check_dtype, check_finite
from engine.checkpoint.reader import TensorSource
from engine.checkpoint.spec import ModelSpec
from engine.errors import ModelLoadError
from kernels.expert_layout import ExpertLayout
from kernels.quant.expert import quantize_expert
from kernels.quant.mxfp4 import MXFP4_GROUP, dequantize_mxfp4

NAN_SCALE = 255        # e8m0 has no sign and no zero: 255 is its only NaN
_REFETCH = "the weights are damaged — fetch the checkpoint again"


@dataclass(frozen=True)
class Mxfp4Names:
    """The six tensors of one MoE layer's MXFP4 experts."""

    gate_up_blocks: str
    gate_up_scales: str
    gate_up_bias: str
    down_blocks: str
    down_scales: str
    down_bias: str

    @staticmethod
    def of(spec: ModelSpec, i: int) -> "Mxfp4Names":
        p = spec.family.moe_prefix.format(i=i)
        gu, dn = spec.family.fused_gate_up.format(p=p), spec.family.fused_down.format(p=p)
        return Mxfp4Names(f"{gu}_blocks", f"{gu}_scales", f"{gu}_bias", f"{dn}_blocks", f"{dn}_scales", f"{dn}_bias")

    def shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        """Name -> the shape config.json implies."""
        E, D, F = spec.num_experts, spec.hidden, spec.moe_ffn
        return {self.gate_up_blocks: (E, 2 * F, D // MXFP4_GROUP, 16), self.gate_up_scales: (E, 2 * F, D // MXFP4_GROUP),
                self.gate_up_bias: (E, 2 * F), self.down_blocks: (E, D, F // MXFP4_GROUP, 16),
                self.down_scales: (E, D, F // MXFP4_GROUP), self.down_bias: (E, D)}


def has_mxfp4(names: set[str], spec: ModelSpec, i: int) -> bool:
    """Layer ``i`` ships its experts as MXFP4 blocks (rather than dense matrices)."""
    return Mxfp4Names.of(spec, i).gate_up_blocks in names


def _where(source: TensorSource, name: str) -> str:
    f = source.file_of(name)
    return str(f) if f is not None else "checkpoint"


def check_mxfp4_layer(source: TensorSource, spec: ModelSpec, i: int) -> None:
    """Every MXFP4 tensor of layer ``i`` is there with the shape and dtype config.json implies (headers only)."""
    n = Mxfp4Names.of(spec, i)
    if spec.hidden % MXFP4_GROUP or spec.moe_ffn % MXFP4_GROUP:
        raise ModelLoadError(f"{getattr(source, 'dir', 'the checkpoint')}/config.json: MXFP4 experts need hidden_size "
                             f"({spec.hidden}) and intermediate_size ({spec.moe_ffn}) to be multiples of {MXFP4_GROUP}; "
                             "the config does not match the weights — restore it from the original checkpoint")
    present = source.names()
    for name, shape in n.shapes(spec).items():
        if name not in present:
            raise ModelLoadError(f"tensor '{name}' (shape {list(shape)}) is missing from the checkpoint in "
                                 f"{getattr(source, 'dir', 'memory')} though '{n.gate_up_blocks}' is there; "
                                 "re-download the model")
        found, where = tuple(source.shape(name)), _where(source, name)
        if found != shape:
            raise ModelLoadError(f"{where}: tensor '{name}' has shape {list(found)} but config.json implies "
                                 f"{list(shape)}; the weights do not match the config")
        dtype = source.dtype(name)
        if name.endswith("_bias"):
            check_dtype(dtype, name, where, spec.architecture)
        elif dtype != "uint8":
            raise ModelLoadError(f"{where}: tensor '{name}' is {dtype} but MXFP4 blocks and scales are uint8; the file "
                                 "is damaged or holds other data — fetch it again")


class _ExpertReader:
    """Expert ``e``'s slice of a fused ``[E, ...]`` tensor, read without the rest of the layer.

    On disk a safetensors slice of the leading dim (one expert's bytes leave the file); a source in
    memory is indexed.
    """

    def __init__(self, source: TensorSource) -> None:
        self.source = source
        self._handles: dict[Path, object] = {}

    def __call__(self, name: str, e: int) -> torch.Tensor:
        f = self.source.file_of(name)
        if f is None:
            return self.source.get(name)[e]
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), framework="pt")
        return self._handles[f].get_slice(name)[e]


def gate_up_order(ffn: int) -> torch.Tensor:
    """Row permutation ``[2F]`` from interleaved (gate, up, gate, up, ...) to gate rows then up rows."""
    return torch.cat([torch.arange(0, 2 * ffn, 2), torch.arange(1, 2 * ffn, 2)])


def _scales(read: _ExpertReader, name: str, e: int) -> torch.Tensor:
    s = read(name, e)                                                   # uint8 [N, NG]
    if bool((s == NAN_SCALE).any()):
        raise ModelLoadError(f"{_where(read.source, name)}: tensor '{name}' holds the scale byte {NAN_SCALE} (NaN in "
                             f"e8m0) for expert {e}; {_REFETCH}")
    return s


def _bias(read: _ExpertReader, name: str, e: int) -> torch.Tensor:
    b = read(name, e)
    check_finite(b, f"{name}[{e}]", _where(read.source, name))
    return b.to(torch.float32)


def read_mxfp4_expert(read: _ExpertReader, n: Mxfp4Names, e: int, order: torch.Tensor) -> dict[str, torch.Tensor]:
    """Expert ``e`` as shipped, gate/up rows de-interleaved: the tensors of an mxfp4 layout with bias.

    ``w13`` uint8 [2F, D/2], ``w13_scale`` uint8 [2F, D/32], ``w2`` uint8 [D, F/2], ``w2_scale`` uint8 [D, F/32],
    ``w13_bias`` float32 [2F], ``w2_bias`` float32 [D].
    """
    w13 = read(n.gate_up_blocks, e)                                     # [2F, D/32, 16]
    w2 = read(n.down_blocks, e)                                         # [D, F/32, 16]
    return {"w13": w13.reshape(w13.shape[0], -1)[order].contiguous(),   # [2F, D/2]
            "w13_scale": _scales(read, n.gate_up_scales, e)[order].contiguous(),
            "w2": w2.reshape(w2.shape[0], -1).contiguous(),             # [D, F/2]
            "w2_scale": _scales(read, n.down_scales, e).contiguous(),
            "w13_bias": _bias(read, n.gate_up_bias, e)[order].contiguous(),
            "w2_bias": _bias(read, n.down_bias, e)}


def _in_layout(shipped: dict[str, torch.Tensor], layout: ExpertLayout) -> dict[str, torch.Tensor]:
    """One expert's shipped tensors in ``layout``: the bytes themselves for mxfp4, else dequantised and
    quantised again (one expert's float32 matrices at a time)."""
    if layout.fmt == "mxfp4":
        keep = {"w13", "w13_scale", "w2", "w2_scale"} | ({"w13_bias", "w2_bias"} if layout.bias else set())
        return {k: v for k, v in shipped.items() if k in keep}
    w13 = dequantize_mxfp4(shipped["w13"], shipped["w13_scale"])        # [2F, D] f32
    w2 = dequantize_mxfp4(shipped["w2"], shipped["w2_scale"])           # [D, F] f32
    return quantize_expert(w13, w2, layout, shipped["w13_bias"], shipped["w2_bias"])


def pack_mxfp4_layer(source: TensorSource, spec: ModelSpec, i: int, layout: ExpertLayout,
                     out: torch.Tensor) -> None:
    """Write layer ``i``'s MXFP4 experts into ``out`` ``uint8 [E, nbytes]`` (row ``e`` = expert ``e``).

    An mxfp4 ``layout`` gets the shipped bytes; any other (int4 / fp8 / dense, asked for with
    ``--weight-format`` or by ``convert``) gets each expert dequantised and quantised with
    :func:`kernels.quant.quantize_expert`. Scale bytes 255 (NaN) and non-finite biases are refused.
    """
    if out.shape != (spec.num_experts, layout.nbytes) or out.dtype != torch.uint8:
        raise ValueError(f"expected out uint8 [{spec.num_experts}, {layout.nbytes}], got {out.dtype} {tuple(out.shape)}")
    read, n, order = _ExpertReader(source), Mxfp4Names.of(spec, i), gate_up_order(spec.moe_ffn)
    for e in range(spec.num_experts):
        layout.pack(_in_layout(read_mxfp4_expert(read, n, e, order), layout), out=out[e])
