"""The load test through HTTP: every stream a streaming ``POST /v1/completions`` to the local server.

The streams run together on one worker thread (an asyncio loop with one httpx client), never on the
GUI thread; each one's result comes back as a :class:`app.messages.ReplyStats`, measured on the client's
clock (the time to the first chunk with text, the decode speed between the first and last), so the
dialog shows the same table and summary as for requests sent to the engine directly. Stop closes the
connections, which ends the requests on the server.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import httpx
from PySide6.QtCore import QObject, Signal

from app.messages import ReplyStats

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0          # the longest silence a stream may have (a long prompt's prefill)

PromptIds = Callable[[int], list[int]]     # n -> n token ids (blocks; called on the worker thread)


@dataclass(frozen=True)
class HttpLoad:
    """One load test through HTTP: ``request_ids`` streams of ``max_tokens`` each, EOS ignored."""

    url: str                         # the API URL, http://127.0.0.1:PORT/v1
    request_ids: tuple[str, ...]
    prompt_tokens: int
    max_tokens: int
    temperature: float = 0.8


@dataclass
class _Stream:
    """What one stream saw, on the client's clock."""

    request_id: str
    started: float
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int | None = None     # from the usage chunk
    finish_reason: str | None = None
    error: str | None = None

    def stats(self, finished: float) -> ReplyStats:
        tokens = self.completion_tokens if self.completion_tokens is not None else self.chunks
        ttft = None if self.first is None else (self.first - self.started) * 1000.0
        decode = None
        if self.first is not None and self.last is not None and tokens > 1 and self.last > self.first:
            decode = (tokens - 1) / (self.last - self.first)
        prompt_s = self.prompt_tokens / (ttft / 1000.0) if ttft and self.prompt_tokens else None
        reason = "error" if self.error else (self.finish_reason or "stop")
        return ReplyStats(self.request_id, "loadtest", reason, prompt_tokens=self.prompt_tokens,
                          completion_tokens=tokens, ttft_ms=ttft, prompt_tok_s=prompt_s, decode_tok_s=decode,
                          started=self.started, finished=finished, error=self.error)


class HttpLoadRun(QObject):
    """Runs one :class:`HttpLoad` on a worker thread; ``stream_finished`` carries each stream's ReplyStats."""

    stream_finished = Signal(object)

    def __init__(self, load: HttpLoad, prompt_ids: PromptIds, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.load, self._prompt_ids = load, prompt_ids
        self._thread: threading.Thread | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="strata-http-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End every stream still running (each reports finish reason "abort")."""
        self._stopping.set()
        aloop = self._aloop
        if aloop is not None and not aloop.is_closed():
            try:
                aloop.call_soon_threadsafe(self._cancel_all)
            except RuntimeError:           # the loop closed meanwhile: every stream has ended
                pass

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # --- worker thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            prompt = self._prompt_ids(self.load.prompt_tokens)
        except Exception as exc:
            self._fail_all(f"no prompt could be made ({exc})")
            return
        try:
            asyncio.run(self._run(prompt))
        except Exception as exc:            # a bug here must still end every row of the table
            log.exception("the HTTP load test failed")
            self._fail_all(f"the load test failed ({type(exc).__name__}: {exc})")

    def _fail_all(self, why: str) -> None:
        now = time.perf_counter()
        for rid in self.load.request_ids:
            self.stream_finished.emit(_Stream(rid, now, error=why).stats(now))

    async def _run(self, prompt: list[int]) -> None:
        self._aloop = asyncio.get_running_loop()
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        # trust_env off: the local server is on this machine; a proxy from the environment must not sit between
        async with httpx.AsyncClient(timeout=timeout, trust_env=False,
                                     limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)) as client:
            model = await self._model(client)
            if model is None:
                return
            self._tasks = [asyncio.create_task(self._one(client, rid, model, prompt)) for rid in self.load.request_ids]
            if self._stopping.is_set():
                self._cancel_all()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _model(self, client: httpx.AsyncClient) -> str | None:
        """The served model's name (the ``model`` field of every request)."""
        url = f"{self.load.url}/models"
        try:
            resp = await client.get(url)
            resp.raise_for_status()
            return str(resp.json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            self._fail_all(f"{url} did not list the model ({_why(exc)}); is the local server on?")
            return None

    async def _one(self, client: httpx.AsyncClient, rid: str, model: str, prompt: list[int]) -> None:
        s = _Stream(rid, time.perf_counter(), prompt_tokens=len(prompt))
        body = {"model": model, "prompt": prompt, "max_tokens": self.load.max_tokens,
                "temperature": self.load.temperature, "top_p": 1.0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        try:
            async with client.stream("POST", f"{self.load.url}/completions", json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    s.error = f"the server answered {resp.status_code}: {_message(resp)}"
                else:
                    async for line in resp.aiter_lines():
                        if not _read_event(s, line, time.perf_counter()):
                            break
                    if s.error is None and s.finish_reason is None:
                        s.error = "the stream ended before its last chunk"
                    elif s.finish_reason == "abort" and not self._stopping.is_set():
                        # the server ended it (it was turned off, or its client went): not the user's stop
                        s.finish_reason, s.error = "error", "the server ended the stream (was the local server stopped?)"
        except asyncio.CancelledError:
            s.finish_reason, s.error = "abort", None
        except httpx.HTTPError as exc:
            s.error = f"{self.load.url}: {_why(exc)}"
        self.stream_finished.emit(s.stats(time.perf_counter()))


def _read_event(s: _Stream, line: str, now: float) -> bool:
    """Take one line of the event stream into ``s``; False once the stream is over."""
    if not line.startswith("data:"):
        return True
    payload = line[5:].strip()
    if payload == "[DONE]":
        return False
    try:
        event = json.loads(payload)
    except ValueError:
        return True
    if not isinstance(event, dict):
        return True
    if event.get("error"):
        err = event["error"]
        s.error = str(err.get("message") if isinstance(err, dict) else err)
        return False
    for choice in event.get("choices") or ():
        if choice.get("text"):
            s.first = now if s.first is None else s.first
            s.last = now
            s.chunks += 1
        s.finish_reason = choice.get("finish_reason") or s.finish_reason
    usage = event.get("usage")
    if isinstance(usage, dict):
        s.completion_tokens = int(usage.get("completion_tokens") or 0)
        s.prompt_tokens = int(usage.get("prompt_tokens") or s.prompt_tokens)
    return True


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error")
        return str(err.get("message") if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return " ".join(resp.text.split())[:200] or "no message"


def _why(exc: Exception) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    return str(exc) or type(exc).__name__
