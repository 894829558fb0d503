"""OpenAI chat messages as the dicts Hugging Face chat templates read.

- ``content`` is a string, or a list of ``{"type": "text", "text": ...}`` parts joined with newlines (an
  assistant's may hold ``{"type": "refusal", "refusal": ...}`` parts too, read as its text); an assistant
  message may leave it out (or null) when it carries ``tool_calls``;
- role ``developer`` is rendered as ``system`` (templates know only the older name);
- an assistant's ``tool_calls`` keep the OpenAI shape, with ``function.arguments`` decoded from its
  JSON string into a dict (templates write it back with ``tojson``);
- role ``tool`` carries the ``tool_call_id`` of a call an earlier assistant message made.

Fields a message, content part or call holds beyond these are passed over, as OpenAI-compatible servers
do: clients hand back what they keep with a reply (the official one's ``parsed`` and ``parsed_arguments``,
``annotations``, LiteLLM's ``provider_specific_fields``, a part's ``cache_control``, a message's own ``id``),
and none of it changes what the model is shown. An assistant's ``refusal`` is checked; its ``audio`` and a
legacy ``function_call`` are refused unless null. The fields that shape the output (``tools``,
``tool_choice``, ``response_format``) are checked to the letter in their own modules.
"""
from __future__ import annotations

import json

from engine.server.fields import show
from engine.server.structured import FieldError, kind_of

ROLES = ("system", "developer", "user", "assistant", "tool")
_NOT_TEXT = ("image_url", "input_image", "image", "input_audio", "audio", "file", "video_url")


def render_messages(messages: object, keep_reasoning: bool = False) -> list[dict]:
    """``messages`` checked and rewritten for a chat template; FieldError naming ``messages[i]....``.

    ``keep_reasoning`` (harmony models) keeps an assistant's ``reasoning_content`` string (or ``reasoning``,
    the name newer clients send), which other templates are not shown."""
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else kind_of(messages)
        raise FieldError("messages", f"messages must be a non-empty list of {{\"role\": ..., \"content\": ...}} "
                                     f"objects (got {got})")
    out = [_message(f"messages[{i}]", m) for i, m in enumerate(messages)]
    _check_answers(out)
    if keep_reasoning:
        for i, (m, given) in enumerate(zip(out, messages)):
            key = "reasoning_content" if given.get("reasoning_content") is not None else "reasoning"
            reasoning = given.get(key) if m["role"] == "assistant" else None
            if reasoning is not None and not isinstance(reasoning, str):
                raise FieldError(f"messages[{i}].{key}", f"messages[{i}].{key} must be a string "
                                 f"(got {kind_of(reasoning)})")
            if reasoning:
                m["reasoning_content"] = reasoning
    return out


def _message(where: str, message: object) -> dict:
    if not isinstance(message, dict):
        raise FieldError(where, f"{where} must be an object with a role and content (got {kind_of(message)})")
    role = message.get("role")
    if role is None:
        raise FieldError(f"{where}.role", f"{where}.role is missing; give each message a role: "
                                          + ", ".join(ROLES))
    if role not in ROLES:
        raise FieldError(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)} (got {show(role)})")
    if role == "assistant":
        _check_assistant_extras(where, message)
    out: dict = {"role": "system" if role == "developer" else role}
    may_omit = role == "assistant"       # an assistant turn may be only tool calls
    out["content"] = _content(f"{where}.content", message.get("content"), may_omit, role == "assistant")
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise FieldError(f"{where}.name", f"{where}.name must be a string (got {kind_of(name)})")
        out["name"] = name
    if role == "assistant" and message.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(f"{where}.tool_calls", message["tool_calls"])
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise FieldError(f"{where}.tool_call_id", f"{where}.tool_call_id must be the id of the call this "
                             f"result answers (got {kind_of(call_id) if call_id != '' else 'an empty string'})")
        out["tool_call_id"] = call_id
    return out


def _check_assistant_extras(where: str, message: dict) -> None:
    """An assistant's fields that the template is not shown: a refusal (the text of a reply the model
    refused to give) is checked; audio and a legacy function_call are refused unless null."""
    refusal = message.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        raise FieldError(f"{where}.refusal", f"{where}.refusal must be a string or null (got {kind_of(refusal)})")
    if message.get("audio") is not None:
        raise FieldError(f"{where}.audio", f"{where}.audio refers to an audio reply, but this server reads and "
                                           "writes text only; leave it out", code="unsupported_parameter")
    if message.get("function_call") is not None:
        raise FieldError(f"{where}.function_call", f"{where}.function_call is the legacy form of a call; send it "
                                                   "as tool_calls [{\"id\": ..., \"type\": \"function\", "
                                                   "\"function\": {...}}] instead", code="unsupported_parameter")


