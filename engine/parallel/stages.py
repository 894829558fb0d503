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
from engine.memory import MemoryPlan, fit_context, kv_pool_bytes
from engine.parallel.plan import PipelinePlan, Stage

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..*)$")
NO_LIMIT = 2**63 - 1      # int64 max: the full-attention blocks a stage without such layers can hold


def stage_spec(spec: ModelSpec, stage: Stage) -> ModelSpec:
    """``spec`` cut to the layers of ``stage``."""
    a, b = stage.start, stage.end
    return dataclasses.replace(spec, num_layers=b - a, moe_layers=spec.moe_layers[a:b],
                               layer_windows=spec.layer_windows[a:b] if spec.layer_windows else (),
                               head=stage.head)


@dataclass(frozen=True)
class KVClaim:
    """What one stage's card says of the full-attention KV blocks every stage allocates (they agree on
    one number: the scheduler's block tables span every stage)."""

    blocks: int                  # blocks it holds; NO_LIMIT: it has no full-attention layer (they cost it nothing)
    kv_bytes: int                # bytes its full-attention pool may take (engine.memory.kv_pool_bytes)
    bytes_per_token: int         # what a token of context adds in its full-attention layers
    budget_bytes: int | None     # its card's budget; None: none to fit the context in (the CPU, a KV size given)


@dataclass(frozen=True)
class KVAgreement:
    """The blocks every stage allocates and the context one sequence has in them."""

    blocks: int
    context: int                 # tokens
    note: str | None = None      # why the context is shorter than the model's (naming the card), or None


def stage_claim(plan: MemoryPlan, context: int, max_batch: int, block: int, asked: int | None) -> KVClaim:
    """The claim of a stage planned as ``plan`` (``asked``: its share of ``--kv-cache-size``). On a
    budget, the blocks its KV room holds; with no budget or a KV size given, at least one sequence at
    the full ``context``, as on one card."""
    kv, per_token = kv_pool_bytes(plan, context, max_batch, asked), plan.kv_bytes_per_token
    if not per_token:
        return KVClaim(NO_LIMIT, kv, 0, None)
    blocks = kv // (per_token * block)
    if plan.budget_bytes is None or asked:
        return KVClaim(max(blocks, -(-context // block)), kv, per_token, None)
    return KVClaim(blocks, kv, per_token, plan.budget_bytes)


def agree_kv(claims: list[KVClaim], context: int, explicit: bool, block: int) -> KVAgreement:
    """What the stages of ``claims`` (in stage order) allocate: the fewest blocks a card holding
    full-attention layers claims (one sequence at the full context when no card holds any). A context
    longer than those blocks hold on that card's budget is capped to them when the user left it unset
    (``explicit`` False), with a note, and else refused, naming the card (engine.memory.fit_context)."""
    limits = [(c.blocks, rank) for rank, c in enumerate(claims) if c.blocks != NO_LIMIT]
    if not limits:
        return KVAgreement(-(-context // block), context)
    blocks, rank = min(limits)
    least = claims[rank]
    if least.budget_bytes is None:
        return KVAgreement(blocks, context)
    fitted, note = fit_context(context, explicit, least.kv_bytes, least.bytes_per_token, block, least.budget_bytes,
                               f"GPU {rank}")
    # a context that fits in bytes but not in whole blocks takes one block more, as on one card
    return KVAgreement(max(blocks, -(-fitted // block)), fitted, note)


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
    share_claims: Callable[[KVClaim], list[KVClaim]]   # this stage's KV claim -> every stage's, in stage order

    @property
    def stage(self) -> Stage:
        return self.plan.stages[self.rank]
