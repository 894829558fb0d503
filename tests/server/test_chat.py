"""/v1/chat/completions through the official openai client: the chat template, streaming, usage,
max_completion_tokens, logprobs, json_schema output, and tool calls on a tiny model whose template
renders tools."""
from __future__ import annotations

import json

import openai
import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.loop import EngineLoop
from engine.server import BackgroundServer, ServerSettings
from engine.tokenizer import Tokenizer
from tiny_models import build_tiny_tools_model

HI = [{"role": "user", "content": "Tell me about the sea."}]
IGNORE_EOS = {"ignore_eos": True, "return_token_ids": True}


def test_a_chat_reply_is_the_template_prompts_continuation(client, engine, http):
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=10, temperature=0,
                                       extra_body=IGNORE_EOS)
    prompt = engine.tokenizer.apply_chat_template(HI, add_generation_prompt=True)
    plain = http.post("/v1/completions", json={"prompt": engine.tokenizer.encode(prompt, add_special_tokens=False),
                                                "max_tokens": 10, "temperature": 0, "ignore_eos": True}).json()
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content == plain["choices"][0]["text"]
    assert r.usage.prompt_tokens == plain["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == len(c.model_extra["token_ids"]) == 10 and c.finish_reason == "length"
    assert r.object == "chat.completion"


def test_a_chat_message_says_it_holds_no_refusal_as_openais_do(http):
    message = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2}).json()["choices"][0]["message"]
    assert "refusal" in message and message["refusal"] is None


def test_a_streamed_chat_reply_matches_the_whole_one(client):
    args = dict(model="demo", messages=HI, max_tokens=12, temperature=0, extra_body=IGNORE_EOS)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_without_max_tokens_a_chat_reply_may_run_to_the_end_of_the_context(client, engine):
    ctx = engine.context_tokens
    words = 1
    while True:                          # a conversation that leaves a few tokens of the context
        messages = [{"role": "user", "content": "the sea " * words}]
        used = len(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        if used >= ctx - 8:
            break
        words += max(1, (ctx - 8 - used) // 3)
    room = ctx - used
    r = client.chat.completions.create(model="demo", messages=messages, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == used and r.usage.completion_tokens == room and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=messages, max_completion_tokens=room + 1)
    assert err.value.body["param"] == "max_completion_tokens"
    assert f"lower max_completion_tokens to at most {room} or shorten messages by 1 token" in err.value.body["message"]


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_messages_over_the_context_are_refused_with_a_fix_that_counts_the_asked_reply(client, engine, key):
    ctx = engine.context_tokens
    messages = [{"role": "user", "content": "the sea " * 400}]
    used = len(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    assert used > ctx
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=messages, **{key: 30})
    assert err.value.body["param"] == "messages" and err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["message"] == (f"messages and {key} are {used - ctx + 30} tokens over the {ctx}-token "
                                         f"context: messages has {used} tokens and {key} asks for 30 more; shorten "
                                         f"messages by {used - ctx + 30} tokens, or by {used - ctx + 1} tokens "
                                         f"with {key} 1")


def test_max_completion_tokens_wins_over_max_tokens(client):
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=20, max_completion_tokens=3,
                                       temperature=0, extra_body=IGNORE_EOS)
    assert r.usage.completion_tokens == 3


def test_chat_logprobs_with_alternatives(client):
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body=IGNORE_EOS)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.bytes == list(entry.token.encode())
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)   # greedy: the likeliest


def test_chat_top_logprobs_list_exactly_k_alternatives_as_openai_does(client):
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=40, temperature=2.0, seed=3,
                                       logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert all(len(entry.top_logprobs) == 2 for entry in content)
    # the sampled token is the entry's own token; when sampling went outside the top 2 it is not listed there
    assert any(entry.token not in [t.token for t in entry.top_logprobs] for entry in content)


ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "count": {"type": "integer"}},
          "required": ["answer", "count"], "additionalProperties": False}


def _follows(value: object) -> bool:
    """``value`` is valid against ANSWER (a validator for exactly its keywords)."""
    return (isinstance(value, dict) and set(value) == {"answer", "count"} and value["answer"] in ("yes", "no")
            and isinstance(value["count"], int) and not isinstance(value["count"], bool))


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_parses_and_follows_the_schema(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    args = dict(model="demo", messages=HI, max_tokens=60, temperature=0, response_format=fmt,
                extra_body={"ignore_eos": True})
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                       if c.choices)
    else:
        r = client.chat.completions.create(**args)
        assert r.choices[0].finish_reason == "stop"        # the grammar ended the reply, not max_tokens
        text = r.choices[0].message.content
    assert _follows(json.loads(text)), text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_do_not_cut_what_a_json_schema_holds(client, stream):
    # "answer" and "count" are written by the grammar itself: a stop string that matches them would leave
    # half an object behind a finish reason that says the reply is whole
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    args = dict(model="demo", messages=HI, max_tokens=60, temperature=0, response_format=fmt,
                stop=["answer", "count", "{"], extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **args))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        r = client.chat.completions.create(**args)
        text, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
    assert finish == ["stop"] and _follows(json.loads(text)), text


def test_json_object_output_is_an_object(client):
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=120, temperature=0,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:                                      # cut by max_tokens: still the start of one object
        assert r.choices[0].message.content.startswith("{")


