"""A request whose HTTP framing is broken never reaches the app: uvicorn's parser refuses it. Its answer is a 400
with an OpenAI error object naming the parser's reason in readable words and uvicorn's usual headers
(engine/server/invalid_http.py), under either of uvicorn's HTTP implementations, and the connection closes; the
server answers a good request right after. Requests sent ahead of the broken bytes on the same connection get their
own answers first. Raw sockets: no HTTP library sends such requests."""
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
    assert headers["server"] == "uvicorn" and headers["date"].endswith(" GMT")     # as every other answer has
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


def _responses(data: bytes) -> list[tuple[str, bytes]]:
    """The status lines and bodies of the responses ``data`` holds one after another (Content-Length or chunked)."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size, _, data = data.partition(b"\r\n")
                body, data = body + data[:int(size, 16)], data[int(size, 16) + 2:]
                if size == b"0":
                    break
        else:
            body, data = data[:int(headers["content-length"])], data[int(headers["content-length"]):]
        out.append((lines[0], body))
    return out


@pytest.mark.parametrize("ahead", [1, 3])
def test_requests_ahead_of_broken_bytes_in_one_write_get_their_answers_first(served, ahead):
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = _responses(_exchange(served, health * ahead + b"GARBAGE\r\n\r\n"))
    assert [status for status, _ in answers] == ["HTTP/1.1 200 OK"] * ahead + ["HTTP/1.1 400 Bad Request"]
    assert all(json.loads(body) == {"status": "ok"} for _, body in answers[:-1])
    assert json.loads(answers[-1][1])["error"]["code"] == "invalid_http"


@pytest.mark.parametrize("ahead", [1, 3])
def test_a_broken_body_of_a_queued_request_is_answered_after_the_requests_ahead(served, ahead):
    # httptools queues the chunked request behind the ones still answering and finds its body broken before its
    # app starts: the 400 must wait for their answers (h11 reads it only once they are sent)
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = _responses(_exchange(served, health * ahead + BROKEN["chunk-size-not-hex"]))
    assert [status for status, _ in answers] == ["HTTP/1.1 200 OK"] * ahead + ["HTTP/1.1 400 Bad Request"]
    assert all(json.loads(body) == {"status": "ok"} for _, body in answers[:-1])
    assert json.loads(answers[-1][1])["error"]["code"] == "invalid_http"


def test_a_broken_body_queued_behind_a_generation_leaves_its_answer_whole(served):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 50, "ignore_eos": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    answers = _responses(_exchange(served, request + BROKEN["chunk-size-not-hex"]))
    assert [status for status, _ in answers] == ["HTTP/1.1 200 OK", "HTTP/1.1 400 Bad Request"]
    assert json.loads(answers[0][1])["usage"]["completion_tokens"] == 50
    good = httpx.post(served + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert good.status_code == 200


def test_the_parsers_reason_is_words_not_a_python_repr(served, request):
    _, body = _responses(_exchange(served, b"G\xffT /\xfe\xfd HTTP/1.1\r\nHost: x\r\n\r\n"))[0]
    message = json.loads(body)["error"]["message"]
    assert message.isprintable() and "bytearray" not in message and "b'" not in message
    reason = {"h11": "illegal request line: G\\xffT /\\xfe\\xfd HTTP/1.1",     # h11 quotes the bytes it refused
              "httptools": "Invalid method encountered"}[request.node.callspec.params["served"]]
    assert message.startswith(f"the request is not valid HTTP/1.1 ({reason}); ")


def test_a_long_refused_line_is_cut_short_in_the_reason(served):
    _, body = _responses(_exchange(served, b"G" + b"\xff" * 3000 + b" / HTTP/1.1\r\nHost: x\r\n\r\n"))[0]
    assert len(json.loads(body)["error"]["message"]) < 400


def test_garbage_behind_a_streaming_response_never_lands_inside_it(served):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    answers = _responses(_exchange(served, request, then=b"GARBAGE\r\n\r\n"))
    # the stream ends whole, and the refusal follows it: never a status line inside it
    assert [status for status, _ in answers] == ["HTTP/1.1 200 OK", "HTTP/1.1 400 Bad Request"]
    assert answers[0][1].endswith(b"data: [DONE]\n\n") and b"HTTP/1.1" not in answers[0][1]
