"""A stand-in engine whose step costs what it is told: for measuring what runs beside the engine.

:class:`FakeEngine` answers what :class:`engine.loop.EngineLoop` and the HTTP server ask of an
``LLMEngine`` (``add_request``, ``step``, ``abort_now``, ``has_unfinished``, the model facts the server
reads), and its step is a :class:`StepShape`: milliseconds of pure Python (the interpreter lock held,
as an offloaded step's bookkeeping holds it) cut by waits that let the lock go (as waiting on the GPU
does), then one token for every running request. Each step notes its wall time, its own CPU time and
the waits it asked for (:class:`StepLog`): wall less the other two is what it lost waiting for the
lock (and for a core).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.outputs import RequestDelta
from engine.sampling import SamplingParams

VOCAB = 32000


@dataclass(frozen=True)
class StepShape:
    """One engine step: ``python_ms`` of Python under the lock, split by ``syncs`` waits of ``wait_ms``
    in all (the lock let go), then one token per running request."""

    python_ms: float = 3.0
    wait_ms: float = 6.0
    syncs: int = 3


def calibrate(ms: float = 20.0) -> float:
    """Iterations of :func:`spin` per millisecond on this machine (best of a few tries)."""
    best = 0.0
    for _ in range(5):
        t0 = time.thread_time()
        spin(200_000)
        best = max(best, 200_000 / ((time.thread_time() - t0) * 1e3))
    return best


def spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


@dataclass
class _Seq:
    rid: str
    prompt_len: int
    max_tokens: int
    made: int = 0


@dataclass
class StepLog:
    """Per step (loop thread): wall ms, own CPU ms, the waits asked for."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)

    def lost_ms(self) -> list[float]:
        return [w - c - s for w, c, s in zip(self.wall, self.cpu, self.waits)]


@dataclass(frozen=True)
class _Config:
    model: str
    max_batch: int


@dataclass(frozen=True)
class _Spec:
    vocab_size: int


@dataclass(frozen=True)
class _Loaded:
    spec: _Spec


@dataclass
class _Counters:
    step_ms: float = 0.0


class FakeEngine:
    """What the server and the loop ask of an engine, with a step of a set cost (loop thread only)."""

    def __init__(self, shape: StepShape, per_ms: float, max_batch: int = 16) -> None:
        self.shape, self.per_ms = shape, per_ms
        self.config = _Config("fake", max_batch)
        self.tokenizer = None
        self.context_tokens = 4096
        self.loaded = _Loaded(_Spec(VOCAB))
        self.counters = _Counters()
        self.log = StepLog()
        self._running: dict[str, _Seq] = {}
        self._waiting: list[_Seq] = []

    def has_unfinished(self) -> bool:
        return bool(self._running or self._waiting)

    def add_request(self, rid: str, prompt, params: SamplingParams) -> None:
        self._waiting.append(_Seq(rid, len(prompt), params.max_tokens))

    def abort_now(self, rid: str) -> RequestDelta | None:
        seq = self._running.pop(rid, None)
        if seq is None:
            seq = next((s for s in self._waiting if s.rid == rid), None)
            if seq is None:
                return None
            self._waiting.remove(seq)
        return RequestDelta(rid, (), "", True, "abort", seq.prompt_len, seq.made)

    def step(self) -> list[RequestDelta]:
        t0, c0 = time.perf_counter(), time.thread_time()
        while self._waiting and len(self._running) < self.config.max_batch:
            seq = self._waiting.pop(0)
            self._running[seq.rid] = seq
        s = self.shape
        part_n, part_wait = int(s.python_ms / s.syncs * self.per_ms), s.wait_ms / s.syncs / 1e3
        for _ in range(s.syncs):
            spin(part_n)
            time.sleep(part_wait)
        deltas = [self._advance(seq) for seq in list(self._running.values())]
        wall = (time.perf_counter() - t0) * 1e3
        self.counters.step_ms = wall
        self.log.wall.append(wall)
        self.log.cpu.append((time.thread_time() - c0) * 1e3)
        self.log.waits.append(s.wait_ms)
        return deltas

    def _advance(self, seq: _Seq) -> RequestDelta:
        seq.made += 1
        token = (seq.prompt_len * 31 + seq.made) % (VOCAB - 10) + 10
        done = seq.made >= seq.max_tokens
        if done:
            del self._running[seq.rid]
        return RequestDelta(seq.rid, (token,), f" w{token}", done, "length" if done else None, seq.prompt_len,
                            seq.made, ttft_ms=1.0 if seq.made == 1 else None)
