"""The one place the workbench drives the engine: an ``EngineBridge`` running the shared engine loop in a
QThread.

The bridge's QThread runs :class:`engine.loop.EngineLoop` (the same loop the HTTP server drives), so the
engine is stepped, cancelled and swapped in one place, and a local HTTP server started on
``bridge.engine_loop`` serves the engine the panels show. The GUI's calls (``submit``, ``cancel``,
``reconfigure``, ``load_model``, ``pause``/``resume``, ``shutdown``) only queue commands on that loop; the
workbench's own commands are handled by :meth:`EngineBridge._handle` on the loop thread. Results leave as
Qt signals carrying frozen dataclasses: text coalesced to at most ~30 batches a second, stats about 10
times a second, both from a tick the loop runs after every step and idle wait. The engine is not
thread-safe, so every call on the running engine happens on the loop thread.

Another model is built on a loader thread while the current one keeps running; the current one closes
only once the new one is ready, so a folder that fails to load leaves the working model in place. When
both cannot be held at once (:func:`app.model_loader.must_unload_first`) the current one closes first, and a failed load
opens it again with the options it had.

Every message that leaves the bridge is in the workbench's words (:func:`app.cli_wording.gui_wording`):
a fix that names a CLI flag names the knob or the menu that does it here.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.bridge_api import (LIVE_NAMES, LIVE_OPTIONS, EngineLoop, Job, RequestDelta, SamplingParams, StrataError,
                            TemplateFailure, TemplateFixes, apply_cpu_threads, failure_line, fit_messages, fit_text,
                            reasoning_reader)
from app.bridge_state import describe_model, knob_state, synthetic_prompt
from app.cli_wording import OPEN_MODEL, gui_wording, load_wording
from app.model_loader import EngineFactory, Load, Loaded, Loader, must_unload_first, open_engine
from app.messages import BridgeError, ContextUsage, KnobResult, PauseState, ReplyRequest
from app.reply_text import ReplyText
from app.reply_tracker import ReplyTracker

log = logging.getLogger(__name__)

TEXT_INTERVAL_S = 1 / 30     # coalesce text deltas to at most ~30 Hz
STATS_INTERVAL_S = 0.1       # ~10 Hz
IDLE_WAIT_S = 0.05           # how long the idle loop blocks on the command queue
GIL_SWITCH_S = 0.001
ENGINE_NICE = 5              # the engine thread's niceness above the GUI's: the GUI wins a contended core

_CHOICES = {o.name: o.choices for o in LIVE_OPTIONS if o.kind == "choice"}
# What a chat template that failed leaves the window's user to do (the line names the template's file).
_REOPEN = f"fix the template there and open the folder again with {OPEN_MODEL}"
TEMPLATE_FIXES = TemplateFixes(fault=_REOPEN,
                               system="clear System under System prompt and sampling, then press Regenerate",
                               other=f"start a new chat (+ New chat), or {_REOPEN}",
                               conversation=_REOPEN)     # no change to the chat gets it through

__all__ = ["EngineBridge", "open_engine"]


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


# --- the workbench's own loop commands (GUI thread -> loop thread, through EngineLoop.post) ---------
@dataclass(frozen=True)
class _Submit:
    request: ReplyRequest


@dataclass(frozen=True)
class _Reconfigure:
    changes: tuple[tuple[str, object], ...]     # (option, value), applied together (see _apply)


@dataclass(frozen=True)
class _Pause:
    paused: bool
    reason: str


@dataclass(frozen=True)
class _Shutdown:
    pass


class EngineBridge(QObject):
    """Owns the engine loop on a private thread; talk to it only through its methods and signals.

    ``engine_loop`` is the loop itself, for front ends that submit their own jobs (the local HTTP server);
    their requests share the engine, its stats and its panels with the window's.
    """

    model_loading = Signal(str, bool)    # model path, whether the current model keeps running meanwhile
    model_loaded = Signal(object)        # ModelDescription
    knobs_changed = Signal(object)       # KnobState
    knob_result = Signal(object)         # KnobResult
    text = Signal(object)                # TextBatch
    reply_finished = Signal(object)      # ReplyStats
    stats = Signal(object)               # EngineStats (frozen, from the engine)
    error = Signal(object)               # BridgeError
    paused_changed = Signal(object)      # PauseState
    context = Signal(object)             # ContextUsage of a chat or completion request, before it runs
    stopped = Signal()

    def __init__(self, engine_factory: EngineFactory = open_engine,
                 unload_first: Callable[[str, dict, dict | None], bool] = must_unload_first,
                 fallback: str | None = None) -> None:
        """``fallback``: the model folder to open when a load fails with no model running (the bundled
        demo), so that the window has a model whenever one can be opened; None: none."""
        super().__init__()
        self._unload_first = unload_first
        self._fallback = fallback
        self.engine_loop = EngineLoop(handler=self._handle, on_error=self._on_loop_error, idle_wait_s=IDLE_WAIT_S)
        self.engine_loop.add_tick(self._emit_periodic)
        self._current: Load | None = None      # what the running engine was loaded from
        self._loading: Load | None = None      # the load in flight on the loader thread
        self._next: Load | None = None         # asked for while another load was in flight (the last one wins)
        self._closed: Load | None = None       # closed to make room for the load in flight
        self._closing = False                  # shutting down: nothing new starts, built engines are closed
        self._loader = Loader(engine_factory, self.engine_loop.post)
        self._defaults: dict[str, object] = {}
        self._knob_values: tuple = ()            # the live values the knobs were last sent
        self._tracker = ReplyTracker()
        self._pending = ReplyText()            # text (and reasoning) not yet sent to the GUI
        self._ended: list[RequestDelta] = []   # final deltas of the window's requests, not yet reported
        self._last_text = 0.0
        self._last_stats = 0.0
        self._thread = QThread()
        self._thread.setObjectName("strata-engine")
        self.moveToThread(self._thread)
        self._thread.started.connect(self._run)

    @property
    def _engine(self) -> Any:
        return self.engine_loop.engine

    # --- GUI-thread API: each call only enqueues ------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (no model yet: call ``load_model``).

        The engine thread runs Python between its tensor operations; a short GIL switch interval makes
        it hand the interpreter back to the GUI thread within ~1 ms instead of the default 5 ms.
        """
        sys.setswitchinterval(GIL_SWITCH_S)
        self._thread.start()

    def load_model(self, model: str, options: dict | None = None) -> None:
        """Open ``model`` with engine ``options``; the current engine runs until the new one is ready."""
        self.engine_loop.post(Load(model, tuple(sorted((options or {}).items()))))

    def submit(self, request: ReplyRequest) -> None:
        """Queue a generation; its text arrives through ``text`` and its end through ``reply_finished``."""
        self.engine_loop.post(_Submit(request))

    def cancel(self, request_id: str) -> None:
        """Stop a request before the next step (finish reason "abort")."""
        self.engine_loop.cancel(request_id)

    def reconfigure(self, option: str, value: object) -> None:
        """Change one live option; the answer comes back through ``knob_result``."""
        self.engine_loop.post(_Reconfigure(((option, value),)))

    def reconfigure_all(self, changes: list[tuple[str, object]]) -> None:
        """Change several live options as one: each is tried again once others have applied (one may
        need another's new value: a lower max_batch before a smaller max_batch_tokens); one answer per
        option through ``knob_result``."""
        if changes:
            self.engine_loop.post(_Reconfigure(tuple(changes)))

    def pause(self, reason: str) -> None:
        """Stop stepping the engine (requests wait) until ``resume``."""
        self.engine_loop.post(_Pause(True, reason))

    def resume(self, reason: str) -> None:
        self.engine_loop.post(_Pause(False, reason))

    def synthetic_prompt_ids(self, n_tokens: int, timeout_s: float = 60.0) -> list[int]:
        """Exactly ``n_tokens`` token ids of ordinary text for the loaded model (the load test's prompt when
        it goes through HTTP). Blocks until the loop answers: call it from a worker thread, never the GUI's.
        """
        return self.engine_loop.call(lambda engine: _synthetic_ids(engine, n_tokens)).result(timeout_s)

    def shutdown(self, timeout_ms: int = 10000) -> None:
        """Close the engine and join the thread."""
        if self._thread.isRunning():
            self.engine_loop.post(_Shutdown())
            self._thread.quit()
            self._thread.wait(timeout_ms)

    # --- the loop thread ------------------------------------------------------------------------
    @Slot()
    def _run(self) -> None:
        _lower_thread_priority(ENGINE_NICE)
        self.engine_loop.run()
        self.stopped.emit()

    def _on_loop_error(self, exc: Exception, internal: bool) -> None:
        """A step or a command failed: a banner; after a bug the loop has ended every job already."""
        if internal:
            self.error.emit(BridgeError(f"internal error: {exc}", "internal"))
            self._report_ended()
            for rid in self._tracker.ids():      # a reply the bug cut off before it reached the engine
                self._end(rid, "error", f"internal error: {exc}")
        else:
            self.error.emit(BridgeError(self._wording(str(exc)), "engine"))

    def _guarded(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` (outside the loop's own guard, e.g. in a tick) with the loop's error handling."""
        try:
            fn()
        except StrataError as exc:
            self._on_loop_error(exc, False)
        except Exception as exc:
            log.exception("internal error in the engine thread")
            self.engine_loop.fail_all(f"internal error: {exc}")
            self._on_loop_error(exc, True)

    def _handle(self, cmd: object) -> None:
        if self._closing:
            self._handle_closing(cmd)
        elif isinstance(cmd, _Submit):
            self._add(cmd.request)
        elif isinstance(cmd, _Reconfigure):
            self._apply(cmd.changes)
        elif isinstance(cmd, Load):
            self._request_load(cmd)
        elif isinstance(cmd, Loaded):
            self._on_loaded(cmd)
        elif isinstance(cmd, _Pause):
            self.engine_loop.paused = cmd.paused
            self.paused_changed.emit(PauseState(cmd.paused, cmd.reason))
        elif isinstance(cmd, _Shutdown):
            self._shut_down()

    def _shut_down(self) -> None:
        """Close the engine, wait for a build in flight (its engine is closed when its answer comes), stop."""
        self._closing = True
        self._close_engine("the workbench was closed")
        self._loader.join()          # its Loaded is queued now, ahead of the stop
        self.engine_loop.stop()

    def _handle_closing(self, cmd: object) -> None:
        if isinstance(cmd, Loaded) and cmd.engine is not None:
            self._guarded(cmd.engine.close)          # built for a window that is closing: never runs

    # --- loading (loop thread; the build itself runs on the loader thread) ----------------------
    def _request_load(self, load: Load) -> None:
        if self._loading is not None:
            self._next = load
            return
        self._loading = load
        running = dict(self._current.options) if self._current is not None else None
        closing = self._engine is not None and self._unload_first(str(self._engine.loaded.device), dict(load.options),
                                                                  running)
        if closing:
            self._closed = self._current
            self._close_engine(f"the model was closed to load {Path(load.model).name}")
        self.model_loading.emit(load.model, self._engine is not None)
        self._loader.start(load)

    def _on_loaded(self, done: Loaded) -> None:
        self._loader.join()
        self._loading = None
        if done.engine is not None:
            self._switch_to(done)
        else:
            self._load_failed(done)
        if self._next is not None and self._loading is None:
            load, self._next = self._next, None
            self._request_load(load)

    def _switch_to(self, done: Loaded) -> None:
        """The new engine is ready: close the old one and announce the new."""
        self._close_engine(f"the model was changed to {Path(done.load.model).name}")
        self.engine_loop.set_engine(done.engine)
        self._current, self._closed = done.load, None
        if self._engine.loaded.cpu_threads is not None:
            # the thread count chosen at load is set from the thread that runs the engine (as
            # engine.cpu_threads asks); the load itself ran on the loader thread
            apply_cpu_threads(self._engine.loaded.cpu_threads, 0)
        cfg = self._engine.config
        self._defaults = {name: getattr(cfg, name) for name in sorted(LIVE_NAMES)}
        self.model_loaded.emit(describe_model(self._engine, _load_wording))
        self._emit_knobs()
        self._emit_stats()
        if done.load.failed:
            how = "instead" if done.load.instead else "again"
            self.error.emit(BridgeError(f"{done.load.failed}; {self._engine.model_info.name} was opened {how}", "load"))

    def _load_failed(self, done: Loaded) -> None:
        error = _without_folder(str(done.error), done.load.model)
        why = f"Could not open {done.load.model}: {_load_wording(error)}"
        if done.load.failed:           # bringing the previous model back (or the fallback) failed too
            how = "instead" if done.load.instead else "again"
            why = f"{done.load.failed}, and opening {done.load.model} {how} failed too: {_load_wording(error)}"
        elif self._engine is not None:
            why += f" ({self._engine.model_info.name} is still loaded)"
        elif self._closed is not None:
            previous, self._closed = self._closed, None
            self._request_load(Load(previous.model, previous.options, failed=why))
            return
        elif self._fallback and not done.load.instead and self._next is None \
                and Path(done.load.model).resolve() != Path(self._fallback).resolve():
            self._request_load(Load(self._fallback, done.load.options, failed=why, instead=True))
            return
        self.error.emit(BridgeError(why, "load"))
        if self._engine is not None:
            self._emit_knobs()

    def _close_engine(self, why: str) -> None:
        """End every request (the window's and any other front end's) with ``why``; close the engine."""
        if self._engine is None:
            return
        self.engine_loop.fail_all(why)
        self._report_ended(closed=why)    # with this engine's counters, before it goes
        engine = self.engine_loop.drop_engine(why)
        try:
            engine.close()
        except Exception:
            log.exception("closing the engine failed")

    # --- the window's requests ------------------------------------------------------------------
    def _add(self, req: ReplyRequest) -> None:
        if self._engine is None:
            self.error.emit(BridgeError("No model is loaded; open a model folder with File › Open model folder…",
                                        "engine"))
            self._finish_untracked(req, "no model loaded")
            return
        experts = self._engine.stats().experts
        self._tracker.start(req.request_id, req.tag, experts.hits, experts.misses, time.perf_counter())
        try:
            s = req.settings
            params = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                                    top_k=s.top_k, ignore_eos=req.ignore_eos)
            prompt = self._prompt_of(req)
            reader = reasoning_reader(self._engine.tokenizer, prompt) if req.messages else None
            if reader is not None:
                self._pending.read_apart(req.request_id, reader)
            self.engine_loop.add_now(Job(req.request_id, prompt, params, self._on_delta))
        except TemplateFailure as exc:   # the model folder's chat template failed: said in the reply
            self._end(req.request_id, "error", failure_line(exc, TEMPLATE_FIXES))
        except StrataError as exc:       # the request's own mistake: said in its reply (or load-test row) only
            self._end(req.request_id, "error", self._wording(str(exc)))
        except Exception as exc:
            self._end(req.request_id, "error", f"internal error: {exc}")   # no reply waits forever
            raise

    def _prompt_of(self, req: ReplyRequest) -> list[int]:
        """The request's prompt as token ids; a chat or completion is fitted into the context first, and
        what that cost goes out as ``context`` before the request runs."""
        tok = self._engine.tokenizer
        if req.synthetic_prompt_tokens:
            return synthetic_prompt(tok, req.synthetic_prompt_tokens)
        s, limit = req.settings, self._engine.loaded.max_model_len
        if req.prompt is not None:
            fitted = fit_text(tok, req.prompt, limit, s.max_tokens, s.context_overflow)
        else:
            msgs = [{"role": m.role, "content": m.content} for m in req.messages]
            renderer = tok if tok.harmony is None else tok.harmony.prompter(s.reasoning_effort)
            fitted = fit_messages(renderer, msgs, limit, s.max_tokens, s.context_overflow)
        self.context.emit(ContextUsage(req.request_id, fitted.prompt_tokens, fitted.context_tokens,
                                       fitted.reply_tokens, fitted.dropped_messages, self._wording(fitted.note)))
        return fitted.token_ids

    def _finish_untracked(self, req: ReplyRequest, why: str) -> None:
        self._tracker.start(req.request_id, req.tag, 0, 0, time.perf_counter())
        self._end(req.request_id, "error", why)

    def _on_delta(self, d: RequestDelta) -> None:
        """The sink of the window's jobs (loop thread): bookkeeping only, the engine is not touched here;
        a finished reply is reported by the next tick."""
        self._tracker.on_tokens(d.request_id, len(d.new_token_ids), d.prompt_tokens,
                                d.completion_tokens, d.ttft_ms, time.perf_counter())
        self._pending.add(d)
        if d.finished:
            self._ended.append(d)

    def _report_ended(self, closed: str | None = None) -> None:
        """Send ``reply_finished`` for every reply that ended since the last report; one that ended because
        the engine was closed for ``closed`` (a model change, the window closing) finishes as "closed"."""
        ended, self._ended = self._ended, []
        for d in ended:
            reason = d.finish_reason or "stop"
            if closed is not None and reason == "error" and d.error == closed:
                reason = "closed"
            self._end(d.request_id, reason, d.error)

    def _end(self, request_id: str, reason: str, error: str | None = None) -> None:
        self._flush_text()
        self._pending.forget(request_id)
        hits = misses = 0
        if self._engine is not None:
            experts = self._engine.stats().experts
            hits, misses = experts.hits, experts.misses
        result = self._tracker.finish(request_id, reason, hits, misses, time.perf_counter(),
                                      None if error is None else self._wording(error))
        if result is not None:
            self.reply_finished.emit(result)

    # --- knobs ----------------------------------------------------------------------------------
    def _apply(self, changes: tuple[tuple[str, object], ...]) -> None:
        """Apply ``changes`` one option at a time, in rounds: an option refused in one round is tried
        again after a round in which another applied; what is still refused then is answered with the
        engine's reason."""
        if self._engine is None:
            for option, value in changes:
                self.knob_result.emit(KnobResult(option, value, False, "no model is loaded"))
            return
        pending, answers = dict(changes), {}
        while pending:
            progress = False
            for option, value in list(pending.items()):
                try:
                    applied = self._engine.reconfigure(**{option: value})
                except StrataError as exc:
                    answers[option] = KnobResult(option, value, False, self._wording(str(exc)))
                    continue
                answers[option] = KnobResult(option, value, True, self._wording(applied.get(option, "applied")))
                del pending[option]
                progress = True
            if not progress:
                break
        for option, _ in changes:
            self.knob_result.emit(answers[option])
        self._emit_knobs()

    def _emit_knobs(self) -> None:
        self._knob_values = self._live_values()
        self.knobs_changed.emit(knob_state(self._engine, self._defaults, _CHOICES, self._wording))

    def _live_values(self) -> tuple:
        cfg = self._engine.config
        return tuple(getattr(cfg, name) for name in sorted(self._defaults))

    def _wording(self, text: str) -> str:
        """An engine message about the running model in the workbench's words: option names as the
        knobs' labels, flags whose knob works now as that knob."""
        if "--" not in text:
            return gui_wording(text, ())
        usable = () if self._engine is None else [k for k, why in self._engine.live_options().items() if why is None]
        return gui_wording(text, usable)

    # --- the tick: coalesced text, finished replies, stats --------------------------------------
    def _flush_text(self) -> None:
        batch = self._pending.take()
        if batch is not None:
            self.text.emit(batch)
        self._last_text = time.perf_counter()

    def _emit_periodic(self) -> None:
        if self._ended:
            self._guarded(self._report_ended)
        now = time.perf_counter()
        if self._pending and now - self._last_text >= TEXT_INTERVAL_S:
            self._flush_text()
        if self._engine is not None and now - self._last_stats >= STATS_INTERVAL_S:
            self._guarded(self._emit_stats)

    def _emit_stats(self) -> None:
        self._last_stats = time.perf_counter()
        self.stats.emit(self._engine.stats())
        if self._live_values() != self._knob_values:     # changed by another front end (the local server)
            self._emit_knobs()


def _synthetic_ids(engine: Any, n_tokens: int) -> list[int]:
    if engine is None:
        raise StrataError("no model is loaded; open a model folder with File › Open model folder…")
    return synthetic_prompt(engine.tokenizer, n_tokens)


def _without_folder(error: str, model: str) -> str:
    """A load error without the model folder it starts with (the line names it once, before)."""
    for name in {str(model), str(Path(model)), str(Path(model).expanduser().resolve())}:
        if error.startswith(f"{name}: "):
            return error.removeprefix(f"{name}: ")
    return error


def _load_wording(text: str) -> str:
    """A message about a load (why it failed, what it clamped): its fixes take effect at the next start."""
    return load_wording(text)
