"""A misspelt or unknown field inside the request (a message, a content part, an assistant's call, a tool, its
function, tool_choice, response_format, its json_schema) is refused as one at the top level is: a 400 with code
unknown_parameter naming its path and the closest name there. Every field OpenAI's API gives those objects is
still accepted, so a client that sends them back (the official one hands a reply's message back whole) works."""
from __future__ import annotations

import pytest

from engine.server.tools import plan_tools
from engine.tokenizer import Tokenizer
from tests.engine.tokenizer_fixtures import build_tiny_tokenizer
from tiny_models import TOOLS_CHAT_TEMPLATE

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _format(**json_schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", **json_schema}}


# (id, request fields, param, what the message ends its fix with)
UNKNOWN = [
    ("json-schema-typo", {"response_format": _format(shcema=SCHEMA)}, "response_format.json_schema.shcema",
     "did you mean response_format.json_schema.schema?"),
    ("response-format-extra", {"response_format": {"type": "json_object", "strict": True}}, "response_format.strict",
     "leave it out"),
    ("tool-extra", {"tools": [{**TOOL, "foo": 1}]}, "tools[0].foo", "leave it out"),
    # a misspelt parameters would make a tool that takes no arguments
    ("tool-parameters-typo", {"tools": [{"type": "function", "function": {"name": "f", "paramters": {}}}]},
     "tools[0].function.paramters", "did you mean tools[0].function.parameters?"),
    ("tool-choice-extra", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}, "x": 1}},
     "tool_choice.x", "leave it out"),
    ("tool-choice-name-typo", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"nme": "f"}}},
     "tool_choice.function.nme", "did you mean tool_choice.function.name?"),
]


@pytest.mark.parametrize("fields,param,fix", [u[1:] for u in UNKNOWN], ids=[u[0] for u in UNKNOWN])
def test_an_unknown_nested_field_is_refused_naming_its_path_and_the_closest_name(http, fields, param, fix):
    r = http.post(CHAT, json={"model": "demo", "messages": HI, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "unknown_parameter"
    assert error["message"].startswith(f"{param} is not a field of ") and fix in error["message"]


def test_what_clients_keep_with_a_message_is_passed_over(http):
    # LiteLLM's provider_specific_fields, a part's cache_control, a message's own id, the official client's
    # parsed_arguments: none changes what the model is shown, and strict servers refusing them broke those clients
    messages = [
        {"role": "user", "id": 123, "opts": {"x": 1},
         "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": None, "provider_specific_fields": None,
         "tool_calls": [{**CALL, "function": {**CALL["function"], "parsed_arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    r = http.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("message,param", [
    ({"role": "tool", "tool_call_ids": "call_1", "content": "ok"}, "messages[2].tool_call_id"),
    ({"role": "user", "content": [{"type": "text", "txt": "Hi"}]}, "messages[2].content[0].text"),
], ids=["tool-call-id", "text-part"])
def test_a_misspelt_field_a_message_needs_is_refused_as_missing(http, message, param):
    messages = [*HI, {"role": "assistant", "tool_calls": [CALL]}, message]
    r = http.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("key,value", [("json_schema", {"name": "a", "schema": SCHEMA}), ("schema", SCHEMA)])
def test_a_schema_on_a_json_object_format_says_which_type_takes_it(http, key, value):
    r = http.post(CHAT, json={"messages": HI, "response_format": {"type": "json_object", key: value}})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == f"response_format.{key}"
    assert error["code"] == "unknown_parameter" and '{"type": "json_schema", "json_schema"' in error["message"]


def test_every_field_openai_gives_the_nested_objects_is_accepted(http):
    messages = [
        {"role": "system", "content": "Be brief.", "name": "rules"},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in JSON."}]},
        {"role": "user", "name": "ana", "content": [
            {"type": "text", "text": "Hi", "prompt_cache_breakpoint": {"mode": "explicit"}}]},
        # an assistant reply handed back whole, as the official client's message object holds it
        {"role": "assistant", "content": None, "refusal": None, "audio": None, "function_call": None,
         "name": "bot", "reasoning_content": None, "reasoning": None, "parsed": None,
         "tool_calls": [{**CALL, "index": 0}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "ok"}]},
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA, "strict": True}}]
    r = http.post(CHAT, json={"messages": messages, "max_tokens": 40, "temperature": 0, "tools": tools,
                              "tool_choice": "none",
                              "response_format": _format(description="d", schema=SCHEMA, strict=True)})
    assert r.status_code == 200, r.text


def test_a_reply_the_official_client_hands_back_whole_is_taken_as_the_next_turns_history(client):
    # messages.append(reply.choices[0].message.model_dump()): every field of the client's message object
    first = client.chat.completions.create(model="demo", messages=HI, max_tokens=4, temperature=0)
    history = [*HI, first.choices[0].message.model_dump(), {"role": "user", "content": "And then?"}]
    assert "annotations" in history[1]
    again = client.chat.completions.create(model="demo", messages=history, max_tokens=4, temperature=0)
    assert again.choices[0].message.role == "assistant"


@pytest.mark.parametrize("field,value,param,words", [
    ("audio", {"id": "audio_1"}, "messages[1].audio", "this server reads and writes text only"),
    ("function_call", {"name": "f", "arguments": "{}"}, "messages[1].function_call", "send it as tool_calls"),
    ("refusal", 5, "messages[1].refusal", "must be a string or null (got a number)"),
])
def test_an_assistants_fields_the_template_is_not_shown_are_checked(http, field, value, param, words):
    r = http.post(CHAT, json={"messages": HI + [{"role": "assistant", "content": "Hello", field: value}] + HI})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and words in error["message"]


def test_a_named_tool_choice_with_only_openais_fields_plans_a_forced_call(tmp_path):
    build_tiny_tokenizer(tmp_path, vocab_size=512, chat_template=TOOLS_CHAT_TEMPLATE)
    plan = plan_tools([TOOL], {"type": "function", "function": {"name": "f"}}, Tokenizer.from_dir(tmp_path))
    assert plan.guide is not None and plan.guide.source == "tool_choice"
