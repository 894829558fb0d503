"""Byte layout of one routed expert: every matrix and scale of it in one contiguous range.

A host store is ``uint8 [layers * experts, nbytes]`` and a device pool ``uint8 [slots, nbytes]``;
a miss is one copy of one row. :meth:`ExpertLayout.views` turns such a buffer into typed per-slot
tensors that the MoE kernels index with a slot number (``w13[slot]``), so no weight is ever gathered.

Matrices (``N`` output rows, ``K`` reduction dim; ``D`` hidden, ``F`` expert FFN):

* ``w13`` ``[2F, D]``: gate rows ``0..F-1`` then up rows ``F..2F-1`` (out = silu(gate x) * up x);
* ``w2``  ``[D, F]``: down projection.

Formats:

* ``bf16`` / ``fp16`` / ``fp32``: the matrices as they are.
* ``fp8``: e4m3 values plus one float32 scale per output row (``w13_scale [2F]``, ``w2_scale [D]``);
  ``w = fp8 * scale``.
* ``int4``: asymmetric, per output row and per group of ``G`` along K. ``w13`` is ``uint8 [2F, D/2]``:
  byte ``j`` of a row holds element ``k = 2j`` in its low nibble and ``k = 2j + 1`` in its high nibble.
  ``w13_scale`` is float16 ``[2F, D/G]``, ``w13_zero`` uint8 ``[2F, D/G]`` (0..15);
  ``w = (q - zero) * scale``. Likewise ``w2 [D, F/2]``, ``w2_scale/w2_zero [D, F/G]``.
* ``mxfp4``: e2m1 values with the int4 nibble order, ``w13`` ``uint8 [2F, D/2]``, and one e8m0 scale
  byte per 32 values, ``w13_scale`` ``uint8 [2F, D/32]``; ``w = fp4 * 2 ** (scale - 127)``
  (:mod:`kernels.quant.mxfp4`). Likewise ``w2 [D, F/2]``, ``w2_scale [D, F/32]``. As gpt-oss ships it.

With ``bias`` (gpt-oss) every format adds ``w13_bias`` float32 ``[2F]`` (gate rows then up rows) and
``w2_bias`` float32 ``[D]``, added to each projection's output. ``act`` says how gate and up combine
(:class:`ExpertAct`); it is part of the layout so everything that runs an expert reads it from one place.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.errors import ConfigError

ALIGN = 256  # bytes; every tensor and every slot starts on this boundary (16-byte loads, cache lines)

DENSE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EXPERT_FORMATS = ("bf16", "fp16", "fp32", "fp8", "int4", "mxfp4")
MXFP4_GROUP = 32
ACTIVATIONS = ("silu", "swiglu_oai")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class TensorSlice:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int          # bytes from the start of the expert

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class ExpertAct:
    """How an expert combines its gate and up rows into ``h`` (fed to the down projection).

    * ``silu``: ``h = silu(gate) * up`` (Mixtral, Qwen, OLMoE);
    * ``swiglu_oai`` (gpt-oss): ``g = min(gate, limit)``, ``u = clamp(up, -limit, limit)``,
      ``h = (u + 1) * g * sigmoid(alpha * g)``.
    """

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0


@dataclass(frozen=True)
class ExpertLayout:
    """Where each tensor of one expert lives inside its byte range."""

    fmt: str
    hidden: int           # D
    ffn: int              # F
    group_size: int = 128
    tensors: tuple[TensorSlice, ...] = ()
    nbytes: int = 0
    bias: bool = False
    act: ExpertAct = ExpertAct()

    @staticmethod
    def make(fmt: str, hidden: int, ffn: int, group_size: int = 128, bias: bool = False,
             act: ExpertAct | None = None) -> "ExpertLayout":
        """``group_size``: int4 only (mxfp4 groups are always 32)."""
        if fmt not in EXPERT_FORMATS:
            raise ConfigError(f"expert format {fmt!r} is not supported; choose one of {', '.join(EXPERT_FORMATS)}")
        act = act or ExpertAct()
        if act.kind not in ACTIVATIONS:
            raise ConfigError(f"expert activation {act.kind!r} is not supported; choose one of {', '.join(ACTIVATIONS)}")
        if fmt == "mxfp4":
            group_size = MXFP4_GROUP
        specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        for name, n, k in (("w13", 2 * ffn, hidden), ("w2", hidden, ffn)):
            if fmt in DENSE_DTYPES:
                specs.append((name, DENSE_DTYPES[fmt], (n, k)))
            elif fmt == "fp8":
                specs += [(name, torch.float8_e4m3fn, (n, k)), (f"{name}_scale", torch.float32, (n,))]
            elif fmt == "mxfp4":
                if k % MXFP4_GROUP:
                    raise ConfigError(f"mxfp4 experts need a hidden size and expert FFN that are multiples of "
                                      f"{MXFP4_GROUP} (this model has {hidden} and {ffn}); use --weight-format int4, "
                                      "fp8 or bf16")
                specs += [(name, torch.uint8, (n, k // 2)), (f"{name}_scale", torch.uint8, (n, k // MXFP4_GROUP))]
            else:  # int4
                if k % group_size or k % 2:
                    fits = [str(g) for g in (128, 64, 32) if hidden % g == 0 and ffn % g == 0 and g % 2 == 0]
                    fix = (f"pass --group-size {' or '.join(fits)}" if fits else
                           "use --weight-format fp8 or bf16")
                    raise ConfigError(f"int4 experts in groups of {group_size} need a hidden size and expert FFN that "
                                      f"are multiples of it (this model has {hidden} and {ffn}); {fix}")
                specs += [(name, torch.uint8, (n, k // 2)),
                          (f"{name}_scale", torch.float16, (n, k // group_size)),
                          (f"{name}_zero", torch.uint8, (n, k // group_size))]
        if bias:
            specs += [("w13_bias", torch.float32, (2 * ffn,)), ("w2_bias", torch.float32, (hidden,))]
        offset, slices = 0, []
        for name, dtype, shape in specs:
            s = TensorSlice(name, dtype, shape, offset)
            slices.append(s)
            offset = _align(offset + s.nbytes)
        return ExpertLayout(fmt, hidden, ffn, group_size, tuple(slices), offset, bias, act)

    def slice(self, name: str) -> TensorSlice:
        for s in self.tensors:
            if s.name == name:
                return s
        raise KeyError(name)

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Typed views ``[S, *shape]`` of a ``uint8 [S, nbytes]`` buffer (no copy)."""
        if buf.dtype != torch.uint8 or buf.dim() != 2 or buf.shape[1] != self.nbytes:
            raise ValueError(f"expected uint8 [S, {self.nbytes}], got {buf.dtype} {tuple(buf.shape)}")
        out = {}
        for s in self.tensors:
            raw = buf[:, s.offset:s.offset + s.nbytes]
            out[s.name] = raw.view(s.dtype).view(buf.shape[0], *s.shape)
        return out

    def pack(self, tensors: dict[str, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """Write one expert's tensors into ``uint8 [nbytes]`` (``out`` if given)."""
        if out is None:
            out = torch.zeros(self.nbytes, dtype=torch.uint8)
        views = self.views(out.view(1, -1))
        for s in self.tensors:
            t = tensors[s.name]
            if tuple(t.shape) != s.shape or t.dtype != s.dtype:
                raise ValueError(f"{s.name}: expected {s.dtype} {s.shape}, got {t.dtype} {tuple(t.shape)}")
            views[s.name][0].copy_(t)
        return out
