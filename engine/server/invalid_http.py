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

import re
import sys
from collections.abc import Sequence

from engine.server.errors import error_body, printable

_BYTES = r"(?<!\w)b'(?:[^'\\]|\\.)*'" + r'|(?<!\w)b"(?:[^"\\]|\\.)*"'       # a bytes object's repr
_RAW = re.compile(rf"bytearray\(({_BYTES})\)|({_BYTES})")                    # as h11 words the bytes it refused


def parser_words(error: BaseException) -> str:
    """The parser's reason as one short readable line: bytes h11 quotes as ``bytearray(b'...')`` shown as the
    escaped text between the quotes (``illegal request line: G\\xffT / HTTP/1.1``)."""
    return printable(_RAW.sub(lambda match: (match[1] or match[2])[2:-1], str(error)))


def invalid_http_body(cause: str | None) -> bytes:
    """The error object of a request whose HTTP framing is broken; ``cause`` is the parser's words."""
    why = f" ({printable(cause)})" if cause else ""
    return error_body(400, f"the request is not valid HTTP/1.1{why}; send it with an HTTP library (the openai "
                           "client, httpx, curl) or fix the request line, headers, Content-Length or chunk sizes "
                           "the client writes", code="invalid_http")


def with_json_refusal(base: type) -> type:
    """A subclass of uvicorn's HTTP protocol class ``base`` whose answer to a request its parser refuses is a
    JSON error object with uvicorn's default headers (date, server); the connection closes after it, as uvicorn's
    own answer closes it. Bytes refused behind a whole request whose response is not yet sent (httptools parses
    pipelined bytes at once; h11 only once that response is done) are answered after that response, so each
    request's answer stays in its place; so is a broken body of a request httptools queued behind them (its app
    not yet started), which is taken off the queue so that app never starts to wait for a body that will not
    come. Broken bytes inside a request whose response has already begun (its app answered before reading the
    whole body) only close the connection: a status line in the middle of that response would corrupt it."""

    class JsonRefusal(base):
        _refusal: bytes | None = None       # a 400 held back until the responses before it are sent
        _unqueued = False                   # its request was taken off the pipeline: it gets no response of its own
        # httptools' requests parsed behind one still answering, newest first (uvicorn appends left, pops right);
        # h11 parses no request before the last one is answered, so nothing ever waits there
        pipeline: Sequence = ()

        def send_400_response(self, msg: str) -> None:
            if self._refusal is not None:        # bytes behind a refusal already held back: it stays as it is
                self.flow.pause_reading()
                return
            error = sys.exc_info()[1]            # the parser's error, which uvicorn is handling when it calls this
            body = invalid_http_body(parser_words(error) if error is not None else None)
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head += [b"content-type: application/json\r\nconnection: close\r\n",
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"]
            self._refusal = b"".join(head) + body
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self._send_refusal()
            elif not cycle.more_body:            # the bytes after a whole request: answered after its response
                self.flow.pause_reading()
            elif self.pipeline and self.pipeline[0][0] is cycle:   # queued, its app not started: it never will be
                self.pipeline.popleft()
                self._unqueued = True
                self.flow.pause_reading()
            elif cycle.response_started:
                self.transport.close()           # a response is under way: no second status line fits in it
            else:
                self._send_refusal()             # the request itself is broken; its app sees the disconnect

        def on_response_complete(self) -> None:
            queued_ahead = bool(self.pipeline)   # requests still to answer before the refusal's place
            super().on_response_complete()       # starts the next one queued, if any
            if self._refusal is None:
                return
            last = not queued_ahead if self._unqueued else self.cycle.response_complete   # the last before it
            if last:
                self._send_refusal()
            else:
                self.flow.pause_reading()        # uvicorn resumed reading for the next request: none may follow

        def _send_refusal(self) -> None:
            if not self.transport.is_closing():
                self.transport.write(self._refusal)
            self.transport.close()

    JsonRefusal.__name__ = JsonRefusal.__qualname__ = f"JsonRefusal{base.__name__}"
    return JsonRefusal
