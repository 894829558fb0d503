"""Settings fitted to the model and the device at load: clamped or ignored with a note, never silently.

The rule: a value that is wrong in itself (negative, the wrong type, a file that is not there) is
refused by ``EngineConfig`` or the loader. A value that is fine in itself but goes beyond what this
model or device offers is fitted, and one line in ``ModelInfo.notes`` says what was used instead:

* above the model's limit (``max_model_len`` past ``max_position_embeddings``, ``prefetch_depth``
  past the MoE layers there are): clamped to the limit, which is the most the model can do;
* meaningless on this device (``gpu_memory_budget`` or ``cuda_graphs=True`` on the CPU) or with
  every expert resident (pool settings): ignored.

Fitting rather than refusing keeps one set of options usable across models and machines (the
workbench remembers its settings; a script runs the same flags on a laptop and on a GPU server).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.checkpoint.spec import ModelSpec
from engine.config import DEFAULT_GROUP_SIZE, EngineConfig, format_size


@dataclass(frozen=True)
class Fitted:
    config: EngineConfig
    notes: tuple[str, ...] = ()


def max_prefetch_depth(spec: ModelSpec) -> int:
    """The deepest useful look-ahead: from the first MoE layer, every later one."""
    return max(0, spec.num_moe_layers - 1)


def depth_note(depth: int, spec: ModelSpec) -> str | None:
    """The note for a prefetch depth past the model's MoE layers (None when it fits)."""
    most = max_prefetch_depth(spec)
    if depth <= most:
        return None
    return (f"prefetch depth {depth} is more than this model allows ({spec.num_moe_layers} MoE layers, so at most "
            f"{most} ahead); using {most}")


def asked_depth_note(config: EngineConfig, spec: ModelSpec) -> str | None:
    """:func:`depth_note` for a depth the caller chose: the default depth, clamped on a model of few
    MoE layers, is fitted without a word (nobody asked for it)."""
    default = next(f.default for f in dataclasses.fields(EngineConfig) if f.name == "prefetch_depth")
    return depth_note(config.prefetch_depth, spec) if config.prefetch_depth != default else None


def fit_to_model(config: EngineConfig, spec: ModelSpec) -> Fitted:
    """Clamp the context length to the model's."""
    if config.max_model_len is None or config.max_model_len <= spec.max_position:
        return Fitted(config)
    note = (f"context length {config.max_model_len} is above this model's limit of {spec.max_position} tokens "
            f"(max_position_embeddings in its config.json); using {spec.max_position}")
    return Fitted(config.replace(max_model_len=spec.max_position), (note,))


def fit_to_device(config: EngineConfig, device: torch.device) -> Fitted:
    """Drop the settings that only a CUDA device gives a meaning; resolve ``cuda_graphs=None``."""
    on_gpu = device.type == "cuda"
    changes: dict = {"cuda_graphs": on_gpu if config.cuda_graphs is None else config.cuda_graphs and on_gpu}
    notes = []
    if not on_gpu and config.gpu_memory_budget is not None:
        changes["gpu_memory_budget"] = None
        notes.append(f"a GPU memory budget ({format_size(config.gpu_memory_budget)}) means nothing on the CPU, which "
                     "has no GPU memory to budget; ignored")
    if not on_gpu and config.cuda_graphs:
        notes.append("CUDA graphs need a CUDA GPU and mean nothing on the CPU; ignored")
    return Fitted(config.replace(**changes), tuple(notes))


# pool settings: they steer the expert pool once it is smaller than every expert
_POOL_OPTIONS = ("prefetch_depth", "expert_policy", "expert_reads", "cold_experts", "routing_profile")


def fit_to_pool(config: EngineConfig, spec: ModelSpec, resident: bool) -> Fitted:
    """Clamp the prefetch depth to the model; with every expert resident, also note the pool settings
    given away from their defaults: they wait until the pool is made smaller (a live change)."""
    notes: tuple[str, ...] = ()
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    asked = config                       # what the caller set, before any clamping
    if config.prefetch_depth > max_prefetch_depth(spec):
        config = config.replace(prefetch_depth=max_prefetch_depth(spec))
        note = asked_depth_note(asked, spec)
        notes = (note,) if note else ()
    if not resident:
        return Fitted(config, notes)
    # expert parallel sets cold_experts to bus on every card itself (engine/parallel/load.py)
    forced = {"cold_experts"} if config.expert_parallel > 1 else set()
    given = [f"{name.replace('_', ' ')} {getattr(config, name)}" for name in _POOL_OPTIONS
             if getattr(asked, name) != defaults[name] and name not in forced]
    if given:
        notes += (f"{', '.join(given)}: every expert is resident on the device, so these apply only once the "
                  "expert pool is made smaller than every expert (--expert-pool-size, or live)",)
    return Fitted(config, notes)


def pool_size_note(asked: object, every_bytes: int, one_bytes: int = 0, name: str = "--expert-pool-size") -> str | None:
    """A note when the pool size ``name`` (``asked``, bytes) is more than every routed expert takes (the
    pool holds them all, and the rest of the size is not taken), or less than one expert (``one_bytes``)
    takes, so that the pool holds none."""
    if isinstance(asked, int) and 0 < asked < one_bytes:
        return (f"{name} {format_size(asked)} is less than one expert takes ({format_size(one_bytes)}); "
                "the pool holds no expert, and every expert a token uses is read from host memory")
    if not isinstance(asked, int) or asked <= every_bytes:
        return None
    return (f"{name} {format_size(asked)} is more than every expert takes ({format_size(every_bytes)}); "
            "the pool holds every expert and the rest is left free")


def unused_notes(config: EngineConfig, expert_format: str) -> tuple[str, ...]:
    """Notes for options that this load never reads (they are kept, and say so)."""
    notes = []
    if config.group_size != DEFAULT_GROUP_SIZE and expert_format != "int4":
        notes.append(f"group size {config.group_size} applies to int4 experts only; these experts are "
                     f"{expert_format}, so it is ignored")
    if config.routing_profile and config.expert_policy != "static":
        notes.append(f"a routing profile is read by the static eviction policy only; the policy is "
                     f"{config.expert_policy}, so {config.routing_profile} is not used")
    return tuple(notes)