def test_tools_on_a_template_without_tool_support_are_refused_naming_tools(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=HI, tools=tools, max_tokens=5)
    assert err.value.body["param"] == "tools" and "does not support tools" in err.value.body["message"]


# ---- tool calls on a tiny model whose chat template renders tools ------------------------------------------

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    return build_tiny_tools_model(tmp_path_factory.mktemp("tools") / "m")


@pytest.fixture(scope="module")
def tools_client(tools_model):
    eng = LLMEngine(EngineConfig(model=str(tools_model), device="cpu"))
    lp = EngineLoop(eng, idle_wait_s=0.01)
    lp.start_thread("tools-engine")
    srv = BackgroundServer(lp, ServerSettings(port=0))
    url = srv.start()
    yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    srv.stop()
    lp.stop()
    lp.join(30)
    eng.close()


def _valid_call(name: str, arguments: str) -> bool:
    args = json.loads(arguments)
    return name == "get_weather" and set(args) == {"city", "unit"} and isinstance(args["city"], str) \
        and len(args["city"]) <= 8 and args["unit"] in ("c", "f")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_call_comes_back_as_tool_calls(tools_client, choice):
    r = tools_client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice,
                                             parallel_tool_calls=False, max_tokens=120, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert _valid_call(call.function.name, call.function.arguments), call.function.arguments


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_does_not_cut_a_forced_call(tools_client, stream):
    # "arguments" is the call's own markup, written under the grammar of tool_choice "required"
    args = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                max_tokens=120, temperature=0, stop=["arguments", "get_weather"])
    if stream:
        chunks = list(tools_client.chat.completions.create(stream=True, **args))
        calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        name, arguments = calls[0].function.name, calls[0].function.arguments
    else:
        c = tools_client.chat.completions.create(**args).choices[0]
        (call,) = c.message.tool_calls
        content, name, arguments = c.message.content or "", call.function.name, call.function.arguments
        assert c.finish_reason == "tool_calls"
    assert not content.strip() and _valid_call(name, arguments), arguments


def test_a_streamed_tool_call_arrives_as_a_tool_calls_delta(tools_client):
    chunks = list(tools_client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                       parallel_tool_calls=False, max_tokens=120, temperature=0,
                                                       stream=True))
    calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].index == 0
    assert _valid_call(calls[0].function.name, calls[0].function.arguments)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices).strip()


SET_UNIT = [{"type": "function", "function": {"name": "set_unit", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "on": {"type": "boolean"}},
    "required": ["unit", "on"], "additionalProperties": False}}}]


@pytest.mark.parametrize("which", [0, 1])       # the limit cuts the first call, or the second after a whole one
def test_a_tool_call_cut_off_by_max_tokens_is_dropped_streamed_or_whole(tools_client, tools_model, which):
    args = dict(model="m", messages=[{"role": "user", "content": "set unit"}], tools=SET_UNIT,
                tool_choice="required", seed=1, extra_body={"return_token_ids": True})
    full = tools_client.chat.completions.create(max_tokens=300, **args).choices[0]
    marker = Tokenizer.from_dir(tools_model).token_to_id("<tool_call>")
    starts = [i for i, t in enumerate(full.model_extra["token_ids"]) if t == marker]
    assert full.finish_reason == "tool_calls" and len(starts) == len(full.message.tool_calls) == 2
    kept = [(t.function.name, t.function.arguments) for t in full.message.tool_calls[:which]]
    cut = dict(max_tokens=starts[which] + 8, **args)                 # a few tokens into the call's JSON
    whole = tools_client.chat.completions.create(**cut).choices[0]
    assert whole.finish_reason == "length"
    assert whole.message.content == ("" if not kept else None)      # no '<tool_call>\n{"na' as content
    assert [(t.function.name, t.function.arguments) for t in whole.message.tool_calls or []] == kept
    chunks = [ch.choices[0] for ch in tools_client.chat.completions.create(stream=True, **cut) if ch.choices]
    assert "".join(ch.delta.content or "" for ch in chunks) == ""
    assert [(t.function.name, t.function.arguments) for ch in chunks for t in ch.delta.tool_calls or []] == kept
    assert [ch.finish_reason for ch in chunks if ch.finish_reason] == ["length"]


def test_a_tool_result_turn_renders_and_gets_a_reply(tools_client):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = tools_client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls") and r.usage.prompt_tokens > 0


def test_a_token_that_is_part_of_a_character_has_its_own_bytes_and_label():
    # byte-level vocabularies spell every byte as a token: logprobs give each its raw byte, and the ones
    # that are not whole characters read as OpenAI spells them (bytes:\xNN), so no two tokens collide
    from pathlib import Path

    from engine.server.engine_client import _token_piece
    from engine.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(Path(__file__).resolve().parents[2] / "resources" / "models" / "demo")
    singles = [i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1]
    assert sorted(tok.token_bytes(i)[0] for i in singles) == list(range(256))
    labels = {_token_piece(tok, i)[0] for i in singles}
    assert len(labels) == 256 and "bytes:\\x97" in labels and "A" in labels
    assert tok.token_bytes(tok.token_to_id("<|im_end|>")) == b"<|im_end|>"
