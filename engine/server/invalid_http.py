"""Requests uvicorn refuses before the app sees them, answered as every other refusal is: a 400 with an OpenAI
error object naming the parser's reason, not uvicorn's plain-text "Invalid HTTP request received.".

These are requests whose HTTP framing is broken: a request line that is not one, a header without a colon, a
Content-Length that is not a number (or two that differ, or one beside Transfer-Encoding), a chunked body whose
chunk sizes are not hexadecimal. uvicorn has no setting for that answer (``--h11-max-incomplete-event-size``
only bounds how much of an unfinished head h11 buffers, and an oversized head gets the same plain answer). Both
of its HTTP protocol classes send it from one method, ``send_400_response(msg)`` (h11's and httptools' alike,
since uvicorn 0.17.5), called while the parser's exception is being handled, so its reason is at hand; and
``uvicorn.Config`` takes a protocol class, as engine/server/head_timeout.py uses too. :func:`with_json_refusal`
overrides that one method. tests/server/test_invalid_http.py sends such requests on raw sockets, so a uvicorn that
stops calling it fails there rather than going back to plain text unnoticed.
"""
from __future__ import annotations

import sys

from engine.server.errors import error_body, printable


def invalid_http_body(cause: str | None) -> bytes:
    """The error object of a request whose HTTP framing is broken; ``cause`` is the parser's words."""
    why = f" ({printable(cause)})" if cause else ""
    return error_body(400, f"the request is not valid HTTP/1.1{why}; send it with an HTTP library (the openai "
                           "client, httpx, curl) or fix the request line, headers, Content-Length or chunk sizes "
                           "the client writes", code="invalid_http")


def with_json_refusal(base: type) -> type:
    """A subclass of uvicorn's HTTP protocol class ``base`` whose answer to a request its parser refuses is a
    JSON error object; the connection closes after it, as uvicorn's own answer closes it. Garbage pipelined
    behind a request whose response is still being sent (httptools parses it at once) only closes the
    connection: a status line in the middle of that response would corrupt it."""

    class JsonRefusal(base):
        def send_400_response(self, msg: str) -> None:
            cycle = getattr(self, "cycle", None)
            if cycle is not None and cycle.response_started and not cycle.response_complete:
                self.transport.close()           # a response is under way: no second status line fits in it
                return
            error = sys.exc_info()[1]            # the parser's error, which uvicorn is handling when it calls this
            body = invalid_http_body(str(error) if error is not None else None)
            head = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
            self.transport.write(head + body)
            self.transport.close()

    JsonRefusal.__name__ = JsonRefusal.__qualname__ = f"JsonRefusal{base.__name__}"
    return JsonRefusal
