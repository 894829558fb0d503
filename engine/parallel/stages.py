"""One pipeline stage: a slice of the model's layers, loaded as a model of its own.

A stage's spec has its layers only (numbered from 0, as its weights, expert provider and KV cache
see them) and, past the first stage, no embedding, final norm or LM head. Its tensor source maps
those local layer numbers to the checkpoint's.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint.reader import TensorSource
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.kv.sizing import window_group
from engine.parallel.plan import PipelinePlan, Stage

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..*)$")
NO_LIMIT = 2**63 - 1      # int64 max: the full-attention blocks a stage without such layers can hold


def stage_spec(spec: ModelSpec, stage: Stage) -> ModelSpec:
    """``spec`` cut to the layers of ``stage``."""
    a, b = stage.start, stage.end
    return dataclasses.replace(spec, num_layers=b - a, moe_layers=spec.moe_layers[a:b],
                               layer_windows=spec.layer_windows[a:b] if spec.layer_windows else (),
                               head=stage.head)


def kv_claim(spec: ModelSpec, stage: Stage, config: EngineConfig, blocks: int) -> int:
    """What stage ``stage`` of ``spec`` (loaded with ``config``) says it can hold of the full-attention
    blocks every stage allocates: ``blocks``, or :data:`NO_LIMIT` when each of its layers keeps its KV
    in the sliding-window pool (gpt-oss alternates window and full layers), whose full-attention pool
    then has no layer and costs nothing however many blocks the tables span."""
    context = min(config.max_model_len or spec.max_position, spec.max_position)
    windowed, _ = window_group(spec, context, config.kv_block_size)
    return NO_LIMIT if set(range(stage.start, stage.end)) <= set(windowed) else blocks


def agreed_blocks(claims: list[int], blocks: list[int]) -> int:
    """The full-attention blocks every stage allocates: the fewest a stage with such layers can hold
    (``claims``, one per stage), or, when no stage has one, the fewest any stage computed (``blocks``)."""
    fewest = min(claims)
    return min(blocks) if fewest == NO_LIMIT else fewest


class StageSource(TensorSource):
    """The tensors of one stage under local layer numbers (layer ``i`` is the checkpoint's ``start + i``)."""

    def __init__(self, source: TensorSource, stage: Stage) -> None:
        self.source, self.stage = source, stage
        self.dir = getattr(source, "dir", None)
        self.manifest = getattr(source, "manifest", None)       # a converted folder's
        self._global: dict[str, str] = {}
        for name in source.names():
            m = _LAYER.match(name)
            if m is None:
                if stage.head:
                    self._global[name] = name
                continue
            i = int(m.group(2))
            if stage.start <= i < stage.end:
                self._global[f"{m.group(1)}{i - stage.start}{m.group(3)}"] = name
        if hasattr(source, "read_experts"):        # packed already: MoE layers by their global index
            self.read_experts = lambda moe_index, out: source.read_experts(moe_index + stage.moe_start, out)

    def names(self) -> set[str]:
        return set(self._global)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(self._global[name])

    def dtype(self, name: str) -> str:
        return self.source.dtype(self._global[name])

    def get(self, name: str) -> torch.Tensor:
        return self.source.get(self._global[name])

    def file_of(self, name: str) -> Path | None:
        return self.source.file_of(self._global.get(name, name))

    def stored_quant(self, name: str, fmt: str):
        return self.source.stored_quant(self._global[name], fmt)


@dataclass
class StageContext:
    """What a stage's LoadedModel needs beyond its own slice."""

    full_spec: ModelSpec                 # the whole model (for what the engine reports)
    plan: PipelinePlan
    rank: int
    agree_blocks: Callable[[int], int]   # KV blocks this stage can hold -> the number every stage allocates

    @property
    def stage(self) -> Stage:
        return self.plan.stages[self.rank]
