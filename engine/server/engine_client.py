"""The server's side of the engine loop: model facts, job submission, and deltas on the asyncio loop.

Handlers never touch the engine: they read a :class:`ModelInfo` taken on the loop thread (refreshed
when the loop's engine is another object, e.g. after the workbench switched models), run prompt work
(tokenizer, chat template) themselves, and submit jobs through the loop. Each job's sink runs on the
loop thread and only appends to a deque; one ``call_soon_threadsafe`` per burst hands the burst to the
asyncio loop, so a step that advances 16 streams wakes the server once, not 16 times.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import StrataError
from engine.guided import GuideError
from engine.loop import EngineLoop, Job
from engine.outputs import RequestDelta
from engine.sampling import SamplingParams
from engine.server.errors import APIError
from engine.server.settings import ServerSettings
from engine.tokenizer import Tokenizer

RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ModelInfo:
    """What request handlers may know of the loaded model, read once on the loop thread."""

    name: str                        # the served name
    path: str                        # the model folder, also accepted as ``model``
    tokenizer: Tokenizer | None
    context_tokens: int
    vocab_size: int
    max_batch: int
    created: int                     # when the server first saw this engine (Unix seconds)
    architecture: str = ""           # config.json's architecture, e.g. "GptOssForCausalLM"

    def token_text(self, token_id: int) -> str:
        """One token as text (special tokens included), cached: ``bytes:\\xNN...`` (OpenAI's spelling) for
        a token whose bytes are part of a character, so that no two tokens read the same."""
        return _token_piece(self.tokenizer, token_id)[0]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes the token stands for (logprobs' ``bytes``), cached."""
        return _token_piece(self.tokenizer, token_id)[1]

    def text_bytes(self, token_id: int) -> bytes:
        """The bytes a generated token adds to the reply's text: none for a special token, which the text
        leaves out (the engine decodes replies skipping them), else :meth:`token_bytes`."""
        _, raw, special = _token_piece(self.tokenizer, token_id)
        return b"" if special else raw


_TOKEN_PIECES: "weakref.WeakKeyDictionary[Tokenizer, dict[int, tuple[str, bytes, bool]]]" = weakref.WeakKeyDictionary()


def _token_piece(tok: Tokenizer | None, token_id: int) -> tuple[str, bytes, bool]:
    """(text, bytes, whether decoding leaves it out as a special token) of one token."""
    if tok is None:
        return f"<{token_id}>", f"<{token_id}>".encode(), False
    cache = _TOKEN_PIECES.setdefault(tok, {})
    piece = cache.get(token_id)
    if piece is None:
        raw = tok.token_bytes(token_id)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        special = bool(raw) and not tok.decode([token_id], skip_special_tokens=True)
        piece = cache[token_id] = (text, raw, special)
    return piece


def describe(engine: Any, served_name: str | None) -> ModelInfo:
    """Loop thread: the facts of ``engine`` a handler needs."""
    path = str(engine.config.model)
    return ModelInfo(served_name or Path(path.rstrip("/\\")).name or path, path, engine.tokenizer,
                     int(engine.context_tokens), int(engine.loaded.spec.vocab_size), int(engine.config.max_batch),
                     int(time.time()), str(engine.loaded.spec.architecture))


class Stream:
    """The engine requests of one HTTP request, and their deltas as they reach the asyncio loop."""

    def __init__(self, client: "EngineClient", ids: list[str], engine_ref: Callable[[], Any]) -> None:
        self.client = client
        self.ids = ids
        self.engine_ref = engine_ref                   # weak reference to the engine that took the requests
        self.open = set(ids)
        self.gone = False                              # the client went away: nothing more is read
        self._arrived: list[RequestDelta] = []
        self._waiter: asyncio.Future | None = None

    def put(self, delta: RequestDelta) -> None:
        if delta.finished:
            self.open.discard(delta.request_id)
            self.client.active.pop(delta.request_id, None)
        self._arrived.append(delta)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def batch(self) -> list[RequestDelta]:
        """The deltas that arrived since the last call (waits for at least one, unless the client went away)."""
        while not self._arrived and not self.gone:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        out, self._arrived = self._arrived, []
        return out

    @property
    def done(self) -> bool:
        return self.gone or (not self.open and not self._arrived)

    async def engine_gone(self) -> bool:
        """The loop no longer runs the engine these requests went to (unloaded or replaced). Asked on the
        loop thread, after whatever command ended the requests has finished there."""
        engine = self.engine_ref()
        return engine is None or not await self.client.call(lambda e: e is engine)

    def cancel(self) -> None:
        """End every unfinished request (the client went away, or the server is stopping)."""
        for rid in list(self.open):
            self.client.loop.cancel(rid)

    def hang_up(self) -> None:
        """The client went away: end its requests, and stop waiting for their output now (whoever reads
        this stream gets what arrived so far, then ``done``)."""
        self.cancel()
        self.gone = True
        self._wake()


class EngineClient:
    """One server's link to an :class:`EngineLoop`; every method runs on the server's asyncio loop."""

    def __init__(self, loop: EngineLoop, settings: ServerSettings) -> None:
        self.loop = loop
        self.settings = settings
        self.active: dict[str, Stream] = {}            # unfinished engine requests of this server
        self._info: ModelInfo | None = None
        self._info_of: Callable[[], Any] = lambda: None   # weak reference to the engine it describes
        self._pending: deque[tuple[Stream, RequestDelta]] = deque()
        self._scheduled = False
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._prefix = f"http-{os.getpid():x}-{uuid.uuid4().hex[:6]}"
        self._ids = itertools.count()

    def bind(self, aloop: asyncio.AbstractEventLoop) -> None:
        self._aloop = aloop

    @property
    def aloop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop the server runs on (None before it started)."""
        return self._aloop

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(engine)`` on the loop thread; raises what it raised."""
        return await asyncio.wrap_future(self.loop.call(fn))

    def loaded(self) -> bool:
        return self.loop.engine is not None

    async def info(self) -> ModelInfo:
        """The loaded model's facts; APIError 503 when no model is loaded."""
        engine = self.loop.engine                      # identity only; never used from this thread
        if engine is None:
            raise APIError(503, "no model is loaded; load one in the workbench (or start the server with "
                                "--model DIR) and retry", code="model_not_loaded", headers=_retry())
        if self._info is None or self._info_of() is not engine:
            await self.refresh()
        assert self._info is not None
        return self._info

    async def refresh(self) -> None:
        """Read the model facts again (after a model switch or a change of max_batch)."""
        served = self.settings.served_model_name
        got = await self.call(lambda e: None if e is None else (weakref.ref(e), describe(e, served)))
        if got is None:
            raise APIError(503, "no model is loaded; load one and retry", code="model_not_loaded", headers=_retry())
        ref, info = got
        created = self._info.created if self._info is not None and self._info.path == info.path else info.created
        self._info_of, self._info = ref, dataclasses.replace(info, created=created)

    def admit(self, count: int, info: ModelInfo) -> None:
        """Refuse (503) a request whose ``count`` engine requests would make more than max_queued wait."""
        capacity = info.max_batch + self.settings.max_queued
        if count > capacity:
            raise APIError(400, f"this request asks for {count} completions (prompts x n) but this server takes "
                                f"at most {capacity} at once; send fewer prompts or a smaller n", param="n")
        waiting = len(self.active) + count - info.max_batch
        if waiting > self.settings.max_queued:
            n = len(self.active)
            are = "requests are" if n != 1 else "request is"
            raise APIError(503, f"the server is busy: {n} {are} running or waiting and at most "
                                f"{self.settings.max_queued} may wait; retry in a moment",
                           code="server_busy", headers=_retry())

    async def start(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> Stream:
        """Submit one job per (prompt, params) pair; all are taken or none (APIError 400 with the engine's
        reason)."""
        ids = [f"{self._prefix}-{next(self._ids)}" for _ in prompts]
        stream = Stream(self, ids, self._info_of)
        for rid in ids:
            self.active[rid] = stream
        sink = self._sink_for(stream)
        futures = [asyncio.wrap_future(self.loop.submit(Job(rid, list(p), sp, sink)))
                   for rid, p, sp in zip(ids, prompts, params)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        refused = next((r for r in results if isinstance(r, BaseException)), None)
        if refused is not None:
            for rid, r in zip(ids, results):
                self.active.pop(rid, None)
                stream.open.discard(rid)
                if not isinstance(r, BaseException):
                    self.loop.cancel(rid)
            if isinstance(refused, StrataError):      # a guide's refusal names the field it came from
                param = refused.source if isinstance(refused, GuideError) else None
                raise APIError(400, str(refused), param=param, code="invalid_request") from None
            raise refused
        return stream

    def cancel_all(self) -> None:
        for rid in list(self.active):
            self.loop.cancel(rid)

    # ---- deltas: loop thread -> asyncio loop ----------------------------------------------------
    def _sink_for(self, stream: Stream) -> Callable[[RequestDelta], None]:
        pending, aloop = self._pending, self._aloop
        assert aloop is not None, "EngineClient.bind was not called"

        def sink(delta: RequestDelta) -> None:          # loop thread: never blocks
            pending.append((stream, delta))
            if not self._scheduled:
                self._scheduled = True
                aloop.call_soon_threadsafe(self._drain)
        return sink

    def _drain(self) -> None:
        # The flag goes down before the deque is emptied: a delta appended meanwhile either is taken
        # here or schedules another drain, so none is left behind.
        self._scheduled = False
        pending = self._pending
        while pending:
            stream, delta = pending.popleft()
            stream.put(delta)


def _retry() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}
