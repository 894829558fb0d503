"""A request whose HTTP framing is broken never reaches the app: uvicorn's parser refuses it. Its answer is a 400
with an OpenAI error object naming the parser's reason (engine/server/invalid_http.py), under either of uvicorn's
HTTP implementations, and the connection closes; the server answers a good request right after. Raw sockets:
no HTTP library sends such requests."""
from __future__ import annotations

import json
import socket

import httpx
import pytest
from uvicorn.config import HTTP_PROTOCOLS

from engine.server import BackgroundServer, ServerSettings
from http_helpers import KEY

AUTH = f"Authorization: Bearer {KEY}\r\n".encode()
BROKEN = {
    "request-line": b"GARBAGE\r\n\r\n",
    "content-length-not-a-number": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
                                   b"Content-Length: abc\r\n\r\n{}",
    "two-content-lengths": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
                           b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "header-without-colon": b"GET /health HTTP/1.1\r\nHost: x\r\nAccept application/json\r\n\r\n",
    # the head is good, so the app is already waiting for the body when its framing turns out broken
    "chunk-size-not-hex": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
                          b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
}


@pytest.fixture(params=["h11", "httptools"])
def served(request, loop, monkeypatch) -> str:
    """A server on the shared engine loop with one of uvicorn's HTTP implementations; its address."""
    monkeypatch.setitem(HTTP_PROTOCOLS, "auto", HTTP_PROTOCOLS[request.param])
    srv = BackgroundServer(loop, ServerSettings(port=0, api_key=KEY))
    srv.start()
    yield srv.url
    srv.stop()


def _exchange(url: str, raw: bytes, then: bytes = b"") -> bytes:
    """Send ``raw`` (and ``then`` once the first bytes of the answer are in); every byte until the server closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(raw)
        data = sock.recv(65536)
        if then:
            sock.sendall(then)
        while True:
            part = sock.recv(65536)
            if not part:
                return data
            data += part


@pytest.mark.parametrize("raw", BROKEN.values(), ids=BROKEN.keys())
def test_a_request_the_parser_refuses_gets_an_openai_error_object(served, raw):
    reply = _exchange(served, raw)
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert lines[0] == "HTTP/1.1 400 Bad Request"
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)            # nothing else follows: the server closed
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_http", None)
    assert error["message"].startswith("the request is not valid HTTP/1.1 (") and "\n" not in error["message"]
    assert error["message"].endswith("; send it with an HTTP library (the openai client, httpx, curl) or fix the "
                                     "request line, headers, Content-Length or chunk sizes the client writes")
    good = httpx.post(served + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert good.status_code == 200


def test_garbage_behind_a_streaming_response_never_lands_inside_it(served):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    reply = _exchange(served, request, then=b"GARBAGE\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200")
    stream, done, after = reply.partition(b"data: [DONE]")
    # the stream is cut where the garbage came, or ends whole with the refusal after it: never a status inside it
    assert b"HTTP/1.1 400" not in stream
    assert not after.strip() or b"HTTP/1.1 400 Bad Request" in after
