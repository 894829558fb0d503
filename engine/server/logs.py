"""The server's log lines: ``[Stats]`` every N engine steps, and the summary when it stops.

``[Stats] step=100 throughput=107.80 tok/s running=16 queued=3 hit_rate=0.912 bus=5.21 GB/s``: rates
over the steps since the previous line (tokens and bytes from the engine's cumulative counters, over
the time those steps took, so idle minutes between requests do not dilute them). The access line
of each request is written by :class:`engine.server.asgi.AccessLog`.
"""
from __future__ import annotations

import logging
import statistics
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.loop import EngineLoop

log = logging.getLogger("strata.server")

STEP_SAMPLES = 100_000            # recent step latencies kept for the summary's median


@dataclass
class Totals:
    """What this server answered, for the summary (asyncio loop only)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int, ttft_s: float | None) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if ttft_s is not None:
            self.ttft_sum_s += ttft_s
            self.ttft_count += 1


@dataclass(frozen=True)
class _Mark:
    """Counters at the previous [Stats] line."""

    busy_s: float                 # step time summed since the server started
    step: int
    generated: int
    hits: int
    misses: int
    h2d_bytes: int


class StatsLog:
    """A tick on the engine loop (loop thread): notes each step's latency and writes a [Stats] line
    every ``every`` steps (0: no lines)."""

    def __init__(self, loop: EngineLoop, every: int) -> None:
        self.loop = loop
        self.every = every
        self.step_ms: deque[float] = deque(maxlen=STEP_SAMPLES)
        self._seen = loop.steps
        self._busy_s = 0.0
        self._mark: _Mark | None = None
        self._engine: Any = lambda: None          # weak reference to the engine the mark belongs to

    def tick(self) -> None:
        steps = self.loop.steps
        if steps == self._seen:
            return
        self._seen = steps
        engine = self.loop.engine
        if engine is None:
            return
        step_ms = engine.counters.step_ms
        self.step_ms.append(step_ms)
        self._busy_s += step_ms / 1e3
        if self.every and (self._mark is None or self._engine() is not engine or steps - self._mark.step >= self.every):
            self._line(engine, steps)

    def _line(self, engine: Any, steps: int) -> None:
        s = engine.stats()
        mark = _Mark(self._busy_s, steps, s.generated_tokens, s.experts.hits, s.experts.misses,
                     s.experts.h2d_bytes)
        prev, self._mark = (self._mark if self._engine() is engine else None), mark
        self._engine = weakref.ref(engine)
        if prev is None:
            return                                 # the first mark of an engine only sets the baseline
        dt = max(mark.busy_s - prev.busy_s, 1e-9)
        lookups = (mark.hits - prev.hits) + (mark.misses - prev.misses)
        hit_rate = f"{(mark.hits - prev.hits) / lookups:.3f}" if lookups else "-"
        log.info("[Stats] step=%d throughput=%.2f tok/s running=%d queued=%d hit_rate=%s bus=%.2f GB/s",
                 steps, (mark.generated - prev.generated) / dt, s.running, s.waiting, hit_rate,
                 (mark.h2d_bytes - prev.h2d_bytes) / dt / 1e9)

    def summary(self, totals: Totals) -> str:
        steps = list(self.step_ms)
        p50 = f"{statistics.median(steps):.2f}ms" if steps else "-"
        ttft = f"{totals.ttft_sum_s / totals.ttft_count * 1e3:.1f}ms" if totals.ttft_count else "-"
        return (f"[Summary] requests={totals.requests} total_tokens={totals.prompt_tokens + totals.completion_tokens} "
                f"(prompt={totals.prompt_tokens} completion={totals.completion_tokens}) avg_ttft={ttft} "
                f"p50_step={p50}")
