"""What the engine itself says about a run: step times, expert hits, bus bytes, and the roofline.

Everything here reads what the engine already measures: the step time its counters keep
(``LLMEngine.counters.step_ms``, read by a loop tick after every step) and the cumulative counters
of ``EngineStats`` before and after the run. Nothing is added to the decode path.

Roofline (CUDA only; on the CPU there is none and the fields are None):

* HBM: the weight bytes one decoded token reads (``LoadedModel.active_bytes_per_token``: the
  resident weights it uses and its k experts per MoE layer) over the device-copy bandwidth (read +
  write, measured here) is the least time a step can take; the fraction is that time over the
  measured time per token of one stream (1 / per-stream tok/s). At batch B a step still reads at
  least one token's weights, so the fraction stays <= 1; at batch 1 it is the usual roofline.
* bus: host-to-device expert bytes per output token over the pinned host-to-device bandwidth
  (measured here), against the measured time per output token: H2D GB/s over pinned GB/s.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.bench.metrics import Summary, percentile
from engine.loop import EngineLoop
from engine.telemetry import EngineStats

if TYPE_CHECKING:
    from engine.engine import LLMEngine

PROBE_BYTES = 256 << 20       # buffer of the bandwidth probes: large enough to reach the plateau


@dataclass(frozen=True)
class EngineFacts:
    """The loaded model as a workload needs to know it."""

    model: str
    device: str
    vocab_size: int                  # ids a prompt may use (the model's, at most the tokenizer's)
    special_ids: frozenset[int]      # eos, bos, pad: never drawn into prompts
    has_tokenizer: bool
    context_tokens: int
    max_batch: int
    hbm_bytes_per_token: int         # weight bytes one decoded token reads
    config: dict = field(default_factory=dict)   # the EngineConfig as resolved at load
    model_max_tokens: int = 0        # the longest context the model allows (0: not known)


def engine_facts(engine: LLMEngine) -> EngineFacts:
    """Read on the loop thread (``loop.call(engine_facts)``)."""
    tok = engine.tokenizer
    vocab = engine.loaded.spec.vocab_size
    special = set(engine.eos_ids)
    if tok is not None:
        vocab = min(vocab, tok.vocab_size)
        special |= {i for i in (tok.bos_token_id, tok.pad_token_id) if i is not None}
    return EngineFacts(engine.model_info.name, str(engine.loaded.device), vocab, frozenset(special), tok is not None,
                       engine.context_tokens, engine.config.max_batch, engine.loaded.active_bytes_per_token(),
                       dataclasses.asdict(engine.config), engine.loaded.spec.max_position)


@dataclass(frozen=True)
class Limits:
    """Measured bandwidths a run is set against (GB/s, 1e9); None where there is no such limit."""

    hbm_gb_s: float | None           # device copy, read + write
    bus_gb_s: float | None           # page-locked host -> device
    note: str | None = None          # why a limit is None


def measure_limits(device: torch.device | str) -> Limits:
    """Device-copy and pinned host-to-device bandwidth of ``device``; none on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return Limits(None, None, "no roofline on the CPU")
    try:
        return Limits(_copy_gb_s(device), _h2d_gb_s(device))
    except torch.OutOfMemoryError:
        return Limits(None, None, f"no roofline: the GPU had no {2 * PROBE_BYTES >> 20} MiB free to measure "
                                  "its bandwidth in")
    finally:
        torch.cuda.empty_cache()


def _timed(fn, repeats: int, device: torch.device) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / repeats


