"""Chat messages as a harmony conversation (openai-harmony's ``Conversation``) or as the variables a harmony
chat template reads (gpt-oss's ``chat_template.jinja``): both render the same prompt.

Messages are the dicts the front ends send (``engine/server/chat_messages.py`` checks the server's):

- ``system`` / ``developer``: instructions (harmony's developer message); the system message proper is
  written by the format (model identity, reasoning effort, date, channels);
- ``user``: text;
- ``assistant``: ``content`` (the final channel), optional ``reasoning_content`` (analysis channel, kept only
  for the turn still in progress: harmony drops the reasoning of answered turns), optional ``tool_calls``
  (OpenAI shape; each becomes a commentary message to ``functions.NAME``, ``<|constrain|>json``);
- ``tool``: a result, answering the call named by ``tool_call_id`` (or by its ``name``).
"""
from __future__ import annotations

import json
from datetime import date

EFFORTS = ("low", "medium", "high")
DEFAULT_EFFORT = "medium"


def check_effort(effort: str) -> str:
    """``effort`` when it is one of EFFORTS; ValueError naming the choices otherwise."""
    if effort not in EFFORTS:
        raise ValueError(f"reasoning effort must be one of {', '.join(EFFORTS)} (got {effort!r})")
    return effort


def _arguments_text(arguments: object) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _call_names(messages: list[dict]) -> dict[str, str]:
    """tool_call_id -> the called function's name, from the assistant messages' tool_calls."""
    names = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            names[call.get("id", "")] = call["function"]["name"]
    return names


def _open_turn_start(messages: list[dict]) -> int:
    """Index after the last user message: assistant reasoning from there on is still needed."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    return users[-1] + 1 if users else 0


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as harmony chat templates read them: reasoning as ``thinking`` (only for the open turn),
    tool results with the ``name`` of the function they answer, arguments as objects."""
    names, keep_from = _call_names(messages), _open_turn_start(messages)
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        reasoning = m.pop("reasoning_content", None)
        if m["role"] == "assistant" and reasoning and i >= keep_from:
            m["thinking"] = reasoning
        if m["role"] == "tool":
            m.setdefault("name", names.get(m.get("tool_call_id", ""), "tool"))
        out.append(m)
    return out


def conversation(messages: list[dict], effort: str, tools: list[dict] | None, today: date | None = None):
    """The openai-harmony ``Conversation`` of ``messages`` ending where the assistant speaks next."""
    from openai_harmony import (
        Conversation,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
    )
    effort_value = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
    system = SystemContent.new().with_reasoning_effort(effort_value[check_effort(effort)]) \
        .with_conversation_start_date((today or date.today()).isoformat())
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = "\n\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools([_tool(t) for t in tools])
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    names, keep_from = _call_names(messages), _open_turn_start(messages)
    for i, m in enumerate(messages):
        out += _turn(m, names, keep_reasoning=i >= keep_from)
    return Conversation.from_messages(out)


def _tool(tool: dict):
    from openai_harmony import ToolDescription
    f = tool["function"]
    return ToolDescription.new(f["name"], f.get("description") or "", parameters=f.get("parameters"))


def _turn(m: dict, names: dict[str, str], keep_reasoning: bool) -> list:
    """One chat message as harmony messages (an assistant turn may be several)."""
    from openai_harmony import Author, Message, Role
    role = m["role"]
    if role in ("system", "developer"):
        return []
    if role == "user":
        return [Message.from_role_and_content(Role.USER, m["content"])]
    if role == "tool":
        name = m.get("name") or names.get(m.get("tool_call_id", ""), "tool")
        author = Author.new(Role.TOOL, f"functions.{name}")
        return [Message.from_author_and_content(author, m["content"]).with_channel("commentary")
                .with_recipient("assistant")]
    out = []
    if keep_reasoning and m.get("reasoning_content"):
        out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"]).with_channel("analysis"))
    for call in m.get("tool_calls") or []:
        f = call["function"]
        out.append(Message.from_role_and_content(Role.ASSISTANT, _arguments_text(f["arguments"]))
                   .with_channel("commentary").with_recipient(f"functions.{f['name']}")
                   .with_content_type("<|constrain|>json"))
    if m.get("content") or not out:     # an empty answer still holds its turn's place
        out.append(Message.from_role_and_content(Role.ASSISTANT, m.get("content") or "").with_channel("final"))
    return out
