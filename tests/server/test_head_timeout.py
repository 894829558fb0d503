"""A connection that opens and sends its request head slowly, or half of it, is answered 408 and closed
once the head has had its time (engine/server/head_timeout.py); one that sends a whole request is served."""
from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import engine.server.head_timeout as head_timeout


def _connect(url: str) -> socket.socket:
    u = urlparse(url)
    return socket.create_connection((u.hostname, u.port), timeout=30)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        part = sock.recv(65536)
        if not part:
            return data
        data += part


def test_a_request_head_that_stops_arriving_is_answered_408_and_closed(url, http, monkeypatch):
    monkeypatch.setattr(head_timeout, "HEAD_IDLE_S", 0.5)
    with _connect(url) as half, _connect(url) as trickle:
        half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for part in (b"GET /he", b"alth HT"):          # a byte now and then does not keep it open either
            trickle.sendall(part)
            time.sleep(0.2)
        for sock in (half, trickle):
            reply = _read_all(sock)                     # the server closes the connection: recv ends
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408")
            error = json.loads(body)["error"]
            assert error["code"] == "request_timeout" and "send the whole request again" in error["message"]
    with _connect(url) as silent:                       # nothing sent at all: closed without a word
        assert _read_all(silent) == b""
    # a kept-alive connection idle between requests is uvicorn's keep-alive timeout's, not this one's
    with _connect(url) as kept:
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        kept.sendall(request)
        first = kept.recv(65536)
        time.sleep(0.7)                                 # longer than a head may take, shorter than keep-alive
        kept.sendall(request)
        second = kept.recv(65536)
        assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
    assert http.get("/health").status_code == 200
