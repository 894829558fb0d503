"""The one place the workbench drives the engine: an ``EngineBridge`` living in its own QThread.

The GUI puts commands on a thread-safe queue (``submit``, ``cancel``, ``reconfigure``, ``load_model``,
``pause``/``resume``, ``shutdown``); the bridge loop steps the engine while it has work and blocks on
the queue (briefly) when idle. Results leave as Qt signals carrying frozen dataclasses: text coalesced
to at most ~30 batches a second, stats about 10 times a second. The engine is not thread-safe, so
every engine call happens on the bridge thread.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.config import EXPERT_POLICIES, EXPERT_READS, KV_DTYPES, LIVE_OPTIONS, EngineConfig
from engine.errors import StrataError
from engine.sampling import SamplingParams

from app.bridge_state import describe_model, knob_state, synthetic_prompt
from app.messages import (BridgeError, KnobResult, PauseState, ReplyRequest, TextBatch, TextChunk)
from app.reply_tracker import ReplyTracker

log = logging.getLogger(__name__)

TEXT_INTERVAL_S = 1 / 30     # coalesce text deltas to at most ~30 Hz
STATS_INTERVAL_S = 0.1       # ~10 Hz
IDLE_WAIT_S = 0.05           # how long the idle loop blocks on the command queue
GIL_SWITCH_S = 0.001
ENGINE_NICE = 5              # the engine thread's niceness above the GUI's: the GUI wins a contended core

EngineFactory = Callable[[str, dict], Any]
_CHOICES = {"expert_policy": EXPERT_POLICIES, "expert_reads": EXPERT_READS, "kv_cache_dtype": KV_DTYPES}


DEMO_POOL = "50%"


def open_engine(model: str, options: dict) -> Any:
    """Build the real engine for ``model`` with ``options`` (raises StrataError on a user error).

    CPU math gets every core but one, so the GUI thread always has a core to paint on.
    """
    import torch

    from engine.engine import LLMEngine
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    if options.get("expert_pool_size") is None and (Path(model) / "STRATA_DEMO.json").is_file():
        # the demo shows the machinery: half its experts pooled, so every residency knob is live from the start
        options = {**options, "expert_pool_size": DEMO_POOL}
    return LLMEngine(EngineConfig(model=model, **options))


def _lower_thread_priority(steps: int) -> None:
    """Make the calling thread ``steps`` nicer than it is (Linux nice is per thread; elsewhere a no-op).

    When the engine thread and the GUI thread want the same core, the scheduler then runs the GUI thread
    first, so a busy engine never delays a paint by a whole scheduler time slice.
    """
    if not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + steps)
    except OSError:
        log.debug("could not lower the engine thread's priority", exc_info=True)


# --- commands (GUI thread -> bridge thread) ---------------------------------------------------
@dataclass(frozen=True)
class _Submit:
    request: ReplyRequest


@dataclass(frozen=True)
class _Cancel:
    request_id: str


@dataclass(frozen=True)
class _Reconfigure:
    option: str
    value: object


@dataclass(frozen=True)
class _Load:
    model: str
    options: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class _Pause:
    paused: bool
    reason: str


@dataclass(frozen=True)
class _Shutdown:
    pass


class EngineBridge(QObject):
    """Owns the engine on a private thread; talk to it only through its methods and signals."""

    model_loading = Signal(str)          # model path
    model_loaded = Signal(object)        # ModelDescription
    knobs_changed = Signal(object)       # KnobState
    knob_result = Signal(object)         # KnobResult
    text = Signal(object)                # TextBatch
    reply_finished = Signal(object)      # ReplyStats
    stats = Signal(object)               # EngineStats (frozen, from the engine)
    error = Signal(object)               # BridgeError
    paused_changed = Signal(object)      # PauseState
    stopped = Signal()

    def __init__(self, engine_factory: EngineFactory = open_engine) -> None:
        super().__init__()
        self._factory = engine_factory
        self._commands: queue.Queue = queue.Queue()
        self._engine: Any = None
        self._defaults: dict[str, object] = {}
        self._tracker = ReplyTracker()
        self._pending: dict[str, list[str]] = {}
        self._last_text = 0.0
        self._last_stats = 0.0
        self._paused = False
        self._running = True
        self._thread = QThread()
        self._thread.setObjectName("strata-engine")
        self.moveToThread(self._thread)
        self._thread.started.connect(self._loop)

    # --- GUI-thread API: each call only enqueues ------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (no model yet: call ``load_model``).

        The engine thread runs Python between its tensor operations; a short GIL switch interval makes
        it hand the interpreter back to the GUI thread within ~1 ms instead of the default 5 ms.
        """
        sys.setswitchinterval(GIL_SWITCH_S)
        self._thread.start()

    def load_model(self, model: str, options: dict | None = None) -> None:
        """Close the current engine (if any) and open ``model`` with engine ``options``."""
        self._commands.put(_Load(model, tuple(sorted((options or {}).items()))))

    def submit(self, request: ReplyRequest) -> None:
        """Queue a generation; its text arrives through ``text`` and its end through ``reply_finished``."""
        self._commands.put(_Submit(request))

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step boundary (finish reason "abort")."""
        self._commands.put(_Cancel(request_id))

    def reconfigure(self, option: str, value: object) -> None:
        """Change one live option; the answer comes back through ``knob_result``."""
        self._commands.put(_Reconfigure(option, value))

    def pause(self, reason: str) -> None:
        """Stop stepping the engine (requests wait) until ``resume``."""
        self._commands.put(_Pause(True, reason))

    def resume(self, reason: str) -> None:
        self._commands.put(_Pause(False, reason))

    def shutdown(self, timeout_ms: int = 10000) -> None:
        """Close the engine and join the thread."""
        if self._thread.isRunning():
            self._commands.put(_Shutdown())
            self._thread.quit()
            self._thread.wait(timeout_ms)

    # --- the loop (bridge thread) ---------------------------------------------------------------
    @Slot()
    def _loop(self) -> None:
        _lower_thread_priority(ENGINE_NICE)
        while self._running:
            busy = self._engine is not None and not self._paused and self._guarded(self._engine.has_unfinished)
            try:
                cmd = self._commands.get_nowait() if busy else self._commands.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                cmd = None
            if cmd is not None:
                self._guarded(lambda: self._handle(cmd))
            elif busy:
                self._guarded(self._step)
                time.sleep(0)    # let go of the GIL between steps: a GUI thread waiting for it gets it now
            self._emit_periodic()
        self._close_engine()
        self.stopped.emit()

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; engine errors become a banner and the loop lives on."""
        try:
            return fn()
        except StrataError as exc:
            self.error.emit(BridgeError(str(exc), "engine"))
        except Exception as exc:
            log.exception("internal error in the engine thread")
            self.error.emit(BridgeError(f"internal error: {exc}", "internal"))
            self._fail_all(f"internal error: {exc}")
        return None

    def _handle(self, cmd: object) -> None:
        if isinstance(cmd, _Submit):
            self._add(cmd.request)
        elif isinstance(cmd, _Cancel):
            if self._engine is not None and cmd.request_id in self._tracker:
                self._engine.abort(cmd.request_id)
        elif isinstance(cmd, _Reconfigure):
            self._apply(cmd.option, cmd.value)
        elif isinstance(cmd, _Load):
            self._load(cmd.model, dict(cmd.options))
        elif isinstance(cmd, _Pause):
            self._paused = cmd.paused
            self.paused_changed.emit(PauseState(cmd.paused, cmd.reason))
        elif isinstance(cmd, _Shutdown):
            self._running = False

    def _load(self, model: str, options: dict) -> None:
        self._close_engine()
        self.model_loading.emit(model)
        try:
            self._engine = self._factory(model, options)
        except StrataError as exc:
            self.error.emit(BridgeError(str(exc), "load"))
            return
        cfg = self._engine.config
        self._defaults = {name: getattr(cfg, name) for name in sorted(LIVE_OPTIONS)}
        self.model_loaded.emit(describe_model(self._engine))
        self.knobs_changed.emit(knob_state(self._engine, self._defaults, _CHOICES))
        self._emit_stats()

    def _add(self, req: ReplyRequest) -> None:
        if self._engine is None:
            self.error.emit(BridgeError("No model is loaded; open a model folder with File › Open model…", "engine"))
            self._finish_untracked(req, "no model loaded")
            return
        experts = self._engine.stats().experts
        self._tracker.start(req.request_id, req.tag, experts.hits, experts.misses, time.perf_counter())
        try:
            s = req.settings
            params = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                                    top_k=s.top_k, ignore_eos=req.ignore_eos)
            self._engine.add_request(req.request_id, self._prompt_of(req), params)
        except StrataError as exc:
            self._end(req.request_id, "error", str(exc))
            raise

    def _prompt_of(self, req: ReplyRequest) -> str | list[int]:
        tok = self._engine.tokenizer
        if req.synthetic_prompt_tokens:
            return synthetic_prompt(tok, req.synthetic_prompt_tokens)
        if req.prompt is not None:
            return req.prompt
        msgs = [{"role": m.role, "content": m.content} for m in req.messages]
        return list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))

    def _finish_untracked(self, req: ReplyRequest, why: str) -> None:
        self._tracker.start(req.request_id, req.tag, 0, 0, time.perf_counter())
        self._end(req.request_id, "error", why)

    def _step(self) -> None:
        now = time.perf_counter()
        for d in self._engine.step():
            self._tracker.on_tokens(d.request_id, len(d.new_token_ids), d.prompt_tokens,
                                    d.completion_tokens, d.ttft_ms, now)
            if d.new_text:
                self._pending.setdefault(d.request_id, []).append(d.new_text)
            if d.finished:
                self._end(d.request_id, d.finish_reason or "stop", d.error)

    def _end(self, request_id: str, reason: str, error: str | None = None) -> None:
        self._flush_text()
        hits = misses = 0
        if self._engine is not None:
            experts = self._engine.stats().experts
            hits, misses = experts.hits, experts.misses
        result = self._tracker.finish(request_id, reason, hits, misses, time.perf_counter(), error)
        if result is not None:
            self.reply_finished.emit(result)

    def _fail_all(self, why: str) -> None:
        """After an internal error, end every request in flight so no reply waits forever."""
        for rid in self._tracker.ids():
            try:
                if self._engine is not None:
                    self._engine.abort(rid)
            except Exception:
                log.exception("abort after an internal error failed")
            self._end(rid, "error", why)

    def _apply(self, option: str, value: object) -> None:
        if self._engine is None:
            self.knob_result.emit(KnobResult(option, value, False, "no model is loaded"))
            return
        try:
            applied = self._engine.reconfigure(**{option: value})
        except StrataError as exc:
            self.knob_result.emit(KnobResult(option, value, False, str(exc)))
        else:
            self.knob_result.emit(KnobResult(option, value, True, applied.get(option, "applied")))
        self.knobs_changed.emit(knob_state(self._engine, self._defaults, _CHOICES))

    def _flush_text(self) -> None:
        if self._pending:
            chunks = tuple(TextChunk(rid, "".join(parts)) for rid, parts in self._pending.items())
            self._pending = {}
            self.text.emit(TextBatch(chunks))
        self._last_text = time.perf_counter()

    def _emit_periodic(self) -> None:
        now = time.perf_counter()
        if self._pending and now - self._last_text >= TEXT_INTERVAL_S:
            self._flush_text()
        if self._engine is not None and now - self._last_stats >= STATS_INTERVAL_S:
            self._guarded(self._emit_stats)

    def _emit_stats(self) -> None:
        self._last_stats = time.perf_counter()
        self.stats.emit(self._engine.stats())

    def _close_engine(self) -> None:
        if self._engine is None:
            return
        self._fail_all("the model was closed")
        try:
            self._engine.close()
        except Exception:
            log.exception("closing the engine failed")
        self._engine = None
