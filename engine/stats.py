"""Host-side counters of the engine and the ``EngineStats`` snapshot built from them."""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import torch

from engine.telemetry import EngineStats, ExpertStats, MemoryStats, RateWindow, StageStats

if TYPE_CHECKING:
    from engine.engine import LLMEngine
    from engine.loading import LoadedModel
    from engine.memory import MemoryPlan
    from engine.scheduler import SchedulerOutput


class Counters:
    """Updated once per step from values already on the host; never syncs the device."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.requests_finished = 0
        self.ttft_ms: float | None = None
        self.step_ms = 0.0
        self.batch_size = 0
        self.sampled = RateWindow(2.0)      # tokens sampled per second, all streams
        self.prefilled = RateWindow(2.0)
        self.decode_streams = RateWindow(2.0)   # sampling sequences per step, to get per-stream speed

    def on_step(self, sched: "SchedulerOutput", sampled: int, seconds: float, now: float) -> None:
        prefill = sum(s.num_new for s in sched.seqs if not (s.samples and s.num_new == 1))
        self.prompt_tokens += prefill
        self.generated_tokens += sampled
        self.step_ms = seconds * 1e3
        self.batch_size = len(sched.seqs)
        self.sampled.add(sampled, now, seconds)
        self.prefilled.add(prefill, now, seconds)
        self.decode_streams.add(1 if sampled else 0, now, seconds)

    def on_first_token(self, ttft_ms: float | None) -> None:
        self.ttft_ms = ttft_ms

    def on_finish(self) -> None:
        self.requests_finished += 1

    def per_stream_tok_s(self, now: float) -> float:
        """Tokens per second one stream sees: sampling steps per second."""
        return self.decode_streams.rate(now)


def _memory(engine: "LLMEngine") -> MemoryStats:
    return memory_of(engine.loaded)


def memory_of(m: "LoadedModel") -> MemoryStats:
    """The memory of one loaded model (one stage of a pipeline: its own card's)."""
    pool = m.experts.stats().pool_bytes
    max_alloc = torch.cuda.max_memory_allocated(m.device) if m.device.type == "cuda" else 0
    return MemoryStats(resident_bytes=m.weights.resident_bytes(), expert_pool_bytes=pool,
                       kv_cache_bytes=m.cache.nbytes, kv_window_bytes=m.cache.window_nbytes,
                       workspace_bytes=workspace_bytes(m.plan),
                       budget_bytes=m.plan.budget_bytes, pinned_host_bytes=host_store_bytes(m),
                       max_allocated_bytes=max_alloc, staging_bytes=_staging_bytes(m), host_table_bytes=_table_bytes(m))


def workspace_bytes(plan: "MemoryPlan") -> int:
    """The reserve the memory plan keeps for activations inside the GPU budget; without a budget (the
    CPU) nothing is set aside, so nothing is reported."""
    return plan.workspace_bytes if plan.budget_bytes is not None else 0


def host_store_bytes(m: "LoadedModel") -> int:
    """Bytes of the host store that holds every routed expert beside the pool: page-locked on CUDA,
    ordinary memory on the CPU; 0 while every expert is resident and none was offloaded (there is none).
    An embedding table kept in host memory is page-locked too and counts here."""
    store = m.experts.store
    return (0 if store is None else store.nbytes) + _table_bytes(m)


def _staging_bytes(m: "LoadedModel") -> int:
    """Bytes of the pool's staging slots (0 while the pool holds every expert and has none)."""
    pool = getattr(m.experts, "pool", None)
    if pool is None or pool.buffer is None or pool.full:
        return 0
    return pool.staging * pool.nbytes


def _table_bytes(m: "LoadedModel") -> int:
    """Bytes of the embedding table when it is kept in host memory, else 0."""
    w = m.weights
    return w.embed.numel() * w.embed.element_size() if w.embed_on_host else 0


_PER_LAYER = ("per_layer_hit_rate", "activations")
# settings, not counts: as the first stage (rank 0, the engine's own card) has them
_SETTINGS = ("claim_threshold", "cpu_shares", "predicting")
# A step's time is the wall time of the step as rank 0 sees it, not the sum of the cards' times: the
# cards of expert parallel each take part in the whole step at once, and a pipeline's stages run
# their layers within the same step (overlapping ones across micro-batches), so a sum would count one
# step's time once per card. The longest card's time is the merged one.
_WALL_TIMES = ("steps_ms",)


def merge_experts(parts: list[ExpertStats]) -> ExpertStats:
    """The experts of several pipeline stages as one model's: counters summed, per-layer rows in
    layer order, step times the longest card's, the settings (policy, cold mode, claims and their
    threshold) as the first stage has them."""
    first = parts[0]
    out = {}
    for f in dataclasses.fields(ExpertStats):
        values = [getattr(p, f.name) for p in parts]
        if f.name in _SETTINGS:
            out[f.name] = getattr(first, f.name)
        elif f.name in _WALL_TIMES:
            out[f.name] = max(values)
        elif f.name in _PER_LAYER:
            out[f.name] = tuple(row for v in values for row in v)
        elif f.name == "last_step_experts":
            out[f.name] = tuple(sum(v[i] for v in values) for i in range(2))
        elif isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
            out[f.name] = sum(values)
        else:
            out[f.name] = getattr(first, f.name)
    return ExpertStats(**out)


def merge_memory(parts: list[MemoryStats]) -> MemoryStats:
    """Several cards' memory added up (no budget when any card has none)."""
    out = {}
    for f in dataclasses.fields(MemoryStats):
        values = [getattr(p, f.name) for p in parts]
        out[f.name] = None if any(v is None for v in values) else sum(values)
    return MemoryStats(**out)


def _stages(engine: "LLMEngine") -> tuple[StageStats, ...]:
    m = engine.loaded
    if m.pipeline is None:
        return ()
    first, end = (m.stage.stage.start, m.stage.stage.end) if m.stage is not None else (0, m.spec.num_layers)
    own = StageStats(0, str(m.device), first, end, m.experts.stats(), memory_of(m), m.experts.host_syncs)
    return (own, *m.pipeline.stage_stats())


def merge_shards(parts: list[ExpertStats]) -> ExpertStats:
    """The experts of expert-parallel cards as one model's: card ``r`` of ``N`` holds experts ``r, r + N, ...``
    of every layer, so the activation rows interleave; a layer's hit rate is the cards' mean."""
    merged = merge_experts(parts)
    n = len(parts)
    layers = len(parts[0].activations)
    acts = []
    for layer in range(layers):
        rows = [p.activations[layer] for p in parts]
        width = sum(len(r) for r in rows)
        acts.append(tuple(rows[e % n][e // n] for e in range(width)))
    rates = tuple(sum(p.per_layer_hit_rate[i] for p in parts) / n for i in range(len(parts[0].per_layer_hit_rate)))
    return dataclasses.replace(merged, activations=tuple(acts), per_layer_hit_rate=rates)


def snapshot(engine: "LLMEngine") -> EngineStats:
    c, m, now = engine.counters, engine.loaded, time.perf_counter()
    sched = engine.scheduler
    stages = _stages(engine)
    merge = merge_shards if m.shard is not None else merge_experts
    expert_stats = merge([s.experts for s in stages]) if len(stages) > 1 else m.experts.stats()
    memory = merge_memory([s.memory for s in stages]) if len(stages) > 1 else _memory(engine)
    syncs = sum(s.host_syncs for s in stages) if len(stages) > 1 else m.experts.host_syncs
    return EngineStats(
        timestamp=time.time(), device=str(m.device), model_name=m.info.name,
        prompt_tokens=c.prompt_tokens, generated_tokens=c.generated_tokens,
        requests_finished=c.requests_finished, decode_tok_s=c.per_stream_tok_s(now),
        aggregate_tok_s=c.sampled.rate(now), prefill_tok_s=c.prefilled.rate(now), ttft_ms=c.ttft_ms,
        step_ms=c.step_ms, running=len(sched.running), waiting=len(sched.waiting), batch_size=c.batch_size,
        preemptions=sched.preemptions, kv_blocks_used=m.allocator.num_used, kv_blocks_total=m.allocator.num_blocks,
        kv_cache_dtype=m.cache.label, cuda_graphs_active=engine.runner.use_graphs and engine.runner.graphs is not None and engine.runner.graphs.replays > 0,
        steps_ahead=engine.steps_ahead, host_syncs=syncs, experts=expert_stats, memory=memory, stages=stages)
