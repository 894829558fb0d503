"""``POST /v1/chat/completions``: messages through the model's chat template, with structured output
(``response_format``) and tool calls (``tools`` / ``tool_choice``) from engine/server/structured.py and
engine/server/tools.py."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.chat_format.think import ThinkTags
from engine.chat_template import ChatTemplateFault, ChatTemplateRefusal, TemplateFixes, failure_line
from engine.errors import ConfigError, StrataError
from engine.guided import Guide
from engine.outputs import RequestDelta
from engine.sampling import MAX_LOGPROBS, check_stop, stop_holdback
from engine.server import logprobs as lp
from engine.server import refused, structured, tools
from engine.server.chat_harmony import HarmonyReply, prepare_harmony
from engine.server.completions import respond
from engine.server.engine_client import ModelInfo
from engine.server.errors import APIError
from engine.server.fields import Fields, bad
from engine.server.generation import (Choice, Generation, chunk_tail, close_stream, quote, stream_end,
                                      watch_disconnect)
from engine.server.protocol import (READ_BOTH, Common, choice_params, fit, guided, read_common, refuse_overlong,
                                    text_chars)
from engine.server.state import created, json_body, new_id, record_of, state_of
from engine.server.think_reply import ThinkReply


FIELDS = refused.known_fields(READ_BOTH, ("messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                          "parallel_tool_calls", "reasoning_effort", "chat_template_kwargs"),
                              refused.CHAT)


GPT_OSS = "GptOssForCausalLM"     # its prompt (harmony) takes reasoning_effort, when its tokenizer has harmony's tokens
_RESERVED = frozenset({"messages", "add_generation_prompt", "tokenize", "tools"})   # set by the server
# A chat template's failures as a client reads them: the messages are theirs to change, the template is not.
_RESHAPE = "change the messages to the roles and order this model expects"
TEMPLATE_FIXES = TemplateFixes(fault="the fault is the template's rather than the messages'; whoever serves the model "
                                     "can fix its chat_template", system=_RESHAPE, other=_RESHAPE,
                               conversation="change the request to meet the rule in the template's own words, or "
                                            "whoever serves the model can change its chat_template")
_KWARGS_FIXES = dataclasses.replace(TEMPLATE_FIXES, fault="check the variables chat_template_kwargs sets, which the "
                                                          "template may not expect")
_UNPARSED_FIXES = dataclasses.replace(TEMPLATE_FIXES, fault="send a plain prompt to /v1/completions until whoever "
                                                            "serves the model fixes its chat_template")


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    plan: tools.ToolPlan
    guide: Guide | None
    harmony: HarmonyReply | None = None     # a harmony model's reply is read from its tokens
    think: ThinkTags | None = None          # a <think> model's reasoning is read apart from its tokens


def prepare(body: dict, info: ModelInfo) -> ChatPrompt:
    """Messages, tools and response_format as the prompt's token ids and the reply's guide (runs the
    chat template; call it off the event loop)."""
    tok = info.tokenizer
    if tok is not None and tok.template_error is not None:
        raise bad(None, failure_line(tok.template_error, _UNPARSED_FIXES, show_files=False),
                  code="chat_template_error")
    if tok is None or not tok.has_chat_template:
        raise bad("messages", "this model has no chat template; send a plain prompt to /v1/completions instead")
    refuse_overlong(text_chars(body.get("messages")), info, "messages")
    f = Fields(body)
    if tok.harmony is not None:
        return _prepare_harmony(body, tok.harmony)
    if f.given("reasoning_effort") and info.architecture == GPT_OSS:
        raise bad("reasoning_effort", "this gpt-oss checkpoint's tokenizer lacks the harmony format's special tokens "
                                      "(<|channel|>, <|message|>, ...), so its prompt takes no reasoning_effort; leave "
                                      "it out, or serve the model with the tokenizer files it was released with",
                  code="unsupported_parameter")
    if f.given("reasoning_effort"):
        raise bad("reasoning_effort", "reasoning_effort is only for models whose prompt takes it (gpt-oss); leave "
                                      "it out, or switch thinking with chat_template_kwargs such as "
                                      "{\"enable_thinking\": false}", code="unsupported_parameter")
    try:
        messages = tools.render_messages(body.get("messages"))
        plan = tools.plan_tools(f.raw("tools"), body.get("tool_choice"), tok, f.raw("parallel_tool_calls", True))
        guide = structured.guide_for(body.get("response_format"))
    except structured.FieldError as exc:
        raise bad(exc.param, str(exc), exc.code) from None
    except ConfigError as exc:                       # refused without naming a field
        raise bad(None, str(exc)) from None
    if guide is not None and plan.guide is not None:
        raise bad("response_format", "response_format and a forced tool_choice both constrain the reply; "
                                     "send one of them")
    extra = f.obj("chat_template_kwargs") or {}
    taken = sorted(set(extra) & _RESERVED)
    if taken:
        raise bad("chat_template_kwargs", f"chat_template_kwargs may not set {', '.join(taken)}; the server sets it")
    variables = {**extra, **plan.template_vars}
    try:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **variables)
    except ChatTemplateFault as exc:
        raise _template_fault(exc, bool(extra)) from None
    except ChatTemplateRefusal as exc:
        raise _refusal(exc) from None
    except StrataError as exc:
        raise bad("messages", str(exc)) from None
    return ChatPrompt(list(ids), plan, guide or plan.guide, think=tok.think)


def _prepare_harmony(body: dict, chat) -> ChatPrompt:
    try:
        ids, plan, reply = prepare_harmony(body, chat)
    except structured.FieldError as exc:
        raise bad(exc.param, str(exc), exc.code) from None
    except ConfigError as exc:
        raise bad(None, str(exc)) from None
    except ChatTemplateFault as exc:
        raise _template_fault(exc) from None
    except ChatTemplateRefusal as exc:
        raise _refusal(exc) from None
    except StrataError as exc:
        raise bad("messages", str(exc)) from None
    return ChatPrompt(ids, plan, None, reply)


def _refusal(exc: ChatTemplateRefusal) -> APIError:
    """The template refused the conversation: ``messages`` is the field to change when one message is to blame;
    when none is, the rule in the template's words may be about another field (tools, say), so none is named."""
    return bad("messages" if exc.role else None, failure_line(exc, TEMPLATE_FIXES, show_files=False))


