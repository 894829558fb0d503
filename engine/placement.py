"""Where and in what a model runs: the device and dtype a config names, the experts' layout."""
from __future__ import annotations

import torch

from engine.checkpoint.spec import ModelSpec
from engine.config import DEFAULT_GROUP_SIZE, GROUP_SIZES, EngineConfig
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


def fitting_group(spec: ModelSpec) -> tuple[int, tuple[str, ...]]:
    """int4's default group for this model: the largest that divides its hidden size and expert FFN
    (128 on most released models; 64 on gpt-oss, whose widths are 2880), with a note where that is not 128;
    128 where none does (refused next, naming the fix)."""
    D, F = spec.hidden, spec.moe_ffn
    fits = [g for g in sorted(GROUP_SIZES, reverse=True) if D % g == 0 and F % g == 0]
    if not fits or fits[0] == DEFAULT_GROUP_SIZE:
        return DEFAULT_GROUP_SIZE, ()
    return fits[0], (f"int4 groups of {fits[0]}: {DEFAULT_GROUP_SIZE} does not divide this model's expert widths "
                     f"(hidden {D}, expert FFN {F})",)


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


FP8_RESIDENT_CAPABILITY = (8, 9)     # the 8-bit GEMV kernels widen e4m3 in registers from Ada/Hopper on


def auto_resident(weight_format: str, expert_storage: str, device: torch.device, dtype: torch.dtype,
                  capability: tuple[int, int] | None = None) -> tuple[str, str | None]:
    """``resident_weights="auto"`` on a checkpoint that was not converted: fp8 where the routed experts are
    quantised at load (``weight_format`` int4, fp8 or mxfp4 from 16-bit experts) on a GPU whose kernels take
    fp8 (compute capability 8.9 or newer) with 16-bit activations, else the dtype ("bf16"); with a note
    when it picks fp8.

    A token then reads half the bytes of attention and the LM head (Qwen3-30B-A3B shape, 12 layers: 1.08
    GB resident against 0.55; batch-1 decode 1002 against 882 tok/s on the H100,
    benchmarks/results/step_profile_2026-12-05d.json). Per-row e4m3 rounds a weight by about 2% of its
    size (3 mantissa bits), against about 10% for int4 groups of 128: the experts' error dominates, as
    in llama.cpp's Q4_K_M, whose attention and output matrices are 4- and 6-bit. ``capability``: the card's
    (default: asked of ``device``)."""
    lossy = weight_format in ("int4", "fp8", "mxfp4") and expert_storage == "dense"
    if not lossy or device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return "bf16", None
    try:
        capability = capability or torch.cuda.get_device_capability(device)
    except (AssertionError, RuntimeError):       # no such card: the load names it; plan as 16 bits
        return "bf16", None
    if capability < FP8_RESIDENT_CAPABILITY:
        return "bf16", None
    return "fp8", (f"attention, dense and shared MLPs and the LM head are held in fp8 beside the {weight_format} "
                   f"experts (half their bytes per token); --resident-weights bf16 keeps them in 16 bits")