def _check_answers(messages: list[dict]) -> None:
    """Each tool message answers a call of an earlier assistant message (OpenAI refuses one that does not)."""
    called: list[str] = []
    for i, m in enumerate(messages):
        called += [call["id"] for call in m.get("tool_calls", ())]
        if m["role"] == "tool" and m["tool_call_id"] not in called:
            where = f"messages[{i}].tool_call_id"
            earlier = (f"the earlier calls are {', '.join(show(c) for c in called[-8:])}" if called
                       else "no earlier assistant message made a call")
            raise FieldError(where, f"{where} {show(m['tool_call_id'])} answers no call of an earlier assistant "
                                    f"message ({earlier}); give the id of the call this result answers")


def _content(where: str, content: object, may_omit: bool, assistant: bool = False) -> str:
    if content is None:
        if may_omit:
            return ""
        raise FieldError(where, f"{where} is missing; give the message's text as a string")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(where, f"{where} must be a string or a list of {{\"type\": \"text\", \"text\": ...}} "
                                f"parts (got {kind_of(content)})")
    return "\n".join(_text_part(f"{where}[{j}]", part, assistant) for j, part in enumerate(content))


def _text_part(where: str, part: object, assistant: bool = False) -> str:
    """A text part's text; in an assistant's message also a refusal part's (what the model said instead of
    a reply, as OpenAI gives it back in a turn's history)."""
    if not isinstance(part, dict):
        raise FieldError(where, f"{where} must be an object such as {{\"type\": \"text\", \"text\": ...}} "
                                f"(got {kind_of(part)})")
    kind = part.get("type")
    if kind in _NOT_TEXT:
        raise FieldError(f"{where}.type", f"{where} has type {show(kind)}, but this model reads text only; "
                                          "send text parts only")
    field = "refusal" if kind == "refusal" and assistant else "text"
    if kind != field:
        also = " (or \"refusal\" in an assistant's message)" if kind == "refusal" else ""
        raise FieldError(f"{where}.type", f"{where}.type must be \"text\"{also} (got {show(kind)})")
    text = part.get(field)
    if not isinstance(text, str):
        raise FieldError(f"{where}.{field}", f"{where}.{field} must be a string (got {kind_of(text)})")
    return text


def _tool_calls(where: str, calls: object) -> list[dict]:
    if not isinstance(calls, list):
        raise FieldError(where, f"{where} must be a list of calls (got {kind_of(calls)})")
    return [_tool_call(f"{where}[{j}]", call) for j, call in enumerate(calls)]


def _tool_call(where: str, call: object) -> dict:
    if not isinstance(call, dict):
        raise FieldError(where, f"{where} must be an object with an id and a function (got {kind_of(call)})")
    call_id = call.get("id")
    if not isinstance(call_id, str):
        raise FieldError(f"{where}.id", f"{where}.id must be the call's id as a string (got {kind_of(call_id)})")
    if call.get("type", "function") != "function":
        raise FieldError(f"{where}.type", f"{where}.type must be \"function\" (got {show(call.get('type'))})")
    function = call.get("function")
    if not isinstance(function, dict):
        raise FieldError(f"{where}.function", f"{where}.function must be an object with a name and arguments "
                                              f"(got {kind_of(function)})")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise FieldError(f"{where}.function.name", f"{where}.function.name must be the called tool's name "
                                                   f"(got {show(name)})")
    arguments = _arguments(f"{where}.function.arguments", function.get("arguments"))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _arguments(where: str, arguments: object) -> dict:
    if isinstance(arguments, dict):       # some clients send the object itself
        return arguments
    if not isinstance(arguments, str):
        raise FieldError(where, f"{where} must be a JSON object encoded as a string (got {kind_of(arguments)})")
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError) as exc:      # ValueError: also an integer past Python's digit limit
        reason = (f"{exc.msg} at character {exc.pos}" if isinstance(exc, json.JSONDecodeError)
                  else "nested too deeply" if isinstance(exc, RecursionError)
                  else "an integer with more digits than any argument takes")
        raise FieldError(where, f"{where} is not valid JSON ({reason}); send the arguments as a JSON "
                                "object encoded as a string, e.g. \"{\\\"city\\\": \\\"Paris\\\"}\"") from None
    if not isinstance(value, dict):
        raise FieldError(where, f"{where} must encode a JSON object (got {kind_of(value)})")
    return value
