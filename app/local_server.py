"""The workbench's local OpenAI-compatible server: HTTP on the engine the window already runs.

``LocalServer`` starts ``engine.server.BackgroundServer`` on the bridge's engine loop, so a tool pointed
at ``http://127.0.0.1:PORT/v1`` drives the same engine the chat uses and the panels show that traffic. A
model switch keeps the server running (it serves whatever engine the loop runs). Binding and stopping
run on a worker thread, never on the GUI thread; the answers come back as signals. The port is kept in
the window's QSettings (:class:`ServerPrefs`).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from PySide6.QtCore import QObject, QSettings, Signal, Slot

from app.bridge_api import EngineLoop, StrataError, build_server

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
MIN_PORT, MAX_PORT = 1024, 65535      # below 1024 binding needs root on Linux: never offered
PORT_MENU = "Server › Server port…"
SWITCH_MENU = "Server › Local server (OpenAI API)"


class ServerHandle(Protocol):
    """What the switch uses of ``engine.server.BackgroundServer``."""

    @property
    def url(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    def start(self) -> str: ...

    def stop(self) -> None: ...


ServerFactory = Callable[[EngineLoop, int], ServerHandle]


def open_server(loop: EngineLoop, port: int) -> ServerHandle:
    """The real server on 127.0.0.1:``port``, not started yet."""
    return build_server(loop, port)      # the HTTP libraries load the first time the switch is turned on


def api_url(base: str) -> str:
    """The OpenAI base URL a tool wants (``…/v1``) from the server's address."""
    return base.rstrip("/") + "/v1"


def refusal_line(port: int, why: str) -> str:
    """One banner line for a server that could not start on ``port``: the cause, and a fix in the window.

    The server's own advice names command-line flags; only its cause (before the ``;``) is kept.
    """
    cause = why.split(";")[0].strip().rstrip(".") or "the address could not be bound"
    where = "" if f"port {port}" in cause else f" on port {port}"
    return (f"The local server could not start{where}: {cause}; choose another port with "
            f"{PORT_MENU} and turn {SWITCH_MENU} on again.")


class ServerPrefs:
    """The server's port across restarts, in the window's QSettings (an unreadable value reads as 8000)."""

    KEY = "server/port"

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def port(self) -> int:
        raw = self.settings.value(self.KEY)
        try:
            port = int(str(raw))
        except (TypeError, ValueError):
            return DEFAULT_PORT
        return port if MIN_PORT <= port <= MAX_PORT else DEFAULT_PORT

    def set_port(self, port: int) -> None:
        self.settings.setValue(self.KEY, int(port))


class LocalServer(QObject):
    """One server at a time: ``start(port)`` and ``stop()`` return at once; ``close()`` waits (window close).

    States: "off", "starting", "on", "stopping". ``started`` carries the API URL (``http://…/v1``),
    ``failed`` one banner line (the server is off again), ``stopped`` comes once the port is free.
    """

    started = Signal(str)
    failed = Signal(str)
    stopped = Signal()
    _bound = Signal(object, str)      # worker -> GUI thread: the handle and its address
    _refused = Signal(str)
    _released = Signal()

    def __init__(self, loop: EngineLoop, factory: ServerFactory = open_server, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._loop, self._factory = loop, factory
        self.state = "off"
        self.url: str | None = None                # the API URL while on
        self._handle: ServerHandle | None = None
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()              # guards _handle between the worker and close()
        self._bound.connect(self._on_bound)
        self._refused.connect(self._on_refused)
        self._released.connect(self._on_released)

    @property
    def in_flight(self) -> int:
        """HTTP requests being answered now (0 while off)."""
        with self._lock:
            handle = self._handle
        return handle.in_flight if handle is not None and self.state == "on" else 0

    def start(self, port: int) -> None:
        if self.state != "off":
            return
        self.state = "starting"
        self._run(lambda: self._start_worker(port), "strata-server-start")

    def stop(self) -> None:
        if self.state != "on":
            return
        self.state = "stopping"
        self._run(self._stop_worker, "strata-server-stop")

    def close(self) -> None:
        """Stop now and wait until the port is free (the window is closing)."""
        if self._worker is not None:
            self._worker.join()
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._stop_handle(handle)
        self.state, self.url = "off", None

    # --- worker threads ---------------------------------------------------------------------------
    def _run(self, fn: Callable[[], None], name: str) -> None:
        if self._worker is not None:
            self._worker.join()               # the previous start or stop has answered already
        self._worker = threading.Thread(target=fn, name=name, daemon=True)
        self._worker.start()

    def _start_worker(self, port: int) -> None:
        try:
            handle = self._factory(self._loop, port)
            base = handle.start()
        except StrataError as exc:
            self._refused.emit(refusal_line(port, str(exc)))
            return
        except OSError as exc:
            self._refused.emit(refusal_line(port, exc.strerror or str(exc)))
            return
        except Exception as exc:
            log.exception("the local server failed to start")
            self._refused.emit(f"The local server could not start ({type(exc).__name__}: {exc}); "
                               "the log has the details.")
            return
        with self._lock:
            self._handle = handle
        self._bound.emit(handle, base)

    def _stop_worker(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._stop_handle(handle)
        self._released.emit()

    @staticmethod
    def _stop_handle(handle: ServerHandle) -> None:
        try:
            handle.stop()
        except Exception:
            log.exception("stopping the local server failed")

    # --- back on the GUI thread -------------------------------------------------------------------
    @Slot(object, str)
    def _on_bound(self, handle: ServerHandle, base: str) -> None:
        if self.state != "starting":          # closed meanwhile: close() stopped it already
            return
        self.state, self.url = "on", api_url(base)
        self.started.emit(self.url)

    @Slot(str)
    def _on_refused(self, line: str) -> None:
        if self.state != "starting":
            return
        self.state, self.url = "off", None
        self.failed.emit(line)

    @Slot()
    def _on_released(self) -> None:
        if self.state != "stopping":
            return
        self.state, self.url = "off", None
        self.stopped.emit()
