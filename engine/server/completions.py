"""``POST /v1/completions``: prompts as text or token ids, one choice per prompt and n; ``response_format``
as on chat (engine/server/structured.py)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.errors import StrataError
from engine.outputs import RequestDelta, TokenLogprob
from engine.sampling import MAX_LOGPROBS
from engine.server import logprobs as lp
from engine.server import refused, structured
from engine.server.engine_client import ModelInfo
from engine.server.fields import Fields, bad, is_whole, show
from engine.server.generation import (DONE, Choice, Generation, chunk_tail, close_stream, quote, quote_or_null,
                                      stream_end, watch_disconnect)
from engine.server.protocol import (MAX_CHOICES, READ_BOTH, Common, choice_params, fit, guided, read_common,
                                    refuse_overlong)
from engine.server.sse import EventStream
from engine.server.state import ServerState, created, json_body, new_id, record_of, state_of

DEFAULT_MAX_TOKENS = 16            # as OpenAI's completions endpoint
_PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"

FIELDS = refused.known_fields(READ_BOTH, ("prompt", "echo"), refused.COMPLETIONS)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str | None               # as sent; None when sent as token ids


def read_prompts(value: object, info: ModelInfo) -> list[Prompt]:
    """The ``prompt`` field as token ids (runs the tokenizer; call it off the event loop)."""
    if value is None:
        raise bad("prompt", f"prompt is required: {_PROMPT_FORMS}")
    if isinstance(value, str):
        items: list = [value]
    elif isinstance(value, list) and value and all(is_whole(v) for v in value):
        items = [value]
    elif isinstance(value, list) and value and (all(isinstance(v, str) for v in value)
                                                or all(isinstance(v, list) for v in value)):
        items = value
    elif isinstance(value, list) and not value:
        raise bad("prompt", f"prompt is an empty list; give {_PROMPT_FORMS}")
    else:
        raise bad("prompt", f"prompt must be {_PROMPT_FORMS} (got {show(value)})")
    if len(items) > MAX_CHOICES:
        raise bad("prompt", f"prompt holds {len(items)} prompts; send at most {MAX_CHOICES} in one request")
    return [_one(item, info, "prompt" if len(items) == 1 else f"prompt[{i}]") for i, item in enumerate(items)]


def _one(item: str | list, info: ModelInfo, where: str) -> Prompt:
    if isinstance(item, str):
        if info.tokenizer is None:
            raise bad(where, "this model has no tokenizer; send the prompt as token ids")
        refuse_overlong(len(item), info, where)
        ids = info.tokenizer.encode(item)
        if not ids:
            raise bad(where, f"{where} is empty; give at least one token of text")
        return Prompt(ids, item)
    if not item or not all(is_whole(v) for v in item):
        raise bad(where, f"{where} must be a non-empty list of token ids (got {show(item)})")
    out = next((t for t in item if not 0 <= t < info.vocab_size), None)
    if out is not None:
        raise bad(where, f"token id {out} in {where} is outside the vocabulary (0..{info.vocab_size - 1})")
    return Prompt([int(t) for t in item], None)


async def create_completion(request: Request) -> Response:
    server = state_of(request)
    body = await json_body(request)
    info = await server.client.info()
    f = Fields(body)
    refused.refuse_unknown(body, FIELDS, "/v1/completions")
    k = f.whole("logprobs", None, 0, MAX_LOGPROBS)
    echo = f.flag("echo", False)
    score_only = echo and body.get("max_tokens") == 0 and is_whole(body.get("max_tokens"))
    common = read_common(Fields({**body, "max_tokens": 1}) if score_only else f, info, ("max_tokens",),
                         DEFAULT_MAX_TOKENS, k)
    refused.refuse(f, refused.COMPLETIONS)
    guide = structured.read_guide(body.get("response_format"))
    prompts = await asyncio.to_thread(read_prompts, body.get("prompt"), info)
    if len(prompts) * common.n > MAX_CHOICES:
        raise bad("n", f"{len(prompts)} prompts x n={common.n} asks for more than {MAX_CHOICES} choices")
    params, ids = [], []
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if score_only:              # scored, not continued: it needs only to fit the context itself
            _fits_scoring(p, info, where)
            continue
        base = fit(common, common.params, len(p.ids), info, where)
        base = guided(base, guide)
        params += [choice_params(base, j) for j in range(common.n)]
        ids += [p.ids] * common.n
    if not score_only:
        server.client.admit(len(params), info)
    echoed = await _echoed(server, prompts, info, k) if echo else None
    view = CompletionView(info, prompts, common, k, echoed)
    record = record_of(request)
    if score_only:
        record.prompt_tokens = sum(len(p.ids) for p in prompts)
        scored = view.scored(common.n)
        return EventStream(view.scored_events(scored)) if common.stream else JSONResponse(scored)
    stream = await server.client.start(ids, params)
    gen = Generation(stream, common.n, [len(p.ids) for p in prompts], record, server.metrics,
                     guide.source if guide else None)
    return await respond(view, gen, common.stream, request.receive)


def _fits_scoring(prompt: Prompt, info: ModelInfo, where: str) -> None:
    """A prompt echo scores with max_tokens 0 may fill the context, no more (400 naming how far over)."""
    over = len(prompt.ids) - info.context_tokens
    if over > 0:
        raise bad(where, f"{where} has {len(prompt.ids)} tokens, {over} over the {info.context_tokens}-token "
                         f"context; shorten it by {over} to score it", code="context_length_exceeded")


async def respond(view, gen: Generation, stream: bool, receive: Callable) -> Response:
    """The answer to a generation: its event stream, or (once it has finished) its body or its error.

    ``view`` renders the endpoint's format: ``events(gen, receive)`` and ``body(gen)``."""
    if stream:
        return EventStream(view.events(gen, receive))
    await gen.collect(receive)
    failure = await gen.failure()
    if failure is not None:
        return failure.response()
    return JSONResponse(view.body(gen))


