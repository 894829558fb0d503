"""Where and in what a model runs: the device and dtype a config names, the experts' layout."""
from __future__ import annotations

import torch

from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.errors import ConfigError
from kernels.expert_layout import ExpertAct, ExpertLayout

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FMT_OF_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} was asked for but no CUDA GPU is available; use --device cpu or auto")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def expert_act(spec: ModelSpec) -> ExpertAct:
    """The experts' activation as the spec's family and config define it."""
    return ExpertAct(spec.family.expert_act, spec.swiglu_alpha, spec.swiglu_limit)


def expert_layout(config: EngineConfig, spec: ModelSpec, dtype: torch.dtype) -> ExpertLayout:
    """Experts as stored unless ``weight_format`` asks otherwise: an MXFP4 checkpoint stays MXFP4, and an fp8
    one with block scales (engine/checkpoint/fp8_blocks.py) becomes Strata's fp8 (one scale per row)."""
    if config.weight_format != "auto":
        fmt = config.weight_format
    else:
        fmt = spec.expert_storage if spec.expert_storage in ("mxfp4", "fp8") else _FMT_OF_DTYPE[dtype]
    return ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, config.group_size, bias=spec.family.expert_bias,
                             act=expert_act(spec))