def _template_fault(exc: ChatTemplateFault, kwargs: bool = False) -> APIError:
    """The chat template failed on messages of the shape templates are written for: its fault, not the client's,
    unless the client set template variables (``kwargs``), which it may not expect. The line names the template's
    own words and line, never the server's files."""
    if kwargs:
        return bad("chat_template_kwargs", failure_line(exc, _KWARGS_FIXES, show_files=False),
                   code="chat_template_error")
    return bad(None, failure_line(exc, TEMPLATE_FIXES, show_files=False), code="chat_template_error")


async def create_chat_completion(request: Request) -> Response:
    server = state_of(request)
    body = await json_body(request)
    info = await server.client.info()
    f = Fields(body)
    refused.refuse_unknown(body, FIELDS, "/v1/chat/completions")
    k = _logprobs(f)
    common = read_common(f, info, ("max_completion_tokens", "max_tokens"), None, k)
    refused.refuse(f, refused.CHAT)
    prompt = await asyncio.to_thread(prepare, body, info)
    params = guided(fit(common, common.params, len(prompt.ids), info, "messages"), prompt.guide)
    # Stops apply to the answer, never to reasoning or headers; so does a guide (a forced tool call or a
    # response_format) where the template opened a <think> block: the model reasons, then answers by it.
    if (params.stop and (prompt.harmony or prompt.think)) or (params.guide is not None and prompt.think):
        scope = prompt.harmony.chat.stop_scope() if prompt.harmony else prompt.think.stop_scope(prompt.ids)
        params = dataclasses.replace(params, stop_scope=scope)
    choices = [choice_params(params, j) for j in range(common.n)]
    server.client.admit(len(choices), info)
    stream = await server.client.start([prompt.ids] * common.n, choices)
    gen = Generation(stream, common.n, [len(prompt.ids)], record_of(request), server.metrics,
                     prompt.guide.source if prompt.guide else None)
    view = ChatView(info, common, k, prompt.plan, prompt.harmony, _Think.of(prompt, info),
                    prompt.guide is not None and not prompt.guide.stoppable)
    return await respond(view, gen, common.stream, request.receive)


