"""``EventStream``: the response of a streamed generation, its server-sent events sent as they come.

A stream of 16 clients sends one chunk per client per engine step, and the server's thread shares the
interpreter with the engine's, so every call on that path is paid per token. Starlette's
``StreamingResponse`` adds a task group with a second disconnect listener, a str -> bytes copy, and
one pass through each middleware's ``send`` wrapper per chunk (four of them here, all watching only
for the response's start). This response sends the start through that chain, so every middleware
sees the status, and each body chunk straight to the server's own ``send``, which
:class:`engine.server.asgi.KeepServerSend` keeps in the scope (the chain's ``send`` where the app runs
without it). A client that goes away is noticed by the generation's own watch
(``engine.server.generation.watch_disconnect``), which ends its engine requests; what is sent after
that is dropped by the server.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.server.asgi import SERVER_SEND

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(Response):
    """``200 text/event-stream`` whose body is ``chunks``, each sent as one piece (str is sent as UTF-8)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes | str], headers: Mapping[str, str] | None = None) -> None:
        self.chunks = chunks
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        # The body goes out from a task of its own: each chunk then resumes only this short chain, not every
        # middleware's frame of the request's task. A cancelled request cancels it.
        await asyncio.get_running_loop().create_task(self._pump(scope.get(SERVER_SEND, send)))

    async def _pump(self, direct: Send) -> None:
        async for chunk in self.chunks:
            if chunk:
                await direct({"type": "http.response.body", "more_body": True,
                              "body": chunk.encode() if isinstance(chunk, str) else chunk})
        await direct({"type": "http.response.body", "body": b"", "more_body": False})
