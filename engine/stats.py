"""Host-side counters of the engine and the ``EngineStats`` snapshot built from them."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from engine.telemetry import EngineStats, MemoryStats, RateWindow

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
        self.sampled.add(sampled, now)
        self.prefilled.add(prefill, now)
        self.decode_streams.add(1 if sampled else 0, now)

    def on_first_token(self, ttft_ms: float | None) -> None:
        self.ttft_ms = ttft_ms

    def on_finish(self) -> None:
        self.requests_finished += 1

    def per_stream_tok_s(self, now: float) -> float:
        """Tokens per second one stream sees: sampling steps per second."""
        return self.decode_streams.rate(now)


def _memory(engine: "LLMEngine") -> MemoryStats:
    m = engine.loaded
    pool = m.experts.stats().pool_bytes
    max_alloc = torch.cuda.max_memory_allocated(m.device) if m.device.type == "cuda" else 0
    return MemoryStats(resident_bytes=m.weights.resident_bytes(), expert_pool_bytes=pool,
                       kv_cache_bytes=m.cache.nbytes, kv_window_bytes=m.cache.window_nbytes,
                       workspace_bytes=workspace_bytes(m.plan),
                       budget_bytes=m.plan.budget_bytes, pinned_host_bytes=host_store_bytes(m),
                       max_allocated_bytes=max_alloc)


def workspace_bytes(plan: "MemoryPlan") -> int:
    """The reserve the memory plan keeps for activations inside the GPU budget; without a budget (the
    CPU) nothing is set aside, so nothing is reported."""
    return plan.workspace_bytes if plan.budget_bytes is not None else 0


def host_store_bytes(m: "LoadedModel") -> int:
    """Bytes of the host store that holds every routed expert beside the pool: page-locked on CUDA,
    ordinary memory on the CPU; 0 while every expert is resident and none was offloaded (there is none)."""
    store = m.experts.store
    return 0 if store is None else store.nbytes


def snapshot(engine: "LLMEngine") -> EngineStats:
    c, m, now = engine.counters, engine.loaded, time.perf_counter()
    sched = engine.scheduler
    expert_stats = m.experts.stats()
    return EngineStats(
        timestamp=time.time(), device=str(m.device), model_name=m.info.name,
        prompt_tokens=c.prompt_tokens, generated_tokens=c.generated_tokens,
        requests_finished=c.requests_finished, decode_tok_s=c.per_stream_tok_s(now),
        aggregate_tok_s=c.sampled.rate(now), prefill_tok_s=c.prefilled.rate(now), ttft_ms=c.ttft_ms,
        step_ms=c.step_ms, running=len(sched.running), waiting=len(sched.waiting), batch_size=c.batch_size,
        preemptions=sched.preemptions, kv_blocks_used=m.allocator.num_used, kv_blocks_total=m.allocator.num_blocks,
        kv_cache_dtype=m.cache.label, cuda_graphs_active=engine.runner.use_graphs and engine.runner.graphs is not None and engine.runner.graphs.replays > 0,
        host_syncs=m.experts.host_syncs, experts=expert_stats, memory=_memory(engine))
