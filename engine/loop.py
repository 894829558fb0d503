"""``EngineLoop``: the one loop that drives an ``LLMEngine`` for every front end.

The engine is not thread-safe, so one thread owns it and runs :meth:`EngineLoop.run`: it steps the
engine while requests are unfinished and blocks briefly on a command queue when idle. Every other
thread talks to it only through that queue (``submit``, ``cancel``, ``call``, ``post``), and output
leaves through the sink each job was submitted with, called on the loop thread. The workbench bridge
runs this loop in its QThread and the HTTP server in a thread of its own; when the workbench serves
HTTP, both submit to the same loop, so the panels see the server's traffic.

Between two steps the loop first handles every queued command, so a cancel ends its request (and
frees its KV blocks) before the next step runs.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from engine.errors import StrataError
from engine.gil import offer_gil
from engine.outputs import RequestDelta
from engine.sampling import SamplingParams

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05          # how long an idle loop blocks on the command queue

Sink = Callable[[RequestDelta], None]


@dataclass(frozen=True)
class Job:
    """One generation: ``prompt`` (token ids, or text encoded by the engine) run with ``params``.

    ``sink`` receives every delta of the request on the loop thread, the final one included; it must
    return quickly (hand the delta to another thread's queue) and never call the engine.
    """

    request_id: str
    prompt: str | Sequence[int]
    params: SamplingParams
    sink: Sink


@dataclass(frozen=True)
class _Submit:
    job: Job
    accepted: Future


@dataclass(frozen=True)
class _Cancel:
    request_id: str


@dataclass(frozen=True)
class _Call:
    fn: Callable[[Any], Any]
    done: Future


@dataclass(frozen=True)
class _Stop:
    pass


class EngineLoop:
    """Owns one engine (or none yet) on the thread that calls :meth:`run`.

    ``handler(cmd)`` receives the commands given to :meth:`post` (a front end's own commands, such as
    the workbench's model loads) on the loop thread. ``on_error(exc, internal)`` hears what a step or a
    handled command raised: a StrataError (``internal`` False; the requests are kept) or a bug
    (``internal`` True; every request in flight was ended first). Tick callbacks (:meth:`add_tick`) run after
    every step and every idle wait.
    """

    def __init__(self, engine: Any = None, handler: Callable[[object], None] | None = None,
                 on_error: Callable[[Exception, bool], None] | None = None, idle_wait_s: float = IDLE_WAIT_S) -> None:
        self._engine = engine
        self._handler = handler
        self._on_error = on_error
        self._idle_wait_s = idle_wait_s
        self._commands: queue.Queue = queue.Queue()
        self._sinks: dict[str, Sink] = {}
        self._ticks: list[Callable[[], None]] = []
        self._ticks_lock = threading.Lock()
        self._running = False
        self._thread: threading.Thread | None = None
        self.paused = False          # loop thread only: while set, requests wait and no step runs
        self.steps = 0               # steps run since the loop started

    # ---- any thread -----------------------------------------------------------------------------
    def submit(self, job: Job) -> Future:
        """Queue ``job``; the future resolves to None once the engine took it, or to the StrataError that
        refused it (nothing is queued then, and the sink is never called)."""
        accepted: Future = Future()
        self._commands.put(_Submit(job, accepted))
        return accepted

    def cancel(self, request_id: str) -> None:
        """End a request before the next step: its sink gets a final delta with finish reason "abort"."""
        self._commands.put(_Cancel(request_id))

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run ``fn(engine)`` on the loop thread between steps; the future holds its result or exception.

        With no engine loaded ``fn`` gets None."""
        done: Future = Future()
        self._commands.put(_Call(fn, done))
        return done

    def post(self, cmd: object) -> None:
        """Hand ``cmd`` to the handler on the loop thread."""
        self._commands.put(cmd)

    def add_tick(self, fn: Callable[[], None]) -> None:
        with self._ticks_lock:
            self._ticks.append(fn)

    def remove_tick(self, fn: Callable[[], None]) -> None:
        with self._ticks_lock:
            if fn in self._ticks:
                self._ticks.remove(fn)

    def stop(self) -> None:
        """Make :meth:`run` return after the commands queued before this one."""
        self._commands.put(_Stop())

    def start_thread(self, name: str = "strata-engine") -> threading.Thread:
        """Run the loop on a new daemon thread."""
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- loop thread ------------------------------------------------------------------------------
    @property
    def engine(self) -> Any:
        return self._engine

    def in_flight(self) -> int:
        """Requests submitted through this loop and not finished yet."""
        return len(self._sinks)

    def run(self) -> None:
        self._running = True
        while self._running:
            busy = self._busy()
            try:
                cmd = self._commands.get_nowait() if busy else self._commands.get(timeout=self._idle_wait_s)
            except queue.Empty:
                cmd = None
            if cmd is not None:
                self._guarded(lambda: self._handle(cmd))
                if busy:
                    continue              # every queued command goes before the next step
            elif busy:
                self._guarded(self._step)
                offer_gil()              # a thread waiting for the GIL takes it between steps
            self._tick()
        self._answer_leftovers()

    def add_now(self, job: Job) -> None:
        """Add ``job`` to the engine at once (loop thread); raises the StrataError that refuses it."""
        if self._engine is None:
            raise StrataError("no model is loaded; load one before sending requests")
        self._engine.add_request(job.request_id, job.prompt, job.params)
        self._sinks[job.request_id] = job.sink

    def set_engine(self, engine: Any) -> None:
        """Run ``engine`` from now on (loop thread). The previous one must have been dropped."""
        self._engine = engine

    def drop_engine(self, why: str) -> Any:
        """End every request with ``why`` (finish reason "error") and let go of the engine; returns it
        for the caller to close."""
        self.fail_all(why)
        engine, self._engine = self._engine, None
        return engine

    def fail_all(self, why: str) -> None:
        """End every request in flight with finish reason "error" and ``why``."""
        for rid in list(self._sinks):
            final = None
            if self._engine is not None:
                try:
                    final = self._engine.abort_now(rid)
                except Exception:
                    log.exception("ending request %s failed", rid)
            self._deliver(RequestDelta(rid, (), "" if final is None else final.new_text, True, "error",
                                       0 if final is None else final.prompt_tokens,
                                       0 if final is None else final.completion_tokens, error=why))

    def _busy(self) -> bool:
        if self._engine is None or self.paused:
            return False
        try:
            return bool(self._engine.has_unfinished())
        except Exception:
            log.exception("the engine could not say whether it has work")
            return False

    def _handle(self, cmd: object) -> None:
        if isinstance(cmd, _Submit):
            if not cmd.accepted.set_running_or_notify_cancel():
                return
            try:
                self.add_now(cmd.job)
            except StrataError as exc:
                cmd.accepted.set_exception(exc)
            except Exception as exc:
                log.exception("adding request %s failed", cmd.job.request_id)
                cmd.accepted.set_exception(exc)
            else:
                cmd.accepted.set_result(None)
        elif isinstance(cmd, _Cancel):
            if cmd.request_id in self._sinks and self._engine is not None:
                final = self._engine.abort_now(cmd.request_id)
                if final is not None:
                    self._deliver(final)
        elif isinstance(cmd, _Call):
            if cmd.done.set_running_or_notify_cancel():
                try:
                    cmd.done.set_result(cmd.fn(self._engine))
                except BaseException as exc:          # the caller gets it, whatever it is
                    cmd.done.set_exception(exc)
        elif isinstance(cmd, _Stop):
            self._running = False
        elif self._handler is not None:
            self._handler(cmd)
        else:
            log.warning("the engine loop has no handler for %r", cmd)

    def _step(self) -> None:
        deltas = self._engine.step()
        self.steps += 1
        for d in deltas:
            self._deliver(d)

    def _deliver(self, delta: RequestDelta) -> None:
        sink = self._sinks.pop(delta.request_id, None) if delta.finished else self._sinks.get(delta.request_id)
        if sink is None:
            return
        try:
            sink(delta)
        except Exception:
            # a front end's bug must not stop the loop or the other requests
            log.exception("the output sink of request %s failed; the request is ended", delta.request_id)
            if not delta.finished and self._engine is not None:
                self._sinks.pop(delta.request_id, None)
                self._engine.abort_now(delta.request_id)

    def _guarded(self, fn: Callable[[], Any]) -> None:
        """Run ``fn``: a user error is reported and the loop lives on; a bug also ends every request, so no
        client waits forever."""
        try:
            fn()
        except StrataError as exc:
            if self._on_error is not None:
                self._on_error(exc, False)
            else:
                log.error("%s", exc)
        except Exception as exc:
            log.exception("internal error in the engine loop")
            self.fail_all(f"internal error: {exc}")
            if self._on_error is not None:
                self._on_error(exc, True)

    def _tick(self) -> None:
        with self._ticks_lock:
            ticks = list(self._ticks)
        for fn in ticks:
            try:
                fn()
            except Exception:
                log.exception("an engine loop tick failed")

    def _answer_leftovers(self) -> None:
        """After the loop ends: refuse what is still queued, so no caller waits on a future forever."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            gone = StrataError("the engine has stopped")
            if isinstance(cmd, _Submit) and cmd.accepted.set_running_or_notify_cancel():
                cmd.accepted.set_exception(gone)
            elif isinstance(cmd, _Call) and cmd.done.set_running_or_notify_cancel():
                cmd.done.set_exception(gone)
            elif not isinstance(cmd, (_Cancel, _Stop)) and self._handler is not None:
                self._guarded(lambda: self._handler(cmd))
