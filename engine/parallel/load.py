"""Loading a model over several GPUs: the first stage of a pipeline (or card 0 of expert parallel),
with the other stages' processes started and loaded beside it (engine/parallel/pipeline.py drives
them), and the per-card settings both modes derive from the engine's config."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.checkpoint.reader import TensorSource
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.parallel.pipeline import Pipeline
from engine.parallel.plan import PipelinePlan, plan_pipeline
from engine.parallel.stages import StageContext, StageSource, stage_spec
from engine.tokenizer import Tokenizer


def stage_configs(config: EngineConfig, plan: PipelinePlan, device: torch.device) -> list[EngineConfig]:
    """Each stage's own settings: its GPU, its card's budget, its share of an explicit KV size."""
    n = plan.size
    budget = config.gpu_memory_budget
    budgets = list(budget) if isinstance(budget, tuple) else [None if budget is None else budget // n] * n
    out = []
    for s in plan.stages:
        dev = "cpu" if device.type == "cpu" else f"cuda:{s.rank}"
        kv = None if config.kv_cache_size is None else int(config.kv_cache_size * plan.kv_fraction(s.rank))
        out.append(config.replace(device=dev, gpu_memory_budget=budgets[s.rank], kv_cache_size=kv,
                                  cuda_graphs=False))
    return out


def card_budgets(config: EngineConfig) -> tuple[int | None, ...]:
    """Each card's GPU memory budget: as listed, or the one size split evenly (None: none given)."""
    n, b = config.cards, config.gpu_memory_budget
    return tuple(b) if isinstance(b, tuple) else (None if b is None else b // n,) * n


def load_expert_parallel(config: EngineConfig, spec: ModelSpec, source: TensorSource, tokenizer: Tokenizer | None,
                         path: Path, notes: tuple[str, ...], model_cls):
    """Card 0 of expert parallel over ``config.expert_parallel`` GPUs (CPU processes on the CPU), with
    the other cards' processes started and loaded beside it (engine/parallel/experts.py); ``model_cls``
    as for :func:`load_pipeline`."""
    from engine.parallel.experts import ExpertShard, ExpertsOnCards, check_shards
    n = config.expert_parallel
    device = _devices(config, n, "expert_parallel")
    check_shards(spec.num_experts, spec.top_k, n)
    budgets = card_budgets(config)
    notes = list(notes)
    if config.cold_experts == "cpu":              # auto means bus here, unsaid
        notes.append("--cold-experts cpu does not apply with expert parallel: each card brings its missing experts "
                      "over its own link (bus)")
    cfgs = [config.replace(device="cpu" if device.type == "cpu" else f"cuda:{r}", gpu_memory_budget=budgets[r],
                           cuda_graphs=False, cold_experts="bus") for r in range(n)]
    group = Pipeline(config, None, cfgs, path, device, spec, mode="experts")
    notes = tuple(notes) + _eager(device, config, "expert parallel runs its decode steps eagerly")
    loaded = _first_beside(group, lambda: model_cls(cfgs[0], spec, source, tokenizer, path, notes,
                                                    shard=ExpertShard(0, n, spec.num_experts)), source, path)
    loaded.model.expert_parallel = ExpertsOnCards(group)
    return loaded


def _eager(device: torch.device, config: EngineConfig, why: str) -> tuple[str, ...]:
    """The note that CUDA graphs are off (``why``), where they would have been on."""
    return (f"CUDA graphs are off: {why}",) if device.type == "cuda" and config.cuda_graphs is not False else ()


def _first_beside(group: Pipeline, load: Callable[[], Any], source: TensorSource, path: Path):
    """The first card's model, made by ``load`` while the other processes of ``group`` load theirs,
    once they have and the links between them are built (``group`` is closed if any of it fails),
    and a converted folder's expert layout is checked against it (the model is closed if it fails)."""
    try:
        loaded = load()
        group.wait_loaded()
        group.warm_up()
    except BaseException:
        group.close()
        raise
    group.first = loaded
    loaded.pipeline = group
    manifest = getattr(source, "manifest", None)
    if manifest is not None:
        try:
            manifest.check_layout(loaded.layout, path)
        except BaseException:
            loaded.close()
            raise
    return loaded


def _devices(config: EngineConfig, n: int, name: str) -> torch.device:
    """The device type of the cards (checked to be there) and the checks the parallel modes share."""
    from engine.placement import resolve_device
    device = resolve_device(config.device)
    if device.type == "cuda":
        if config.device not in ("auto", "cuda"):
            raise ConfigError(f"device={config.device} names one GPU but {name}={n} uses GPUs 0..{n - 1}; "
                              "use --device cuda")
        if torch.cuda.device_count() < n:
            raise ConfigError(f"{name}={n} needs {n} GPUs but {torch.cuda.device_count()} "
                              f"{'is' if torch.cuda.device_count() == 1 else 'are'} visible; lower "
                              f"--{name.replace('_', '-')} or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    for option in ("routing_profile", "record_routing"):
        if getattr(config, option):
            raise ConfigError(f"{option} does not work with {name} yet; drop --{option.replace('_', '-')} "
                              f"or load with --{name.replace('_', '-')} 1")
    return device


def load_pipeline(config: EngineConfig, spec: ModelSpec, source: TensorSource, tokenizer: Tokenizer | None,
                  path: Path, notes: tuple[str, ...], model_cls):
    """The first stage of a pipeline over ``config.pipeline_parallel`` GPUs (CPU processes on the
    CPU), with the other stages started and loaded beside it; ``model_cls`` is the LoadedModel class
    (given by engine.loading, which this module does not import)."""
    from engine.placement import auto_resident, expert_layout, resolve_dtype
    n = config.pipeline_parallel
    device = _devices(config, n, "pipeline_parallel")
    dtype = resolve_dtype(config.dtype, device)
    layout = expert_layout(config, spec, dtype)
    manifest = getattr(source, "manifest", None)
    resident = config.resident_weights if config.resident_weights != "auto" else \
        (manifest.resident if manifest is not None else
         auto_resident(config.weight_format, spec.expert_storage, device, dtype)[0])
    elem = torch.empty((), dtype=dtype).element_size()
    plan = plan_pipeline(spec, n, elem, resident, layout.nbytes, card_budgets(config))
    cfgs = stage_configs(config, plan, device)
    pipeline = Pipeline(config, plan, cfgs, path, device, spec)
    first = plan.stages[0]
    notes = notes + _eager(device, config, "the stages of a pipeline run their decode steps eagerly")
    loaded = _first_beside(pipeline, lambda: model_cls(cfgs[0], stage_spec(spec, first), StageSource(source, first),
                                                       tokenizer, path, notes,
                                                       stage=StageContext(spec, plan, 0, pipeline.share_claims)),
                           source, path)
    loaded.model.pipeline = pipeline
    return loaded

