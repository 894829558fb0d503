"""The load a server benchmark puts on the server: streaming clients over HTTP, and requests straight into
the ASGI app.

    python benchmarks/server_load.py URL STREAMS REQUESTS TOKENS [--chat]   # the clients, as a process

The HTTP clients are raw HTTP/1.1 on asyncio streams, one kept-alive connection per stream, run as a
process of their own so they cost the measured process nothing; each request asks for ``TOKENS``
streamed tokens with EOS ignored and the usage in the last chunk, which is how its tokens are counted.
The in-memory requests (:func:`asgi_run`) go into the app without a server or sockets, so what they
cost is the app's own Python; :class:`OpCounter` counts that work in bytecodes, a figure that does not
depend on how busy the machine is.
"""
from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from pathlib import Path

async def _one_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, body: bytes,
                      path: str) -> tuple[int, int]:
    """One streamed request on a kept-alive connection: (events with output, completion tokens by the usage)."""
    writer.write(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode() + body)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    events, usage, tail = 0, 0, b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return events, usage
        tail += data[:-2]
        *whole, tail = tail.split(b"\n\n")
        for event in whole:
            if b'"usage": {' in event:
                usage = json.loads(event[6:])["usage"]["completion_tokens"]
            elif event != b"data: [DONE]":
                events += 1


def request_body(i: int, tokens: int, chat: bool) -> bytes:
    """Request ``i`` of a workload: ``tokens`` streamed tokens (EOS ignored, usage in the last chunk)."""
    fields = {"max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
              "temperature": 0}
    fields.update({"messages": [{"role": "user", "content": f"request {i}"}]} if chat else
                  {"prompt": [10 + (i * 7 + j) % 1000 for j in range(16)]})
    return json.dumps(fields).encode()


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


async def clients(url: str, streams: int, requests: int, tokens: int, chat: bool) -> dict:
    """``requests`` streamed requests, ``streams`` at a time, each worker on one kept-alive connection."""
    host, port = url.split("//")[1].split(":")
    todo = iter(range(requests))
    got: list[tuple[int, int]] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        for i in todo:
            got.append(await _one_stream(reader, writer, host, request_body(i, tokens, chat), _path(chat)))
        writer.close()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    return {"wall_s": time.perf_counter() - t0, "events": sum(e for e, _ in got), "tokens": sum(u for _, u in got),
            "all_complete": len(got) == requests and all(u == tokens for _, u in got)}


async def _asgi_one(app, body: bytes, path: str) -> list[bytes]:
    """One request straight into the ASGI app; the body chunks it sent (the connection never closes)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    never = asyncio.Event()
    chunks: list[bytes] = []

    async def receive() -> dict:
        if pending:
            return pending.pop()
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        chunks.append(message.get("body", b""))
    await app(scope, receive, send)
    return chunks


class OpCounter:
    """Counts the Python bytecodes run and the C functions called on this thread while entered: the same
    for the same work however busy the machine is (the interpreter runs some 50 times slower meanwhile)."""

    def __init__(self, by_function: bool = False) -> None:
        self.opcodes = 0
        self.c_calls = 0
        self.by_function: collections.Counter | None = collections.Counter() if by_function else None

    def _call(self, frame, event, arg):
        frame.f_trace_opcodes = True
        return self._line if self.by_function is None else self._line_by_function

    def _line(self, frame, event, arg):
        if event == "opcode":
            self.opcodes += 1
        return self._line

    def _line_by_function(self, frame, event, arg):
        if event == "opcode":
            self.opcodes += 1
            self.by_function[frame.f_code] += 1
        return self._line_by_function

    def top(self, n: int, per: int) -> str:
        """The ``n`` functions that ran the most bytecodes, per ``per`` units of work."""
        return "\n".join(f"{count / per:8.1f}  {code.co_qualname} ({Path(code.co_filename).name}:{code.co_firstlineno})"
                         for code, count in self.by_function.most_common(n))

    def _profile(self, frame, event, arg) -> None:
        if event == "c_call":
            self.c_calls += 1

    def __enter__(self) -> "OpCounter":
        sys.settrace(self._call)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(None)
        sys.setprofile(None)


async def asgi_run(app, streams: int, requests: int, tokens: int, chat: bool,
                    counter: OpCounter | None = None) -> tuple[float, list[list[bytes]]]:
    """``requests`` requests into the app, ``streams`` at a time: (this thread's CPU seconds, their chunks)."""
    todo = iter(range(requests))
    got: list[list[bytes]] = []

    async def worker() -> None:
        for i in todo:
            got.append(await _asgi_one(app, request_body(i, tokens, chat), _path(chat)))
    c0 = time.thread_time()
    if counter is None:
        await asyncio.gather(*(worker() for _ in range(streams)))
    else:
        with counter:
            await asyncio.gather(*(worker() for _ in range(streams)))
    return time.thread_time() - c0, got


def usage_tokens(chunks: list[bytes]) -> int:
    events = b"".join(chunks).split(b"\n\n")
    return next(json.loads(e[6:])["usage"]["completion_tokens"] for e in events if b'"usage": {' in e)


def main() -> None:
    url, streams, requests, tokens = sys.argv[1], *map(int, sys.argv[2:5])
    print(json.dumps(asyncio.run(clients(url, streams, requests, tokens, "--chat" in sys.argv[5:]))))


if __name__ == "__main__":
    main()
