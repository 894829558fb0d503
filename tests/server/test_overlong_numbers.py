"""Integers too long for Python to read (more than ``sys.get_int_max_str_digits()`` digits, 4300 by default):
a 400 naming the field and saying the number is too large, never advice about the server's Python."""
from __future__ import annotations

import json

import pytest

from http_helpers import KEY

JSON = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
HUGE = "1" + "0" * 4999                    # 5000 digits
HI = '[{"role": "user", "content": "Hi"}]'


def _error(http, path: str, body: str) -> dict:
    r = http.post(path, content=body.encode(), headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "set_int_max_str_digits" not in error["message"] and "Exceeds the limit" not in error["message"]
    return error


@pytest.mark.parametrize("path,body,param,digits", [
    ("/v1/completions", f'{{"model": "demo", "prompt": "Hi", "max_tokens": {HUGE}}}', "max_tokens", 5000),
    ("/v1/completions", f'{{"model": "demo", "prompt": "Hi", "seed": -{HUGE}}}', "seed", 5000),
    ("/v1/completions", f'{{"model": "demo", "prompt": [[1, {HUGE}]]}}', "prompt[0][1]", 5000),
    ("/v1/chat/completions", f'{{"model": "demo", "messages": {HI}, "max_completion_tokens": {HUGE}0}}',
     "max_completion_tokens", 5001),
    ("/v1/chat/completions", f'{{"model": "demo", "messages": {HI}, "response_format": {{"type": "json_schema", '
                             f'"json_schema": {{"name": "n", "schema": {{"type": "integer", "maximum": {HUGE}}}}}}}}}',
     "response_format.json_schema.schema.maximum", 5000),
], ids=["max_tokens", "negative-seed", "token-id", "chat", "nested"])
def test_an_overlong_integer_is_a_400_naming_its_field(http, path, body, param, digits):
    error = _error(http, path, body)
    assert error["param"] == param
    assert error["message"] == (f"{param}: the number has {digits} digits, more than any field takes; send an "
                                "integer below 2**63")


def test_an_overlong_integer_in_tool_call_arguments_names_the_arguments(http):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": ' + HUGE + "}"}}
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    error = _error(http, "/v1/chat/completions", json.dumps({"model": "demo", "messages": messages}))
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    assert "is not valid JSON (an integer with more digits than any argument takes)" in error["message"]


def test_a_long_integer_python_reads_is_still_checked_by_its_field(http):
    error = _error(http, "/v1/completions", f'{{"model": "demo", "prompt": "Hi", "max_tokens": 1{"0" * 99}}}')
    assert error["param"] == "max_tokens" and error["message"].endswith("lower max_tokens to at most 510")
    r = http.post("/v1/completions", json={"model": "demo", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200                       # the server answers a good request right after


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"model": "demo", "prompt": "Hi", "temperature": 1e400}', "temperature"),
    ("/v1/chat/completions", f'{{"model": "demo", "messages": {HI}, "response_format": {{"type": "json_schema", '
                             '"json_schema": {"name": "n", "schema": {"type": "number", "maximum": -1e999}}}}',
     "response_format.json_schema.schema.maximum"),
], ids=["sampling", "schema"])
def test_a_number_past_a_float_s_range_is_a_400_naming_its_field_not_infinity(http, path, body, param):
    error = _error(http, path, body)
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: ") and "beyond the range of a 64-bit float" in error["message"]


def test_a_body_nested_too_deeply_names_the_field_that_nests(http):
    schema: dict = {"type": "object"}
    for _ in range(80):
        schema = {"type": "object", "properties": {"x": schema}}
    body = json.dumps({"model": "demo", "messages": json.loads(HI),
                       "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    error = _error(http, "/v1/chat/completions", body)
    assert error["param"] == "response_format"
    assert "nests deeper than 64 levels (in response_format)" in error["message"]
