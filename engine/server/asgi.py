"""Pure ASGI middleware: the access line and request metrics, the API key, and the body-size limit.

Pure ASGI (not Starlette's BaseHTTPMiddleware) so streamed responses pass through untouched and a
client that disconnects is still seen by the endpoint. Order, outermost first: :class:`AccessLog`
(which also turns a bug anywhere below into a logged 500), :class:`RequireKey`, :class:`ReadBody`.
:class:`KeepServerSend` goes around the whole app, outside the framework's own middleware.
"""
from __future__ import annotations

import asyncio

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engine.server.errors import APIError, printable
from engine.server.metrics import ServerMetrics, endpoint_label

log = logging.getLogger("strata.server")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RECORD = "strata.access"            # scope key of the request's AccessRecord
SERVER_SEND = "strata.server_send"  # scope key of the server's own send (see KeepServerSend)
CLIENT_CLOSED = 499                 # the status logged for a client that left before its answer was complete
BODY_IDLE_S = 30.0                  # a request body that sends nothing for this long is refused (408)
# (nginx's "client closed request"): a stream that had started as 200 is counted as this, not as a success
DRAIN_FACTOR = 4                    # an oversized body is read (and dropped) up to this many limits, so the
# client gets to read the 413 instead of a reset connection; past that the connection is simply closed


@dataclass
class AccessRecord:
    """What a generation endpoint tells the access line about its request."""

    start: float
    prompt_tokens: int | None = None          # None: not a generation request
    completion_tokens: int = 0
    ttft_s: float | None = None
    last_token_at: float | None = None
    finish: str = "-"
    client_gone: bool = False                 # the client disconnected before its answer was complete


@dataclass
class Counts:
    """HTTP requests being answered now (the workbench shows it)."""

    in_flight: int = 0


async def send_error(send: Send, err: APIError, close: bool = False) -> None:
    body = err.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class KeepServerSend:
    """Around the whole app: keeps the server's own ``send`` in the scope, so an event stream can send its
    body chunks without passing each through every middleware's wrapper (engine/server/sse.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SERVER_SEND] = send
        await self.app(scope, receive, send)


class AccessLog:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics, counts: Counts) -> None:
        self.app, self.metrics, self.counts = app, metrics, counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = scope[RECORD] = AccessRecord(time.perf_counter())
        status = 0

        async def tracked(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.counts.in_flight += 1
        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("unexpected error answering %s %s", scope["method"], printable(scope["path"]))
            if status == 0:
                status = 500
                await send_error(send, APIError(500, "the server failed on this request (a bug; its log has "
                                                     "the details)", code="internal_error"), close=True)
        finally:
            self.counts.in_flight -= 1
            self._record(scope, record, status)

    def _record(self, scope: Scope, record: AccessRecord, status: int) -> None:
        end = time.perf_counter()
        if record.client_gone or not status:
            status = CLIENT_CLOSED
        self.metrics.requests.labels(endpoint_label(scope["path"]), str(status)).inc()
        line = f"{scope['method']} {printable(scope['path'])} {status}"
        if record.prompt_tokens is None:
            log.info("%s %.1fms", line, (end - record.start) * 1e3)
            return
        self.metrics.e2e.observe(end - record.start)
        ttft = "-" if record.ttft_s is None else f"{record.ttft_s * 1e3:.1f}ms"
        span = (record.last_token_at or end) - (record.start + (record.ttft_s or 0.0))
        rate = (record.completion_tokens - 1) / span if record.completion_tokens > 1 and span > 0 else 0.0
        log.info("%s in=%d out=%d ttft=%s %.1f tok/s finish=%s", line, record.prompt_tokens,
                 record.completion_tokens, ttft, rate, record.finish)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is over {limit} bytes, the most this server takes; send a smaller "
                         "request", code="request_too_large")


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


class RequireKey:
    """Every route but /health needs the key, as ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""

    OPEN = frozenset({"/health"})

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app, self.key = app, key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        auth = _header(scope, b"authorization")
        given = auth[7:].strip() if auth is not None and auth[:7].lower() == "bearer " else _header(scope, b"x-api-key")
        if given is None and auth is not None:
            await send_error(send, APIError(401, "the Authorization header is not \"Bearer KEY\"; send "
                                                 "Authorization: Bearer KEY (or x-api-key: KEY)",
                                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}))
        elif given is None:
            await send_error(send, APIError(401, "this server needs an API key; send the header "
                                                 "Authorization: Bearer KEY", code="missing_api_key",
                                            headers={"WWW-Authenticate": "Bearer"}))
        elif not hmac.compare_digest(given.encode(), self.key):
            await send_error(send, APIError(401, "the API key is wrong; send the key the server was started with "
                                                 "(Authorization: Bearer KEY)", code="invalid_api_key",
                                            headers={"WWW-Authenticate": "Bearer"}))
        else:
            await self.app(scope, receive, send)


class ReadBody:
    """Reads the whole body before the app sees it, refusing one over ``limit`` bytes with a 413 (by its
    Content-Length, or by counting what arrives when it has none), and one whose next part does not come
    within ``idle_s`` seconds with a 408 (a client that stalls mid-body would hold its connection open
    for good); the app then reads it from memory and later ``receive`` calls reach the connection, so a
    disconnect is still seen."""

    def __init__(self, app: ASGIApp, limit: int, idle_s: float = BODY_IDLE_S) -> None:
        self.app, self.limit, self.idle_s = app, limit, idle_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and not declared.strip().isdigit():
            await send_error(send, APIError(400, f"Content-Length {declared!r} is not a number of bytes"), close=True)
            return
        if declared is not None and int(declared) > self.limit:   # known from the head: no need to wait for it
            await send_error(send, _too_large(self.limit), close=True)
            return
        chunks: list[bytes] = []
        total, over = 0, False
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.idle_s)
            except asyncio.TimeoutError:
                await send_error(send, APIError(408, f"the request body stopped arriving ({self.idle_s:.0f} s without "
                                                     "a byte); send the whole request again", code="request_timeout"),
                                 close=True)
                return
            except asyncio.CancelledError:               # the server stops while the body is still coming
                await send_error(send, APIError(503, "the server stopped before the request's body had arrived; "
                                                     "send the request again once it is back", code="server_stopping"),
                                 close=True)
                return
            if message["type"] == "http.disconnect":
                return                                   # the client is gone: nothing to answer
            body = message.get("body", b"")
            total += len(body)
            over = over or total > self.limit
            if not over:
                chunks.append(body)
            if not message.get("more_body", False) or total > self.limit * DRAIN_FACTOR:
                break
        if over:
            await send_error(send, _too_large(self.limit), close=True)
            return
        data = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": data, "more_body": False}

        await self.app(scope, replay, send)