def _logprobs(f: Fields) -> int | None:
    """Alternatives per token when logprobs are asked for (chat: ``logprobs`` true, ``top_logprobs`` N)."""
    wanted = f.flag("logprobs", False)
    top = f.whole("top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise bad("top_logprobs", "top_logprobs needs logprobs: true")
    return (top or 0) if wanted else None


@dataclass(frozen=True)
class _Think:
    """A <think> model's reply read apart: what reads it, and the prompt it answers."""

    tags: ThinkTags
    tokenizer: Any
    prompt_ids: list[int]

    @staticmethod
    def of(prompt: ChatPrompt, info: ModelInfo) -> _Think | None:
        return None if prompt.think is None else _Think(prompt.think, info.tokenizer, prompt.ids)

    def reader(self) -> ThinkReply:
        return ThinkReply(self.tokenizer, self.tags, self.prompt_ids)

    def parse(self, token_ids):
        reader = self.reader()
        return reader.feed(token_ids) + reader.finish()


class _AnswerStops:
    """A reasoning reply's answer cut at its first stop string, where the engine (matching within the
    answer, engine.sampling.StopScope) ended the reply: whole, or streamed with the tail that could begin
    a stop held back. The answer is read from the reply's tokens, which run past the cut."""

    def __init__(self, stop: tuple[str, ...], include: bool) -> None:
        self.stop, self.include = stop, include
        self.held, self.done = "", False

    def cut(self, text: str) -> str:
        at = check_stop("", text, self.stop)
        if at is None:
            return text
        self.done = True
        return text[:at + (next(len(s) for s in self.stop if text.startswith(s, at)) if self.include else 0)]

    def feed(self, text: str, final: bool) -> str:
        if self.done:
            return ""
        full, self.held = self.held + text, ""
        out = self.cut(full)
        if self.done:
            return out
        hold = 0 if final else stop_holdback(full, self.stop)
        self.held = full[len(full) - hold:] if hold else ""
        return full[:len(full) - hold]


class ChatView:
    """The response shapes of one chat request: the whole body, or its server-sent events."""

    def __init__(self, info: ModelInfo, common: Common, k: int | None, plan: tools.ToolPlan,
                 harmony: HarmonyReply | None = None, think: _Think | None = None, guided: bool = False) -> None:
        self.info, self.common, self.k, self.plan, self.harmony = info, common, k, plan, harmony
        self.think = think
        p = common.params
        # a reasoning reply's answer is read from its tokens: its stop strings are cut here too, but for
        # an answer a guide holds (``guided``), which ends where its grammar does, as the engine lets it
        self.stops = (lambda: _AnswerStops(p.stop, p.include_stop_str_in_output)) \
            if p.stop and not guided and (harmony is not None or think is not None) else None
        self.id, self.created = new_id("chatcmpl"), created()
        head = json.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": info.name})
        self._head = "data: " + head[:-1] + ', "choices": ['
        self._tail = chunk_tail(common.include_usage)

    @staticmethod
    def _cut_off(finish: str | None, stop_string: bool) -> bool:
        """Whether the reply was cut where the model did not end it: at its token limit, or by one of the
        request's stop strings (a call it cut is dropped, not sent as markup)."""
        return finish == "length" or (finish == "stop" and stop_string)

    def _logprobs(self, ids: list[int] | tuple[int, ...], lps) -> dict | None:
        if self.k is None:
            return None
        return {"content": lp.chat(ids, lp.pad(ids, lps), self.info), "refusal": None}

    def _choice(self, c: Choice) -> dict:
        text = c.joined
        message: dict = {"role": "assistant", "content": text, "refusal": None}
        finish = c.finish_reason
        if self.think is not None:
            said = self.think.parse(c.token_ids)
            text = message["content"] = self.stops().cut(said.content) if self.stops else said.content
            message["reasoning_content"] = said.reasoning or None
        if self.harmony is not None:
            message, called = self.harmony.message(c.token_ids)
            message["refusal"] = None
            if self.stops and message["content"]:
                message["content"] = self.stops().cut(message["content"])
            finish = "tool_calls" if called and finish != "length" else finish
        elif self.plan.parser is not None:
            content, calls = tools.parse_tool_calls(text, self.plan, cut_off=self._cut_off(finish, c.stop_string))
            message["content"] = content
            if calls:
                message["tool_calls"] = [call.to_openai() for call in calls]
                finish = "tool_calls" if finish != "length" else finish    # a reply cut short says so
        out = {"index": c.index, "message": message, "logprobs": self._logprobs(c.token_ids, c.logprobs),
               "finish_reason": finish}
        if self.common.return_token_ids:
            out["token_ids"] = c.token_ids
        return out

    def body(self, gen: Generation) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.info.name,
                "choices": [self._choice(c) for c in gen.ordered], "usage": gen.usage()}

    def _chunk(self, index: int, delta: dict, finish: str | None = None, logprobs: dict | None = None,
               ids: list[int] | None = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if ids is not None:
            choice["token_ids"] = ids
        return f"{self._head}{json.dumps(choice, ensure_ascii=False)}{self._tail}"

    async def events(self, gen: Generation, receive: Callable) -> AsyncIterator[str]:
        watch = watch_disconnect(receive, gen.stream)
        parsers = {c.index: tools.ToolStreamParser(self.plan) for c in gen.ordered}
        called: set[int] = set()
        try:
            yield "".join(self._chunk(c.index, {"role": "assistant", "content": ""}) for c in gen.ordered)
            stops = {c.index: self.stops() for c in gen.ordered} if self.stops else {}
            if self.harmony is not None:
                readers = {c.index: self.harmony.reader() for c in gen.ordered}
                calls = {c.index: 0 for c in gen.ordered}
                async for burst in gen.updates():
                    yield "".join(self._harmony_delta(c, d, readers[c.index], calls, stops.get(c.index))
                                  for c, d in burst)
            else:
                readers = {c.index: self.think.reader() for c in gen.ordered} if self.think is not None else {}
                async for burst in gen.updates():
                    yield "".join(self._delta(c, d, parsers[c.index], called, readers.get(c.index), stops.get(c.index))
                                  for c, d in burst)
            async for event in stream_end(gen, self._head, self.common.include_usage):
                yield event
        finally:
            close_stream(watch, gen)

    def _harmony_delta(self, c: Choice, d: RequestDelta, reader, calls: dict[int, int],
                       stops: _AnswerStops | None = None) -> str:
        """One step of a harmony reply: reasoning, content and calls as their own delta chunks."""
        deltas = self.harmony.deltas(reader, d.new_token_ids, d.finished, calls[c.index])
        if stops is not None:                           # the answer's text, cut at its stop
            kept = [x if "content" not in x else {"content": stops.feed(x["content"], False)} for x in deltas]
            tail = stops.feed("", d.finished)
            deltas = [x for x in kept if x.get("content", True)] + ([{"content": tail}] if tail else [])
        calls[c.index] += sum(len(x.get("tool_calls", ())) for x in deltas)
        logprobs = self._logprobs(d.new_token_ids, d.logprobs) if d.new_token_ids else None
        ids = list(d.new_token_ids) if self.common.return_token_ids else None
        parts = []
        for delta in deltas or ([{}] if logprobs is not None or ids else []):
            parts.append(self._chunk(c.index, delta, None, logprobs, ids))
            logprobs, ids = None, None                   # the step's tokens go with its first chunk
        if d.finished and d.finish_reason != "error":
            called = calls[c.index] and d.finish_reason != "length"
            parts.append(self._chunk(c.index, {}, "tool_calls" if called else d.finish_reason))
        return "".join(parts)

    def _delta(self, c: Choice, d: RequestDelta, parser: tools.ToolStreamParser, called: set[int],
               think=None, stops: _AnswerStops | None = None) -> str:
        """One step of a reply: its text (a <think> model's answer, after its reasoning as
        ``reasoning_content``) through the tool-call parser."""
        text, parts = d.new_text, []
        logprobs = self._logprobs(d.new_token_ids, d.logprobs) if d.new_token_ids else None
        ids = list(d.new_token_ids) if self.common.return_token_ids else None
        if think is not None:
            said = think.feed(d.new_token_ids)
            said = said + think.finish() if d.finished else said
            text = stops.feed(said.content, d.finished) if stops is not None else said.content
            if said.reasoning:
                parts.append(self._chunk(c.index, {"reasoning_content": said.reasoning}, None, logprobs, ids))
                logprobs, ids = None, None
        events = parser.feed(text) if text else []
        if d.finished:
            events += parser.finish(cut_off=self._cut_off(d.finish_reason, d.stop_string))
        for e in events:
            if isinstance(e, tools.ToolCallDelta):
                called.add(c.index)
                parts.append(self._chunk(c.index, {"tool_calls": [e.to_openai()]}, None, logprobs, ids))
            elif logprobs is None and ids is None:       # the usual chunk, from a template
                parts.append(f'{self._head}{{"index": {c.index}, "delta": {{"content": {quote(e.text)}}}, '
                             f'"logprobs": null, "finish_reason": null}}{self._tail}')
            else:
                parts.append(self._chunk(c.index, {"content": e.text}, None, logprobs, ids))
            logprobs, ids = None, None                   # the step's tokens go with its first chunk
        if logprobs is not None or ids:
            parts.append(self._chunk(c.index, {}, None, logprobs, ids))
        if d.finished and d.finish_reason != "error":
            finish = "tool_calls" if c.index in called and d.finish_reason != "length" else d.finish_reason
            parts.append(self._chunk(c.index, {}, finish))
        return "".join(parts)
