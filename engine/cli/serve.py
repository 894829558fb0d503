"""``strata serve``: the OpenAI-compatible HTTP server on one engine.

The address is checked and bound before the model loads, so a refused bind or a taken port costs a
second, not a load. SIGINT or SIGTERM stops it gracefully: no new requests, those in flight get a
few seconds to finish (then end with finish reason "abort"; a second signal ends them at once), the
engine closes, exit code 0.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager

from engine.errors import ConfigError

ENV_KEY = "STRATA_API_KEY"


def add_serve_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    add_model_flag(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; another address needs a key)")
    g.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 = any free port)")
    g.add_argument("--api-key", default=None, help=f"key clients must send as 'Authorization: Bearer KEY' "
                                                   f"(default: ${ENV_KEY} if set)")
    g.add_argument("--no-api-key", action="store_true",
                   help="serve a non-loopback address without a key, on purpose")
    g.add_argument("--served-model-name", default=None,
                   help="the model name clients send and /v1/models lists (default: the model folder's name)")
    g.add_argument("--max-queued", type=int, default=256,
                   help="requests that may wait beyond the running batch; more get 503 with Retry-After")
    g.add_argument("--stats-every", type=int, default=100, help="engine steps between [Stats] log lines (0 = off)")
    add_engine_flags(p)


def server_settings(args: argparse.Namespace, environ=os.environ):
    from engine.server.settings import ServerSettings
    key = args.api_key if args.api_key is not None else (environ.get(ENV_KEY) or None)
    if args.no_api_key and key:
        raise ConfigError(f"--no-api-key and an API key (--api-key or {ENV_KEY}) contradict each other; give one")
    return ServerSettings(host=args.host, port=args.port, api_key=key, served_model_name=args.served_model_name,
                          max_queued=args.max_queued, stats_every=args.stats_every, allow_no_key=args.no_api_key)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.server.settings import check_bind
    settings = server_settings(args)
    check_bind(settings.host, settings.api_key, settings.allow_no_key)
    from engine.server.background import GRACE_S, BackgroundServer, bind_socket
    sock = bind_socket(settings.host, settings.port)
    try:
        _log_to_stderr()
        from engine.cli.run import open_engine
        engine = open_engine(args)
    except BaseException:
        sock.close()
        raise
    from engine.loop import EngineLoop
    from engine.server.engine_client import describe
    loop = EngineLoop(engine)
    loop.start_thread("strata-engine")
    server = BackgroundServer(loop, settings, sock=sock)
    try:
        with _stop_signals() as (stopped, now):
            url = server.start()
            print(f"Serving {describe(engine, settings.served_model_name).name} at {url}/v1 "
                  "(OpenAI-compatible; Ctrl-C stops)", flush=True)
            while not stopped.wait(0.5):
                pass
            busy = server.in_flight
            if busy:
                print(f"stopping: {busy} request{'s' if busy != 1 else ''} in flight get{'s' if busy == 1 else ''} "
                      f"up to {GRACE_S:g} s to finish (Ctrl-C again ends them now)", file=sys.stderr, flush=True)
            server.stop(cut_short=now)      # a second signal ends the requests in flight at once
    finally:
        server.stop(grace_s=0)
        loop.stop()
        loop.join(30)
        engine.close()
    return 0


def _log_to_stderr() -> None:
    """The server's [Stats], access and summary lines on stderr."""
    logger = logging.getLogger("strata.server")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


@contextmanager
def _stop_signals():
    """Two events: the first SIGINT or SIGTERM sets ``stopped``, the next ``now`` (the previous
    handlers come back afterwards)."""
    stopped, now = threading.Event(), threading.Event()

    def handle(signum: int, frame: object) -> None:
        (now if stopped.is_set() else stopped).set()

    previous: dict[int, Callable | int | None] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handle)
    try:
        yield stopped, now
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
