"""``BackgroundServer``: uvicorn on a thread of its own, serving the app of one engine loop.

The socket is bound before uvicorn starts (so a taken port is one line at once, and port 0 gets a
free one whose number the URL names). Stopping is graceful: no new connections, requests in flight
get ``grace_s`` to finish, then are cancelled (their streams end properly), then the port is free.
"""
from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
import time

import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from engine.errors import StrataError
from engine.loop import EngineLoop
from engine.server.app import create_app
from engine.server.asgi import KeepServerSend
from engine.server.head_timeout import with_head_timeout
from engine.server.invalid_http import with_json_refusal
from engine.server.settings import ServerSettings, check_bind

log = logging.getLogger("strata.server")

START_TIMEOUT_S = 30.0
GRACE_S = 5.0                  # what requests in flight get to finish when the server stops
LINGER_S = 1.0                 # then what cancelled streams get to end before uvicorn cancels what is left


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port``; a StrataError (one line) when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StrataError(f"port {port} on {host} is in use by another program; stop it or pick another "
                              "port with --port N") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise StrataError(f"not allowed to serve on port {port} (ports below 1024 need administrator rights); "
                              "pick another port with --port N") from None
        raise StrataError(f"cannot serve on {host}:{port} ({exc.strerror or exc}); give an address of this "
                          "machine with --host, e.g. 127.0.0.1") from None
    except (socket.gaierror, OverflowError, UnicodeError) as exc:
        sock.close()
        raise StrataError(f"cannot serve on {host!r}:{port} ({exc}); give an address of this machine with --host, "
                          "e.g. 127.0.0.1") from None
    return sock


def url_of(host: str, port: int) -> str:
    return f"http://[{host.strip('[]')}]:{port}" if ":" in host else f"http://{host}:{port}"


GIL_SWITCH_S = 0.001     # as the workbench's engine thread uses


class _QuietShutdown(logging.Filter):
    """uvicorn logs the connections it closes at the end of a stop's grace as an error; they are the
    stop working as meant (engine/server/asgi.ReadBody answers them 503), so the line is info."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.getMessage().startswith("Cancel ") \
                and "timeout graceful shutdown exceeded" in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "stopping: closed %s connection(s) still open after the grace", record.args[:1]
        return True


_QUIET = _QuietShutdown()


class BackgroundServer:
    """``start()`` -> base URL; ``stop()`` returns once the port is free. ``sock``: an already bound socket
    (see :func:`bind_socket`), e.g. bound before a long model load."""

    def __init__(self, loop: EngineLoop, settings: ServerSettings, sock: socket.socket | None = None) -> None:
        self.loop = loop
        self.settings = settings
        self.app = create_app(loop, settings)
        self._sock = sock
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    @property
    def in_flight(self) -> int:
        """HTTP requests being answered now."""
        return self.app.state.strata.counts.in_flight

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> str:
        if self.running:
            assert self.url is not None
            return self.url
        check_bind(self.settings.host, self.settings.api_key, self.settings.allow_no_key)
        sock, self._sock = self._sock or bind_socket(self.settings.host, self.settings.port), None
        # The engine thread and the server's thread share the interpreter; with the default 5 ms switch
        # interval a step that needs it back while the server thread runs Python can wait up to 5 ms.
        # benchmarks/server_overhead.py (h11, asyncio) saw the engine lose less with 1 ms than with 5 ms,
        # and no case where 1 ms lost more; with httptools and uvloop the two were alike.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        http = with_json_refusal(with_head_timeout(import_from_string(HTTP_PROTOCOLS["auto"])))   # h11 or httptools
        config = uvicorn.Config(KeepServerSend(self.app), log_config=None, access_log=False, lifespan="on",
                                http=http, ws="none", loop="auto", timeout_graceful_shutdown=GRACE_S + LINGER_S)
        server = self._server = uvicorn.Server(config)
        logging.getLogger("uvicorn.error").addFilter(_QUIET)        # once: filters are a set
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as exc:              # SystemExit from a failed startup included
                failed.append(exc)
            finally:
                sock.close()

        self._thread = threading.Thread(target=serve, name="strata-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not server.started:
            server.should_exit = True
            self._thread.join(5)
            raise StrataError(f"the HTTP server did not start ({failed[0] if failed else 'timed out'}); "
                              "see the log for the cause")
        self.url = url_of(self.settings.host, sock.getsockname()[1])
        return self.url

    def stop(self, grace_s: float = GRACE_S, cut_short: threading.Event | None = None) -> None:
        """Stop taking requests, let those in flight finish for ``grace_s`` (less once ``cut_short`` is
        set), cancel the rest, free the port."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        # uvicorn cancels connections still open this long after the stop began (a client halfway
        # through sending a body included), once the engine's own requests were cancelled and ended
        server.config.timeout_graceful_shutdown = grace_s + LINGER_S
        server.should_exit = True
        end = time.monotonic() + grace_s
        while thread.is_alive() and time.monotonic() < end and not (cut_short is not None and cut_short.is_set()):
            thread.join(min(0.1, max(0.0, end - time.monotonic())))
        if thread.is_alive():
            self._cancel_in_flight()
            thread.join(10)
        if thread.is_alive():
            server.force_exit = True
            thread.join(5)
        self._server = self._thread = None

    def _cancel_in_flight(self) -> None:
        client = self.app.state.strata.client
        aloop = client.aloop
        if aloop is not None and not aloop.is_closed():
            try:
                aloop.call_soon_threadsafe(client.cancel_all)
            except RuntimeError:                          # the loop closed meanwhile
                pass