@dataclass(frozen=True)
class Echoed:
    """What echo puts before each prompt's choices: its text and (with logprobs) its tokens' own."""

    texts: list[str]
    logprobs: list[list[TokenLogprob | None]] | None


async def _echoed(server: ServerState, prompts: list[Prompt], info: ModelInfo, k: int | None) -> Echoed:
    tok = info.tokenizer
    texts = [p.text if p.text is not None else (tok.decode(p.ids, skip_special_tokens=False) if tok else "")
             for p in prompts]
    if k is None:
        return Echoed(texts, None)
    seqs = [p.ids for p in prompts]
    try:
        logits = await server.client.call(lambda e: e.score_batch(seqs))
    except StrataError as exc:
        raise bad("prompt", str(exc)) from None
    scored = await asyncio.to_thread(lambda: [lp.prompt_logprobs(x, s, k) for x, s in zip(logits, seqs)])
    return Echoed(texts, scored)


class CompletionView:
    """The response shapes of one request: the whole body, or its server-sent events."""

    def __init__(self, info: ModelInfo, prompts: list[Prompt], common: Common, k: int | None,
                 echoed: Echoed | None) -> None:
        self.info, self.prompts, self.common, self.k, self.echoed = info, prompts, common, k, echoed
        self.id, self.created = new_id("cmpl"), created()
        head = json.dumps({"id": self.id, "object": "text_completion", "created": self.created, "model": info.name})
        self._head = "data: " + head[:-1] + ', "choices": ['
        self._tail = chunk_tail(common.include_usage)
        self._plain = k is None and not common.return_token_ids     # every chunk from the template

    def _echo(self, prompt_index: int) -> tuple[str, dict | None, lp.TextOffsets]:
        """(text, logprobs, text offsets going on) of what echo puts first."""
        if self.echoed is None:
            return "", None, lp.TextOffsets()
        text = self.echoed.texts[prompt_index]
        if self.echoed.logprobs is None:
            return text, None, lp.TextOffsets(len(text))
        offsets = lp.TextOffsets()
        obj = lp.legacy(self.prompts[prompt_index].ids, self.echoed.logprobs[prompt_index], self.info, offsets,
                        echoed=text)
        return text, obj, offsets

    def _choice(self, c: Choice) -> dict:
        text, echo_lp, offsets = self._echo(c.prompt_index)
        logprobs = None
        if self.k is not None:
            own = lp.legacy(c.token_ids, lp.pad(c.token_ids, c.logprobs), self.info, offsets)
            logprobs = lp.merge_legacy([echo_lp, own] if echo_lp is not None else [own])
        out = {"index": c.index, "text": text + c.joined, "logprobs": logprobs, "finish_reason": c.finish_reason}
        if self.common.return_token_ids:
            out["token_ids"] = c.token_ids
        return out

    def body(self, gen: Generation) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.info.name,
                "choices": [self._choice(c) for c in gen.ordered], "usage": gen.usage()}

    def scored(self, n: int) -> dict:
        """echo with max_tokens 0: the prompts and their logprobs, nothing generated."""
        choices = [self._choice(Choice(i * n + j, i, finish_reason="length"))
                   for i in range(len(self.prompts)) for j in range(n)]
        used = sum(len(p.ids) for p in self.prompts)
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.info.name,
                "choices": choices, "usage": {"prompt_tokens": used, "completion_tokens": 0, "total_tokens": used}}

    async def scored_events(self, scored: dict) -> AsyncIterator[str]:
        """:meth:`scored` as a stream: a chunk per choice, the usage when asked for, then [DONE]."""
        for choice in scored["choices"]:
            yield self._chunk(choice)
        if self.common.include_usage:
            yield f"{self._head}], \"usage\": {json.dumps(scored['usage'])}}}\n\n"
        yield DONE

    def _chunk(self, choice: dict) -> str:
        return f"{self._head}{json.dumps(choice, ensure_ascii=False)}{self._tail}"

    async def events(self, gen: Generation, receive: Callable) -> AsyncIterator[str]:
        watch = watch_disconnect(receive, gen.stream)
        offsets: dict[int, lp.TextOffsets] = {}
        try:
            first = []
            for c in gen.ordered:
                text, echo_lp, offsets[c.index] = self._echo(c.prompt_index)
                if text:
                    first.append(self._chunk({"index": c.index, "text": text, "logprobs": echo_lp,
                                              "finish_reason": None}))
            if first:
                yield "".join(first)
            async for burst in gen.updates():
                yield "".join(self._delta(c, d, offsets) for c, d in burst)
            async for event in stream_end(gen, self._head, self.common.include_usage):
                yield event
        finally:
            close_stream(watch, gen)

    def _delta(self, c: Choice, d: RequestDelta, offsets: dict[int, lp.TextOffsets]) -> str:
        finish = d.finish_reason if d.finished and d.finish_reason != "error" else None
        # tokens whose text is held back (it may begin a stop string) send nothing, unless the client asked
        # for their logprobs or ids, which their chunk carries
        if not (d.new_text or finish or (d.new_token_ids and not self._plain)):
            return ""
        if self._plain:                                   # the usual chunk, from a template
            return (f'{self._head}{{"index": {c.index}, "text": {quote(d.new_text)}, "logprobs": null, '
                    f'"finish_reason": {quote_or_null(finish)}}}{self._tail}')
        choice: dict = {"index": c.index, "text": d.new_text, "logprobs": None, "finish_reason": finish}
        if self.k is not None and d.new_token_ids:
            choice["logprobs"] = lp.legacy(d.new_token_ids, lp.pad(d.new_token_ids, d.logprobs), self.info,
                                           offsets[c.index])
        if self.common.return_token_ids:
            choice["token_ids"] = list(d.new_token_ids)
        return self._chunk(choice)
