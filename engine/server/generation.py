"""One HTTP request's choices as their deltas arrive, with the latencies the metrics and the access
line report, and the watch that cancels them when the client goes away."""
from __future__ import annotations

import asyncio
import json
import json.encoder
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from engine.guided import GUIDE_FAILED
from engine.outputs import RequestDelta, TokenLogprob
from engine.server.asgi import AccessRecord
from engine.server.engine_client import Stream
from engine.server.errors import APIError, error_object
from engine.server.metrics import ServerMetrics

DONE = "data: [DONE]\n\n"
quote = json.encoder.encode_basestring     # a str as a JSON string (what json.dumps does, without its overhead)


def quote_or_null(text: str | None) -> str:
    return "null" if text is None else quote(text)


def chunk_tail(include_usage: bool) -> str:
    """The end of a stream's chunk after its choices: with ``stream_options.include_usage`` every chunk but the
    last (which holds the usage) says ``"usage": null``, as OpenAI documents."""
    return '], "usage": null}\n\n' if include_usage else "]}\n\n"


@dataclass
class Choice:
    """What one engine request has produced so far."""

    index: int
    prompt_index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string: bool = False            # one of the request's stop strings ended it (not the model)
    error: str | None = None
    last_at: float | None = None

    @property
    def joined(self) -> str:
        return "".join(self.text)


class Generation:
    """The choices of one request (prompt i's choice j is index i * n + j) fed from its :class:`Stream`."""

    def __init__(self, stream: Stream, n: int, prompt_tokens: Sequence[int], record: AccessRecord,
                 metrics: ServerMetrics, guide: str | None = None) -> None:
        self.stream = stream
        self.guide = guide                             # the field the reply's guide came from (response_format...)
        self.choices = {rid: Choice(i, i // n) for i, rid in enumerate(stream.ids)}
        self.ordered = list(self.choices.values())
        self.prompt_tokens = sum(prompt_tokens)        # each prompt once, however many choices it has
        self.record = record
        self.metrics = metrics
        record.prompt_tokens = self.prompt_tokens
        self._closed = False

    async def updates(self) -> AsyncIterator[list[tuple[Choice, RequestDelta]]]:
        """Every burst of deltas, as it arrives, until every choice has finished."""
        choices, add = self.choices, self._add
        while not self.stream.done:
            burst = await self.stream.batch()
            now = time.perf_counter()
            out = [(choices[d.request_id], d) for d in burst]
            for c, d in out:
                add(c, d, now)
            yield out
        self.close()

    def _add(self, c: Choice, d: RequestDelta, now: float) -> None:
        ids = d.new_token_ids
        if ids:
            if c.last_at is None:
                ttft = now - self.record.start
                self.metrics.ttft.observe(ttft)
                if self.record.ttft_s is None:
                    self.record.ttft_s = ttft
            else:
                self.metrics.inter_token.observe((now - c.last_at) / len(ids), len(ids))
            c.last_at = self.record.last_token_at = now
            c.token_ids += ids
            if d.logprobs:
                c.logprobs += d.logprobs
        if d.new_text:
            c.text.append(d.new_text)
        if d.finished:
            c.finish_reason, c.error, c.stop_string = d.finish_reason, d.error, d.stop_string

    def close(self) -> None:
        """Report the request's tokens and finish (once; also when the client left part-way)."""
        if self._closed:
            return
        self._closed = True
        gone = self.record.client_gone = self.stream.gone
        self.record.completion_tokens = self.completion_tokens
        reasons = sorted({c.finish_reason or ("cancelled" if gone else "-") for c in self.ordered})
        self.record.finish = ",".join(reasons)
        self.metrics.prompt_tokens.inc(self.prompt_tokens)
        self.metrics.completion_tokens.inc(self.completion_tokens)
        self.metrics.totals.add(self.prompt_tokens, self.completion_tokens, self.record.ttft_s)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.ordered)

    def usage(self) -> dict:
        done = self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done}

    async def failure(self) -> APIError | None:
        """Why a choice ended in an error, as the status it deserves: 503 when the model was unloaded or
        replaced meanwhile (retry), 500 when a step failed on a bug, else 400 (e.g. output that could not
        follow its guide)."""
        failed = next((c for c in self.ordered if c.finish_reason == "error"), None)
        if failed is None:
            return None
        why = failed.error or "the engine ended this request"
        if await self.stream.engine_gone():
            return APIError(503, f"{why}; retry", code="model_not_loaded", headers={"Retry-After": "1"})
        if why.startswith("internal error"):
            return APIError(500, "the engine failed on a step (a bug; the server log has the details)",
                            code="internal_error")
        return APIError(400, why, param=self.guide if why.startswith(GUIDE_FAILED) else None,
                        code="generation_failed")

    async def collect(self, receive: Callable) -> None:
        """Wait for every choice to finish; a client that disconnects meanwhile cancels them."""
        watch = watch_disconnect(receive, self.stream)
        try:
            async for _ in self.updates():
                pass
        finally:
            watch.cancel()
            self.close()


def watch_disconnect(receive: Callable, stream: Stream) -> asyncio.Task:
    """A task that cancels ``stream``'s requests as soon as the connection reports a disconnect (the body
    has been read already, so the next message can only be that)."""
    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        stream.hang_up()
    return asyncio.get_running_loop().create_task(watch())


async def stream_end(gen: Generation, head: str, include_usage: bool) -> AsyncIterator[str]:
    """The last events of a stream: an error event if the generation failed, the usage chunk when asked
    for (``head`` is the chunk's opening up to its choices list), then ``[DONE]``."""
    failure = await gen.failure()
    if failure is not None:
        yield f"data: {json.dumps(error_object(failure.status, failure.message, failure.param, failure.code))}\n\n"
    if include_usage:
        yield f"{head}], \"usage\": {json.dumps(gen.usage())}}}\n\n"
    yield DONE


def close_stream(watch: asyncio.Task, gen: Generation) -> None:
    """After a stream, however it ended: stop watching the connection and end what still runs."""
    watch.cancel()
    gen.stream.cancel()
    gen.close()
