"""A request head (the request line and headers) must arrive within ``HEAD_IDLE_S`` seconds.

uvicorn closes a connection left idle after a response, but none that opens and then sends its head
slowly or not at all: each byte that arrives cancels its idle timer, so a client that sends half a
request line holds the connection (and a file descriptor) for good, and thousands of them exhaust the
server. :func:`with_head_timeout` wraps uvicorn's HTTP protocol class (h11 or httptools, whichever it
picked) so that a connection whose head has not arrived ``HEAD_IDLE_S`` seconds after it opened, or
after the first byte of a kept-alive connection's next request, is answered 408 and closed (one that
sent nothing is only closed). Idle between requests stays uvicorn's keep-alive timeout; a body that
stalls is the ASGI layer's to refuse (engine/server/asgi.py: ``ReadBody``).
"""
from __future__ import annotations

import asyncio

from engine.server.errors import error_body

HEAD_IDLE_S = 30.0


def with_head_timeout(base: type) -> type:
    """A subclass of uvicorn's HTTP protocol class ``base`` that closes connections whose request head
    does not arrive in time (``HEAD_IDLE_S``, read when each wait starts)."""

    class HeadTimeout(base):
        _head_timer: asyncio.TimerHandle | None = None
        _head_started = False               # bytes of a request head have come since the last response

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._wait_for_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._serving():
                self._stop_waiting()
            else:
                self._head_started = True
                if self._head_timer is None:     # a kept-alive connection's next head: its clock starts now
                    self._wait_for_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._stop_waiting()                 # idle until the next request: uvicorn's keep-alive timeout
            self._head_started = False

        def connection_lost(self, exc) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def _serving(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _wait_for_head(self) -> None:
            self._stop_waiting()
            self._head_timer = self.loop.call_later(HEAD_IDLE_S, self._head_late)

        def _stop_waiting(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self._serving() or self.transport.is_closing():
                return
            if self._head_started:               # part of a request came: say why it ends (else just close)
                body = error_body(408, f"the request's head did not arrive within {HEAD_IDLE_S:.0f} s; send the "
                                       "whole request again", code="request_timeout")
                head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
                self.transport.write(head + body)
            self.transport.close()

    HeadTimeout.__name__ = HeadTimeout.__qualname__ = f"HeadTimeout{base.__name__}"
    return HeadTimeout
