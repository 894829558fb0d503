"""Engine counters and the frozen ``EngineStats`` snapshot.

Counters are plain Python numbers updated where the engine already is on the host: no device sync
is ever issued just to read a statistic.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryStats:
    """Bytes on the compute device by category, against the budget."""

    resident_bytes: int = 0          # embeddings, attention, norms, routers, shared experts, LM head
    expert_pool_bytes: int = 0       # GPU expert pool slots (incl. staging)
    kv_cache_bytes: int = 0
    kv_window_bytes: int = 0         # of kv_cache_bytes: the sliding-window layers' fixed pool (0: none)
    workspace_bytes: int = 0
    budget_bytes: int | None = None  # None: no budget (CPU)
    pinned_host_bytes: int = 0       # host store of routed experts (and the embedding table when it is there)
    max_allocated_bytes: int = 0     # torch.cuda.max_memory_allocated, 0 on CPU
    staging_bytes: int = 0           # of expert_pool_bytes: the staging slots of a pool smaller than all experts
    host_table_bytes: int = 0        # of pinned_host_bytes: the embedding table kept in host memory (0: on the device)


@dataclass(frozen=True)
class ExpertStats:
    """Expert residency counters, cumulative since load (or the last reset)."""

    hits: int = 0
    misses: int = 0
    prefetch_hits: int = 0           # needed experts that a prefetch brought in time
    prefetch_wasted: int = 0         # prefetched experts that were never used before eviction
    h2d_bytes: int = 0               # host -> GPU expert bytes: copies and direct reads
    direct_bytes: int = 0            # of which read by the MoE kernels straight from host memory
    fills: int = 0                   # directly read experts admitted from where the kernels kept them (no second bus trip)
    gathered: int = 0                # missing experts several tokens of a step used, copied over the bus once for them
    extra_passes: int = 0            # passes beyond the first of layers that missed more experts than staging holds
    misses_predicted: int = 0        # misses that a prediction for their layer had named (what prefetch could hide)
    copy_wait_ms: float = 0.0        # time compute waited on copies
    pool_slots_used: int = 0
    pool_slots_total: int = 0
    pool_bytes: int = 0
    per_layer_hit_rate: tuple[float, ...] = ()
    activations: tuple[tuple[int, ...], ...] = ()   # [moe layers][experts] routed-token counts
    # GPU-side prefetch of direct-read decode steps, per step size ("1", "2-3", "4-7", "8-15", "16"
    # tokens): the share of a layer's first claims that were used (None: too few to tell) and the
    # claims per layer it makes now (0: paused, probed now and then); claims pause below the threshold
    claim_use: tuple[tuple[str, float | None, int], ...] = ()
    claim_threshold: float = 0.0
    policy: str = ""                 # eviction policy; "adaptive 0.99": the adaptive one and the memory it uses now
    # cold experts (engine/experts/cold.py): where missing experts ran, cumulative
    cold_mode: str = ""              # auto / bus / cpu; "" where there is no host store
    cpu_experts: int = 0             # missing experts computed by the host CPU
    bus_experts: int = 0             # missing experts brought over the bus (copied or read directly)
    cpu_ms: float = 0.0              # time in the CPU expert kernels
    cold_predicted_ms: float = 0.0   # the cost model's time for the layers with a CPU share
    cold_measured_ms: float = 0.0    # the same layers as measured (decision to the CPU's result)
    steps_ms: float = 0.0            # time inside steps with experts (begin to end): the CPU busy share's base
    last_step_experts: tuple[int, int] = (0, 0)   # (CPU, bus) missing experts of the last step
    # replayed decode steps (engine/experts/cold_graph.py): (tokens, share of each layer's missing
    # experts the host CPU takes) per step size seen; auto's measured choice, or 1 / 0 under cpu / bus
    cpu_shares: tuple[tuple[int, float], ...] = ()
    # replayed direct-read decode steps (engine/experts/predict_tuner.py): (tokens, whether steps of
    # that size predict later layers' experts, the GPU copying its guesses in) per step size measured
    predicting: tuple[tuple[int, bool], ...] = ()

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 1.0


@dataclass(frozen=True)
class StageStats:
    """One pipeline stage (one GPU): its layers, expert counters and memory."""

    rank: int = 0
    device: str = "cpu"
    first_layer: int = 0
    end_layer: int = 0               # one past its last layer
    experts: ExpertStats = field(default_factory=ExpertStats)
    memory: MemoryStats = field(default_factory=MemoryStats)
    host_syncs: int = 0


@dataclass(frozen=True)
class EngineStats:
    """One snapshot of the engine, cheap to make, safe to send across threads."""

    timestamp: float = 0.0
    device: str = "cpu"
    model_name: str = ""
    # throughput and latency
    prompt_tokens: int = 0           # prompt tokens prefilled since load
    generated_tokens: int = 0        # tokens sampled since load
    requests_finished: int = 0
    decode_tok_s: float = 0.0        # per-stream decode speed over the recent window
    aggregate_tok_s: float = 0.0     # all streams together over the recent window
    prefill_tok_s: float = 0.0
    ttft_ms: float | None = None     # of the most recent first token
    step_ms: float = 0.0             # duration of the last step
    # scheduler
    running: int = 0
    waiting: int = 0
    batch_size: int = 0              # sequences in the last step
    preemptions: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_cache_dtype: str = ""
    cuda_graphs_active: bool = False
    steps_ahead: int = 0             # decode steps launched before the last one's tokens were read back
    host_syncs: int = 0
    experts: ExpertStats = field(default_factory=ExpertStats)
    memory: MemoryStats = field(default_factory=MemoryStats)
    # a pipeline over several GPUs: each stage's own (experts and memory above are their sum); () on one
    stages: tuple[StageStats, ...] = ()

    # flat aliases used by benchmarks and the HTTP stats endpoint
    @property
    def expert_hits(self) -> int:
        return self.experts.hits

    @property
    def expert_misses(self) -> int:
        return self.experts.misses

    @property
    def expert_hit_rate(self) -> float:
        return self.experts.hit_rate

    @property
    def h2d_bytes(self) -> int:
        return self.experts.h2d_bytes

    @property
    def copy_wait_ms(self) -> float:
        return self.experts.copy_wait_ms


class RateWindow:
    """Events per second over a sliding time window (host clock only). An event may say how long it
    took (a step's ``took`` seconds), so that the first events after an idle spell count over their own
    time, not over the instant since they were added; an event stays in the window until its end is
    older than the window, however long it took."""

    def __init__(self, seconds: float = 2.0) -> None:
        self.seconds = seconds
        self._events: deque[tuple[float, float, int]] = deque()      # (start, end, count)

    def add(self, count: int, now: float | None = None, took: float = 0.0) -> None:
        now = time.perf_counter() if now is None else now
        self._events.append((now - max(took, 0.0), now, count))
        self._trim(now)

    def rate(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        self._trim(now)
        if not self._events:
            return 0.0
        span = max(now - min(start for start, _, _ in self._events), 1e-3)
        return sum(c for _, _, c in self._events) / span

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][1] > self.seconds:
            self._events.popleft()
