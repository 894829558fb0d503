"""Chat completions of a harmony model (gpt-oss): the prompt rendered with ``reasoning_effort`` and the
request's tools, and the reply read from its token ids into ``reasoning_content``, ``content`` and
``tool_calls`` (whole, or as streamed deltas).

``tool_choice`` may be "auto" or "none" (a harmony model decides for itself when to call); a call naming a
function that is not among the request's tools, or whose arguments are not a JSON object, stays content, as
tool calls of other formats do. ``chat_template_kwargs`` is refused: a harmony prompt has no template.
``response_format`` (a JSON guide from the first token) is refused: it would leave no room for channels.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from engine.chat_format.harmony import (
    DEFAULT_EFFORT,
    EFFORTS,
    HarmonyChat,
    HarmonyDelta,
    ReplyReader,
)
from engine.server import structured, tools
from engine.server.fields import Fields, bad, show
from engine.server.tool_parse import ToolCall, ToolCallDelta, new_call_id


@dataclass(frozen=True)
class HarmonyReply:
    """How one request's replies are read: the model's format and the names of the tools it may call."""

    chat: HarmonyChat
    names: frozenset[str]

    def message(self, token_ids: Sequence[int]) -> tuple[dict, bool]:
        """(the OpenAI message of a whole reply, whether it called a tool)."""
        delta = self.chat.parse(token_ids)
        content, calls = self._calls(delta)
        message: dict = {"role": "assistant", "content": content or (None if calls else ""),
                         "reasoning_content": delta.reasoning or None}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        return message, bool(calls)

    def reader(self) -> ReplyReader:
        return self.chat.reader()

    def deltas(self, reader: ReplyReader, token_ids: Sequence[int], finished: bool, called: int) -> list[dict]:
        """The OpenAI ``delta`` objects of one step's tokens (``called``: calls already streamed)."""
        delta = reader.feed(token_ids)
        if finished:
            delta += reader.finish()
        content, calls = self._calls(delta)
        out = []
        if delta.reasoning:
            out.append({"reasoning_content": delta.reasoning})
        if content:
            out.append({"content": content})
        out += [{"tool_calls": [ToolCallDelta(called + i, c).to_openai()]} for i, c in enumerate(calls)]
        return out

    def _calls(self, delta: HarmonyDelta) -> tuple[str, list[ToolCall]]:
        """(content, the calls of the request's tools); a call of another name is given back as text."""
        content, calls = delta.content, []
        for call in delta.calls:
            if call.name in self.names and _json_object(call.arguments):
                calls.append(ToolCall(new_call_id(), call.name, call.arguments))
            else:                       # not a call the client can make: what the model wrote, as text
                content += call.arguments
        return content, calls


def _json_object(text: str) -> bool:
    """Whether a call's arguments are a JSON object, as a client parses them."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def prepare_harmony(body: dict, chat: HarmonyChat) -> tuple[list[int], tools.ToolPlan, HarmonyReply]:
    """Prompt ids, the checked tools and the reading of a harmony request (FieldError / 400 naming the field)."""
    f = Fields(body)
    if f.given("chat_template_kwargs"):
        raise bad("chat_template_kwargs", "this model's prompt is written in the harmony format, which takes no "
                                          "template variables; leave chat_template_kwargs out (reasoning_effort sets "
                                          "how hard it thinks)", code="unsupported_parameter")
    effort = f.raw("reasoning_effort")
    if effort is None:
        effort = DEFAULT_EFFORT
    if effort not in EFFORTS:
        raise bad("reasoning_effort", f"reasoning_effort must be one of {', '.join(EFFORTS)} (got {show(effort)})")
    if structured.guide_for(body.get("response_format")) is not None:
        raise bad("response_format", "this model writes its reply in harmony channels, which a JSON format "
                                     "would break; leave response_format out and ask for JSON in the message")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad("tool_choice", "this model chooses its tool calls itself: tool_choice may be \"auto\" or "
                                 "\"none\"; leave it out to let the model call the tools")
    plan = tools.plan_tools(f.raw("tools"), "none", chat.tokenizer, f.raw("parallel_tool_calls", True))
    offered = [] if choice == "none" else [t.as_openai() for t in plan.tools]
    messages = tools.render_messages(body.get("messages"), keep_reasoning=True)
    ids = chat.render(messages, effort, offered or None)
    return ids, plan, HarmonyReply(chat, frozenset(t["function"]["name"] for t in offered))