def _copy_gb_s(device: torch.device) -> float:
    a = torch.empty(PROBE_BYTES, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return 2 * PROBE_BYTES / _timed(lambda: b.copy_(a), 50, device) / 1e9


def _h2d_gb_s(device: torch.device) -> float:
    src = torch.empty(PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(PROBE_BYTES, dtype=torch.uint8, device=device)
    return PROBE_BYTES / _timed(lambda: dst.copy_(src, non_blocking=True), 20, device) / 1e9


def synced_stats(engine: LLMEngine) -> EngineStats:
    """A snapshot with every device-side count of the steps so far in (on CUDA a snapshot may hold the
    counts of the call before, so it is taken twice around a sync)."""
    engine.stats()
    if engine.loaded.device.type == "cuda":
        torch.cuda.synchronize(engine.loaded.device)
    return engine.stats()


class EngineProbe:
    """Step times and counters of the runs on ``loop`` between :meth:`start` and :meth:`stop`."""

    def __init__(self, loop: EngineLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._step_ms: list[float] = []
        self._mark: tuple[int, int] | None = None
        self._before: EngineStats | None = None

    def start(self) -> None:
        self._before = self._loop.call(self._begin).result()

    def stop(self) -> tuple[list[float], EngineStats, EngineStats]:
        """(step ms of every step run since :meth:`start`, stats at the start, stats now)."""
        after = self._loop.call(self._end).result()
        with self._lock:
            return list(self._step_ms), self._before, after

    def _begin(self, engine: LLMEngine) -> EngineStats:
        stats = synced_stats(engine)
        self._mark = _mark(engine)
        self._loop.add_tick(self._tick)          # on the loop thread: no step runs between the two
        return stats

    def _end(self, engine: LLMEngine) -> EngineStats:
        self._loop.remove_tick(self._tick)
        return synced_stats(engine)

    def _tick(self) -> None:
        engine = self._loop.engine
        if engine is None:
            return
        mark = _mark(engine)
        if mark != self._mark:                   # a step ran (an idle wait changes no counter)
            self._mark = mark
            with self._lock:
                self._step_ms.append(engine.counters.step_ms)


def _mark(engine: LLMEngine) -> tuple[int, int]:
    c = engine.counters
    return c.prompt_tokens, c.generated_tokens


@dataclass(frozen=True)
class EngineFigures:
    """What the engine measured over a run, and the run against its limits."""

    steps: int
    step_p50_ms: float | None
    step_p99_ms: float | None
    expert_lookups: int              # hits + misses (0 when every expert is resident)
    expert_hit_rate: float
    h2d_bytes: int
    bus_gb_s: float                  # H2D bytes over the run's wall time
    bus_bytes_per_token: float
    hbm_bytes_per_token: int
    hbm_limit_gb_s: float | None
    bus_limit_gb_s: float | None
    hbm_fraction: float | None       # see the module docstring
    bus_fraction: float | None
    roofline_note: str | None


def engine_figures(step_ms: list[float], before: EngineStats, after: EngineStats, facts: EngineFacts,
                   limits: Limits, summary: Summary) -> EngineFigures:
    hits = after.experts.hits - before.experts.hits
    misses = after.experts.misses - before.experts.misses
    h2d = after.experts.h2d_bytes - before.experts.h2d_bytes
    tokens, wall = summary.output_tokens, summary.wall_s
    bus = h2d / wall / 1e9 if wall > 0 else 0.0
    hbm_fraction = None
    if limits.hbm_gb_s and summary.stream_tok_s:
        hbm_fraction = facts.hbm_bytes_per_token / (limits.hbm_gb_s * 1e9) * summary.stream_tok_s
    return EngineFigures(
        steps=len(step_ms), step_p50_ms=percentile(step_ms, 50), step_p99_ms=percentile(step_ms, 99),
        expert_lookups=hits + misses, expert_hit_rate=hits / (hits + misses) if hits + misses else 1.0,
        h2d_bytes=h2d, bus_gb_s=bus, bus_bytes_per_token=h2d / tokens if tokens else 0.0,
        hbm_bytes_per_token=facts.hbm_bytes_per_token, hbm_limit_gb_s=limits.hbm_gb_s,
        bus_limit_gb_s=limits.bus_gb_s, hbm_fraction=hbm_fraction,
        bus_fraction=bus / limits.bus_gb_s if limits.bus_gb_s else None, roofline_note=limits.note)
