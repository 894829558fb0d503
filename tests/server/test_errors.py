"""Malformed and hostile requests: each gets a 4xx OpenAI error object naming what is wrong, and the
server answers a good request right after; a full queue is a 503 with Retry-After."""
from __future__ import annotations

import gzip
import json

import httpx
import openai
import pytest

from engine.server import BackgroundServer, ServerSettings
from http_helpers import KEY, engine_idle

AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}
CHAT = "/v1/chat/completions"
COMPLETE = "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]


def _json(**fields) -> bytes:
    return json.dumps({"model": "demo", **fields}).encode()


def _deep(levels: int) -> bytes:
    return b'{"prompt": ' + b"[" * levels + b"]" * levels + b"}"


# (id, method, path, headers, body, status, param or None, words the message must hold)
HOSTILE = [
    ("invalid-json", "POST", COMPLETE, JSON, b'{"prompt": "Hi", ', 400, None, "not valid JSON"),
    ("body-not-an-object", "POST", COMPLETE, JSON, b'["Hi"]', 400, None, "must be a JSON object"),
    ("empty-body", "POST", COMPLETE, JSON, b"", 400, None, "body is empty"),
    # the same body faults on the chat route, and a body that is not JSON at all (a form, as curl -d sends)
    ("chat-not-json", "POST", CHAT, JSON, b"model=demo&messages=Hi", 400, None,
     "the request body is not valid JSON (Expecting value: line 1 column 1 (char 0)); send a JSON object"),
    ("chat-truncated-json", "POST", CHAT, JSON, _json(messages=HI)[:-4], 400, None,     # cut inside "Hi"
     "the request body is not valid JSON (Unterminated string starting at: line 1 column 60"),
    ("chat-body-an-array", "POST", CHAT, JSON, json.dumps(HI).encode(), 400, None,
     "the request body must be a JSON object (got a JSON array)"),
    ("chat-empty-body", "POST", CHAT, JSON, b"", 400, None, "the request body is empty; send a JSON object"),
    ("chat-xml-body", "POST", CHAT, {**AUTH, "Content-Type": "application/xml"}, _json(messages=HI), 415, None,
     "the body is application/xml; send JSON with Content-Type: application/json"),
    ("config-not-json", "POST", "/v1/strata/config", JSON, b"max_batch=4", 400, None, "not valid JSON"),
    ("max-tokens-wrong-type", "POST", COMPLETE, JSON, _json(prompt="Hi", max_tokens="ten"), 400, "max_tokens",
     "max_tokens must be a whole number"),
    ("max-tokens-negative", "POST", COMPLETE, JSON, _json(prompt="Hi", max_tokens=-5), 400, "max_tokens",
     "max_tokens must be a whole number >= 1 (got -5)"),
    ("max-tokens-huge", "POST", COMPLETE, JSON, _json(prompt="Hi", max_tokens=10**12), 400, "max_tokens",
     "max_tokens 1000000000000 does not fit: prompt has 2 tokens, which leaves 510 of the 512-token context for the "
     "reply; lower max_tokens to at most 510"),
    # far over the context: refused before the text is tokenized (no token of the demo's covers 16 characters)
    ("prompt-far-over-the-context", "POST", COMPLETE, JSON, _json(prompt="a " * 300_000), 400, "prompt",
     "prompt has 600000 characters, at least 18750 tokens, more than the 512-token context holds; shorten it"),
    ("messages-far-over-the-context", "POST", CHAT, JSON,
     _json(messages=[{"role": "user", "content": [{"type": "text", "text": "a " * 300_000}]}]), 400, "messages",
     "messages has 600008 characters, at least 18750 tokens"),
    # over the context but short enough to count: the message names by how much to shorten it
    ("prompt-over-the-context", "POST", COMPLETE, JSON, _json(prompt="word " * 5000), 400, "prompt",
     "tokens over the 512-token context: it has "),
    ("max-tokens-the-context", "POST", COMPLETE, JSON, _json(prompt="Hi", max_tokens=512), 400, "max_tokens",
     "max_tokens 512 does not fit: prompt has 2 tokens"),
    ("temperature-huge-integer", "POST", COMPLETE, JSON, b'{"prompt": "Hi", "temperature": 1' + b"0" * 400 + b"}", 400,
     "temperature", "temperature must be a finite number"),
    ("temperature-negative", "POST", COMPLETE, JSON, _json(prompt="Hi", temperature=-1), 400, "temperature",
     "temperature must be a number >= 0 (got -1)"),
    ("top-p-zero", "POST", CHAT, JSON, _json(messages=HI, top_p=0), 400, "top_p", "top_p must be a number in (0, 1]"),
    ("seed-a-string", "POST", COMPLETE, JSON, _json(prompt="Hi", seed="lucky"), 400, "seed",
     "seed must be a whole number that fits in 64 bits (got \"lucky\"); leave it out (or null) to draw"),
    ("seed-without-room-for-n", "POST", COMPLETE, JSON, _json(prompt="Hi", seed=2**64 - 1, n=2), 400, "seed",
     "use a smaller seed"),
    ("temperature-overflows", "POST", COMPLETE, JSON, b'{"prompt": "Hi", "temperature": 1e999}', 400, "temperature",
     "temperature: 1e999 is beyond the range of a 64-bit float"),
    ("unknown-model", "POST", COMPLETE, JSON, _json(prompt="Hi") .replace(b'"demo"', b'"gpt-4"'), 404, "model",
     "model \"gpt-4\" is not served here"),
    ("message-without-role", "POST", CHAT, JSON, _json(messages=[{"content": "Hi"}]), 400, "messages[0].role",
     "messages[0].role is missing"),
    ("messages-not-a-list", "POST", CHAT, JSON, _json(messages="Hi"), 400, "messages", "messages must be"),
    ("empty-prompt", "POST", COMPLETE, JSON, _json(prompt=""), 400, "prompt", "prompt is empty"),
    ("prompt-beyond-context", "POST", COMPLETE, JSON, _json(prompt="the sea " * 400, max_tokens=16), 400, "prompt",
     "tokens over the 512-token context"),
    ("chat-beyond-context", "POST", CHAT, JSON, _json(messages=[{"role": "user", "content": "the sea " * 400}]),
     400, "messages", "tokens over the 512-token context"),
    ("n-zero", "POST", COMPLETE, JSON, _json(prompt="Hi", n=0), 400, "n", "n must be a whole number from 1 to 128"),
    ("n-thousand", "POST", COMPLETE, JSON, _json(prompt="Hi", n=1000), 400, "n", "(got 1000)"),
    ("logprobs-99", "POST", COMPLETE, JSON, _json(prompt="Hi", logprobs=99), 400, "logprobs",
     "logprobs must be a whole number from 0 to 20 (got 99)"),
    ("top-logprobs-without-logprobs", "POST", CHAT, JSON, _json(messages=HI, top_logprobs=3), 400, "top_logprobs",
     "needs logprobs: true"),
    ("stop-100-strings", "POST", COMPLETE, JSON, _json(prompt="Hi", stop=[f"s{i}" for i in range(100)]), 400,
     "stop", "at most 16 strings"),
    ("stop-empty-string", "POST", COMPLETE, JSON, _json(prompt="Hi", stop=[""]), 400, "stop", "must not be empty"),
    ("bad-response-format", "POST", CHAT, JSON, _json(messages=HI, response_format={"type": "xml"}), 400,
     "response_format.type", "response_format.type must be"),
    ("schema-not-an-object", "POST", CHAT, JSON,
     _json(messages=HI, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}), 400,
     "response_format.json_schema.schema", "must be a JSON object"),
    ("tools-wrong-shape", "POST", CHAT, JSON, _json(messages=HI, tools="search"), 400, "tools", "tools must be a list"),
    ("prompt-mixed-types", "POST", COMPLETE, JSON, _json(prompt=[1, "a", [2]]), 400, "prompt", "prompt must be"),
    ("token-id-out-of-vocab", "POST", COMPLETE, JSON, _json(prompt=[5, 999999]), 400, "prompt",
     "token id 999999 in prompt is outside the vocabulary (0..4095)"),
    ("stream-not-a-bool", "POST", COMPLETE, JSON, _json(prompt="Hi", stream="yes"), 400, "stream",
     "stream must be true or false"),
    ("stream-options-without-stream", "POST", COMPLETE, JSON,
     _json(prompt="Hi", stream_options={"include_usage": True}), 400, "stream_options", "only allowed with stream"),
    ("stream-options-misspelt", "POST", COMPLETE, JSON,
     _json(prompt="Hi", stream=True, stream_options={"include_usag": True}), 400, "stream_options.include_usag",
     "did you mean stream_options.include_usage?"),
    ("nan-in-json", "POST", COMPLETE, JSON, b'{"prompt": "Hi", "temperature": NaN}', 400, None,
     "NaN is not a JSON number"),
    ("infinity-in-json", "POST", COMPLETE, JSON, b'{"prompt": "Hi", "top_p": -Infinity}', 400, None,
     "Infinity is not a JSON number"),
    ("deeply-nested-json", "POST", COMPLETE, JSON, _deep(100_000), 400, None,
     "nests deeper than 64 levels; send it with fewer levels of objects and arrays"),
    ("moderately-nested-json", "POST", COMPLETE, JSON, _deep(200), 400, "prompt", "nests deeper than 64 levels (in prompt)"),
    ("invalid-utf8", "POST", COMPLETE, JSON, b'{"prompt": "\xff\xfe\xfa"}', 400, None, "not UTF-8"),
    ("lone-surrogate", "POST", COMPLETE, JSON, b'{"prompt": "a\\ud800b"}', 400, None, "surrogate"),
    ("unicode-garbage-prompt", "POST", COMPLETE, JSON,
     _json(prompt="\u202e\u0000\U0010ffff\ufffe\U0001f600" * 20, max_tokens=1), 200, None, ""),
    ("image-part", "POST", CHAT, JSON,
     _json(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0].type", "reads text only"),
    ("template-kwargs-override", "POST", CHAT, JSON, _json(messages=HI, chat_template_kwargs={"messages": []}), 400,
     "chat_template_kwargs", "may not set messages"),
    ("suffix", "POST", COMPLETE, JSON, _json(prompt="Hi", suffix="end"), 400, "suffix", "not supported"),
    ("chat-suffix", "POST", CHAT, JSON, _json(messages=[{"role": "user", "content": "Hi"}], suffix="end"), 400,
     "suffix", "not supported"),
    ("presence-penalty-false", "POST", COMPLETE, JSON, _json(prompt="Hi", presence_penalty=False), 400,
     "presence_penalty", "not supported by this server (got false)"),
    ("presence-penalty", "POST", COMPLETE, JSON, _json(prompt="Hi", presence_penalty=0.5), 400, "presence_penalty",
     "use repetition_penalty"),
    ("legacy-functions", "POST", CHAT, JSON, _json(messages=HI, functions=[{"name": "f", "parameters": {}}]), 400,
     "functions", "use tools instead of functions"),
    ("legacy-function-call", "POST", CHAT, JSON, _json(messages=HI, function_call={"name": "f"}), 400,
     "function_call", "use tool_choice instead of function_call"),
    ("audio-modality", "POST", CHAT, JSON, _json(messages=HI, modalities=["text", "audio"]), 400, "modalities",
     "text only"),
    ("audio-output", "POST", CHAT, JSON, _json(messages=HI, audio={"voice": "alloy", "format": "wav"}), 400, "audio",
     "text only"),
    ("reasoning-effort-on-a-plain-template", "POST", CHAT, JSON, _json(messages=HI, reasoning_effort="low"), 400,
     "reasoning_effort", "chat_template_kwargs"),
    ("vllm-guided-json", "POST", COMPLETE, JSON, _json(prompt="Hi", guided_json={"type": "object"}), 400,
     "guided_json", "use response_format"),
    ("min-tokens", "POST", CHAT, JSON, _json(messages=HI, min_tokens=5), 400, "min_tokens", "not supported"),
    ("beam-search", "POST", COMPLETE, JSON, _json(prompt="Hi", use_beam_search=True), 400, "use_beam_search",
     "does not search beams"),
    ("gzip-body", "POST", COMPLETE, {**JSON, "Content-Encoding": "gzip"}, gzip.compress(_json(prompt="Hi")), 415,
     None, "unsupported Content-Encoding gzip; send the body uncompressed"),
    ("form-upload", "POST", COMPLETE, {**AUTH, "Content-Type": "multipart/form-data; boundary=x"}, b"--x--", 415,
     None, "send JSON"),
    ("ten-megabyte-body", "POST", COMPLETE, JSON, _json(prompt="a" * (10 * 2**20)), 413, None, "over 8388608 bytes"),
    ("wrong-key", "POST", COMPLETE, {"Authorization": "Bearer nope", "Content-Type": "application/json"},
     _json(prompt="Hi"), 401, None, "API key is wrong"),
    ("missing-key", "POST", COMPLETE, {"Content-Type": "application/json"}, _json(prompt="Hi"), 401, None,
     "needs an API key"),
    ("unknown-route", "GET", "/v1/engines", AUTH, b"", 404, None, "this server does not serve /v1/engines; it "
                                                                  "serves /v1/models, /v1/completions and"),
    ("route-outside-the-api", "GET", "/engines", AUTH, b"", 404, None, "no route /engines; the API lives under /v1"),
    ("stop-token-id-out-of-vocab", "POST", COMPLETE, JSON, _json(prompt="Hi", stop_token_ids=[99999999]), 400,
     "stop_token_ids", "stop token id 99999999 is outside the vocabulary (0..4095)"),
    ("unknown-model-retrieved", "GET", "/v1/models/gpt-4", AUTH, b"", 404, "model",
     "model \"gpt-4\" is not served here; this server serves \"demo\""),
    ("route-with-a-newline", "GET", "/v1/a%0Ab", AUTH, b"", 404, None, "does not serve /v1/a\\nb"),
    ("wrong-method", "GET", COMPLETE, AUTH, b"", 405, None, "GET is not allowed on /v1/completions"),
    # a path served by one route per method names every method it takes
    ("wrong-method-of-two", "DELETE", "/v1/strata/config", AUTH, b"", 405, None,
     "DELETE is not allowed on /v1/strata/config; use GET, POST"),
    # no redirect (it would have an empty body and point at the Host the client named): the path to use
    ("trailing-slash", "POST", CHAT + "/", JSON, _json(messages=HI), 404, None,
     "this server does not serve /v1/chat/completions/; send the request to /v1/chat/completions, without the "
     "trailing slash"),
    ("trailing-slash-health", "GET", "/health/", AUTH, b"", 404, None, "send the request to /health, without"),
    ("logit-bias-not-zero", "POST", CHAT, JSON, _json(messages=HI, logit_bias={"5": 1}), 400, "logit_bias",
     "logit_bias is not supported by this server"),
    # a logit_bias asking for nothing is still checked: keys are token ids, biases from -100 to 100
    ("logit-bias-key-not-a-token-id", "POST", CHAT, JSON, _json(messages=HI, logit_bias={"abc": 0}), 400,
     "logit_bias", "logit_bias key \"abc\" is not a token id of this model; keys are ids from 0 to 4095"),
    ("logit-bias-key-outside-the-vocabulary", "POST", COMPLETE, JSON, _json(prompt="Hi", logit_bias={"4096": 0}),
     400, "logit_bias", "logit_bias key \"4096\" is not a token id"),
    ("logit-bias-beyond-100", "POST", COMPLETE, JSON, _json(prompt="Hi", logit_bias={"5": 101}), 400, "logit_bias",
     "logit_bias[\"5\"] must be a number from -100 to 100 (got 101)"),
    ("logit-bias-not-an-object", "POST", CHAT, JSON, _json(messages=HI, logit_bias=[0]), 400, "logit_bias",
     "logit_bias must be an object of token ids and biases"),
    # max_completion_tokens wins, but the max_tokens it overrides is checked all the same
    ("overridden-max-tokens-negative", "POST", CHAT, JSON, _json(messages=HI, max_tokens=-1, max_completion_tokens=2),
     400, "max_tokens", "max_tokens must be a whole number >= 1 (got -1)"),
    ("metadata-a-number", "POST", CHAT, JSON, _json(messages=HI, metadata=5), 400, "metadata",
     "metadata must be an object of string values"),
    ("metadata-seventeen-keys", "POST", COMPLETE, JSON, _json(prompt="Hi", metadata={f"k{i}": "v" for i in range(17)}),
     400, "metadata", "metadata takes at most 16 keys (got 17)"),
    ("metadata-long-key", "POST", CHAT, JSON, _json(messages=HI, metadata={"k" * 65: "v"}), 400, "metadata",
     "has 65 characters; keys take at most 64"),
    ("metadata-value-not-a-string", "POST", CHAT, JSON, _json(messages=HI, metadata={"user": 7}), 400,
     "metadata.user", "metadata.user must be a string (got 7)"),
    ("metadata-long-value", "POST", CHAT, JSON, _json(messages=HI, metadata={"note": "x" * 513}), 400,
     "metadata.note", "metadata.note has 513 characters; values take at most 512"),
    # the fields that change nothing here are checked for OpenAI's types all the same
    ("user-not-a-string", "POST", CHAT, JSON, _json(messages=HI, user=5), 400, "user", "user must be a string (got 5)"),
    ("store-not-a-bool", "POST", CHAT, JSON, _json(messages=HI, store="yes"), 400, "store",
     'store must be true or false (got "yes")'),
    ("service-tier-not-a-string", "POST", COMPLETE, JSON, _json(prompt="Hi", service_tier=5), 400, "service_tier",
     "service_tier must be a string (got 5)"),
    ("prompt-cache-key-not-a-string", "POST", CHAT, JSON, _json(messages=HI, prompt_cache_key=[1]), 400,
     "prompt_cache_key", "prompt_cache_key must be a string (got [1])"),
    ("prompt-cache-retention-not-a-string", "POST", CHAT, JSON, _json(messages=HI, prompt_cache_retention=24), 400,
     "prompt_cache_retention", "prompt_cache_retention must be a string (got 24)"),
    ("safety-identifier-not-a-string", "POST", COMPLETE, JSON, _json(prompt="Hi", safety_identifier=True), 400,
     "safety_identifier", "safety_identifier must be a string (got true)"),
    ("prediction-not-an-object", "POST", CHAT, JSON, _json(messages=HI, prediction="text"), 400, "prediction",
     'prediction must be a JSON object (got "text")'),
    ("no-effect-fields-of-their-types", "POST", CHAT, JSON,
     _json(messages=HI, max_tokens=1, user="ana", store=False, service_tier="auto", prompt_cache_key="k",
           prompt_cache_retention="24h", safety_identifier="s", prediction={"type": "content", "content": "x"}),
     200, None, ""),
    ("tool-result-answering-no-call", "POST", CHAT, JSON,
     _json(messages=HI + [{"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]), 400,
     "messages[1].tool_call_id", "messages[1].tool_call_id \"call_9\" answers no call of an earlier assistant "
                                 "message (no earlier assistant message made a call)"),
    ("tool-result-answering-another-call", "POST", CHAT, JSON,
     _json(messages=HI + [{"role": "assistant", "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}]), 400,
     "messages[2].tool_call_id", "(the earlier calls are \"call_1\")"),
    ("trailing-slash-models", "GET", "/v1/models/", AUTH, b"", 404, None,
     "this server does not serve /v1/models/; send the request to /v1/models, without the trailing slash"),
    ("unknown-live-option", "POST", "/v1/strata/config", JSON, b'{"nope": 1}', 400, "nope", "nope: no such option"),
    ("option-that-needs-a-restart", "POST", "/v1/strata/config", JSON, b'{"dtype": "float32"}', 400, "dtype",
     "dtype cannot change while running"),
    ("live-option-wrong-type", "POST", "/v1/strata/config", JSON, b'{"max_batch": {"a": 1}}', 400, "max_batch",
     "max_batch must be an integer"),
    ("live-option-in-json-words", "POST", "/v1/strata/config", JSON, b'{"max_batch": "x"}', 400, "max_batch",
     '(got "x")'),
    ("live-option-set-in-json-words", "POST", "/v1/strata/config", JSON, b'{"expert_policy": null}', 400,
     "expert_policy", "expert_policy=null"),
    ("unknown-beside-a-good-option", "POST", "/v1/strata/config", JSON, b'{"max_batch": 4, "bogus": 2}', 400,
     "bogus", "bogus: no such option"),
]


@pytest.mark.parametrize("name,method,path,headers,body,status,param,words", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_request_gets_an_error_object_and_the_server_lives_on(http, url, name, method, path, headers,
                                                                        body, status, param, words):
    r = httpx.request(method, url + path, headers=headers, content=body, timeout=60)
    assert r.status_code == status, r.text[:300]
    if status != 200:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert words in error["message"] and "\n" not in error["message"]
        assert error["param"] == param
    good = http.post(COMPLETE, json={"model": "demo", "prompt": "Hi", "max_tokens": 2})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


# (field, a value of the wrong JSON type, how the message must spell it)
WRONG_TYPES = [("temperature", True, "true"), ("top_p", "0.5", '"0.5"'), ("top_k", "5", '"5"'), ("min_p", [0.1], "[0.1]"),
               ("repetition_penalty", False, "false"), ("seed", 1.5, "1.5"), ("max_tokens", True, "true"),
               ("n", "2", '"2"'), ("logprobs", True, "true"), ("ignore_eos", "yes", '"yes"'),
               ("include_stop_str_in_output", 1, "1"), ("stop", [None], "[null]"), ("stop_token_ids", ["1"], '["1"]'),
               ("stream", "yes", '"yes"'), ("echo", 0, "0")]


@pytest.mark.parametrize("field,value,spelt", WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_a_refused_value_is_spelt_as_json_spells_it(http, field, value, spelt):
    r = http.post(COMPLETE, json={"prompt": "Hi", "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and f"(got {spelt})" in error["message"], error["message"]


def test_the_neutral_value_of_an_unsupported_field_is_accepted(client):
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=2, modalities=["text"], functions=[],
                                       presence_penalty=0, logit_bias={}, extra_body={"min_tokens": 0, "echo": False})
    assert r.usage.completion_tokens >= 1
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=2, logit_bias={"5": 0, "7": 0.0})
    assert r.usage.completion_tokens >= 1                # a bias of 0 asks for nothing
    chunks = list(client.chat.completions.create(model="demo", messages=HI, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True, "include_obfuscation": False}))
    assert chunks[-1].usage.completion_tokens >= 1       # a field of the official client's, of no effect here
    c = client.completions.create(model="demo", prompt="Hi", max_tokens=2, best_of=1, suffix="", frequency_penalty=0)
    assert c.usage.completion_tokens >= 1


def test_the_key_may_also_come_as_x_api_key_and_health_needs_none(url):
    ok = httpx.post(url + COMPLETE, headers={"x-api-key": KEY}, json={"prompt": "Hi", "max_tokens": 1}, timeout=30)
    assert ok.status_code == 200
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    assert httpx.head(url + "/health", timeout=30).status_code == 200          # as load balancers ask
    bare = httpx.post(url + COMPLETE, headers={"Authorization": KEY}, json={"prompt": "Hi"}, timeout=30)
    assert bare.status_code == 401 and "is not \"Bearer KEY\"" in bare.json()["error"]["message"]   # no "Bearer "
    none = httpx.post(url + COMPLETE, json={"prompt": "Hi"}, timeout=30)
    assert none.status_code == 401 and none.json()["error"]["code"] == "missing_api_key"


def test_the_openai_client_raises_its_typed_errors(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="Hi")
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=HI, temperature=-1)
    assert err.value.body["message"].startswith("temperature must be a number >= 0 (got -1)")
    bad = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_the_openai_client_gets_typed_errors_for_a_body_that_is_not_a_json_object(client):
    # the client's own way to send any body (documented for endpoints it has no method for)
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/chat/completions", cast_to=object, body=HI)                 # a JSON array
    assert err.value.body == {"message": "the request body must be a JSON object (got a JSON array)",
                              "type": "invalid_request_error", "param": None, "code": "invalid_json"}
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/chat/completions", cast_to=object)                          # no body at all
    assert err.value.body["message"] == "the request body is empty; send a JSON object"
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="demo", messages=HI, max_tokens=1,
                                       extra_headers={"Content-Type": "text/xml"})
    assert err.value.status_code == 415 and err.value.body == {
        "message": "the body is text/xml; send JSON with Content-Type: application/json",
        "type": "invalid_request_error", "param": None, "code": "unsupported_media_type"}


@pytest.fixture
def strict(loop):
    """A second server on the same loop that lets nothing wait beyond the running batch."""
    srv = BackgroundServer(loop, ServerSettings(port=0, max_queued=0))
    srv.start()
    yield srv
    srv.stop()


def test_a_full_queue_is_a_503_with_retry_after(strict, loop, engine):
    batch = engine.config.max_batch
    body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "n": batch, "stream": True}
    with httpx.Client(base_url=strict.url, timeout=60) as c:
        with c.stream("POST", COMPLETE, json=body) as r:
            lines = r.iter_lines()                       # kept: dropping it would close the connection
            next(line for line in lines if line.startswith("data: {"))            # the batch is running
            busy = c.post(COMPLETE, json={"prompt": "Hi", "max_tokens": 2})
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
            assert busy.json()["error"]["code"] == "server_busy"
            too_many = c.post(COMPLETE, json={"prompt": "Hi", "max_tokens": 2, "n": batch + 1})
            assert too_many.status_code == 400 and "at most 16 at once" in too_many.json()["error"]["message"]
    engine_idle(loop)
    with httpx.Client(base_url=strict.url, timeout=60) as c:
        assert c.post(COMPLETE, json={"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_a_body_streamed_without_a_length_is_counted_and_refused_past_the_limit(url):
    def chunks():
        for _ in range(9):
            yield b" " * 2**20                             # 9 MiB of JSON whitespace, no Content-Length
    r = httpx.post(url + COMPLETE, headers=JSON, content=chunks(), timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_bug_behind_a_route_is_a_logged_500_error_object_and_the_server_lives_on(http, monkeypatch, caplog):
    from engine.server import routes

    def broken(engine):
        raise RuntimeError("a bug")
    monkeypatch.setattr(routes, "_live_state", broken)
    r = http.get("/v1/strata/config")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert any("unexpected error answering GET /v1/strata/config" in rec.getMessage() and rec.exc_info
               for rec in caplog.records)
    assert http.post(COMPLETE, json={"prompt": "Hi", "max_tokens": 1}).status_code == 200


# What the official client's create() takes (openai 3.60), each sent only when the caller gives it.
OFFICIAL_CHAT = ("audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
                 "max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model", "moderation", "n",
                 "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
                 "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
                 "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
                 "top_logprobs", "top_p", "user", "verbosity", "web_search_options")
OFFICIAL_COMPLETIONS = ("best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "model", "n",
                        "presence_penalty", "prompt", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                        "top_p", "user")


def test_every_field_of_the_official_client_is_a_known_one():
    from engine.server import chat, completions
    assert set(OFFICIAL_CHAT) <= chat.FIELDS and set(OFFICIAL_COMPLETIONS) <= completions.FIELDS


@pytest.mark.parametrize("path,field,hint", [
    (CHAT, "max_token", "did you mean max_tokens?"),
    (CHAT, "temprature", "did you mean temperature?"),
    (COMPLETE, "stop_sequences", "leave it out"),
    (COMPLETE, "top-p", "did you mean top_p?"),
    (CHAT, "tool_choise", "did you mean tool_choice?"),
])
def test_a_field_no_route_knows_is_refused_with_the_nearest_name(http, path, field, hint):
    body = {"messages": HI} if path == CHAT else {"prompt": "Hi"}
    r = http.post(path, json={**body, "max_tokens": 2, field: 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"] == "unknown_parameter"
    assert error["message"].startswith(f"{field} is not a field of {path} on this server; {hint}"), error["message"]


def test_the_openai_client_gets_its_typed_error_for_a_misspelt_extra(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=HI, max_tokens=2, extra_body={"top_kk": 5})
    assert "did you mean top_k?" in err.value.body["message"]
    r = client.chat.completions.create(model="demo", messages=HI, max_tokens=2, user="u1", store=False,
                                       prompt_cache_key="k", extra_body={"top_k": 5})
    assert r.usage.completion_tokens >= 1



def test_a_body_that_stops_arriving_is_answered_408_and_closed():
    # A client that sends part of its body and then nothing would hold its connection for good.
    import asyncio

    from engine.server.asgi import ReadBody

    sent: list[dict] = []
    reached = []

    async def app(scope, receive, send):
        reached.append(scope)

    async def receive():
        if not sent and not reached and not getattr(receive, "gave", False):
            receive.gave = True
            return {"type": "http.request", "body": b'{"prompt": ', "more_body": True}
        await asyncio.sleep(3600)                  # the rest never comes

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/completions", "headers": [(b"content-length", b"100")]}
    asyncio.run(asyncio.wait_for(ReadBody(app, limit=1 << 20, idle_s=0.2)(scope, receive, send), 10))
    assert not reached and sent[0]["status"] == 408
    assert b"stopped arriving" in b"".join(m.get("body", b"") for m in sent)


def test_a_declared_body_over_the_limit_is_refused_at_once(url):
    # Content-Length names the size before any byte of the body: the 413 does not wait for a body that
    # may never come (the 30 s body timeout)
    import socket
    from urllib.parse import urlsplit
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(f"POST {COMPLETE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 99999999\r\n\r\n".encode())
        head = sock.recv(4096).decode("latin-1")
    assert head.startswith("HTTP/1.1 413") and "over 8388608 bytes" in head, head
