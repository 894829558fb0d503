"""A JSON schema whose $ref cycle has no finite instance is refused before it runs, naming the schema's field
and the ref, in plain words; what slips past that check still fails in plain words naming the field, never with
the grammar library's internal names (NoExtensionBias, "Too many items")."""
from __future__ import annotations

import json

import pytest

from engine.errors import ConfigError
from engine.guided import Guide, plain
from engine.sampling import SamplingParams
from engine.server.schema_refs import endless_ref
from engine.server.structured import FieldError
from engine.server.tools import plan_tools
from engine.tokenizer import Tokenizer
from http_helpers import sse_events
from tests.engine.tokenizer_fixtures import build_tiny_tokenizer
from tiny_models import TOOLS_CHAT_TEMPLATE

NODE = {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}
ENDLESS = {"$defs": {"n": NODE}, "$ref": "#/$defs/n"}                # each node must hold another
SELF = {"$defs": {"n": {"$ref": "#/$defs/m"}, "m": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}    # refs only


@pytest.mark.parametrize("schema,ref", [
    (ENDLESS, "#/$defs/n"),
    (SELF, "#/$defs/n"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "#"),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "#"),                 # a first item is required
    ({"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1}, "#"),
    ({"anyOf": [{"$ref": "#"}]}, "#"),
    ({"allOf": [{"$ref": "#"}, {"type": "object"}]}, "#"),
    ({"$defs": {"n": {**NODE, "$anchor": "node", "properties": {"c": {"$ref": "#node"}}}}, "$ref": "#node"}, "#node"),
    # two definitions that require each other
    ({"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                "b": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
     "#/$defs/a"),
], ids=["required-field", "refs-only", "root", "array-item", "prefix-item", "any-of-itself", "all-of", "anchor",
        "mutual"])
def test_a_schema_that_can_only_be_built_from_itself_is_found(schema, ref):
    assert endless_ref(schema) == ref


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"c": {"$ref": "#"}}},                          # c may be left out
    {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
     "required": ["v", "kids"]},                                                    # a tree: kids may be []
    {"$defs": {"n": {**NODE, "properties": {"c": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}}},
     "$ref": "#/$defs/n"},                                                          # a list ending in null
    {"$defs": {"n": {**NODE, "type": ["object", "null"]}}, "$ref": "#/$defs/n"},
    {"type": "string", "$defs": {"n": {"$ref": "#/$defs/n"}}},                      # a cycle nothing uses
    {"properties": {"c": {"$ref": "#"}}, "required": ["c"]},                        # no type: a number will do
    {"$defs": {"n": {**NODE, "enum": [{"c": 1}]}}, "$ref": "#/$defs/n"},
    {"$ref": "https://example.com/schema.json"},                                    # not a local ref
], ids=["optional", "tree", "linked-list", "nullable", "unused", "untyped", "enum", "remote"])
def test_a_recursive_schema_with_a_finite_instance_is_left_alone(schema):
    assert endless_ref(schema) is None


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/completions", {"prompt": "Hi"}),
])
@pytest.mark.parametrize("schema", [ENDLESS, SELF], ids=["required-field", "refs-only"])
def test_an_endless_schema_is_refused_before_it_runs_naming_its_field(http, path, body, schema):
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = http.post(path, json={**body, "max_tokens": 8, "response_format": fmt})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert error["message"] == ("response_format.json_schema.schema cannot be enforced (a $ref cycle with no finite "
                                "instance: #/$defs/n can only be built from itself); fix or remove that part of the "
                                "schema")


def test_a_forced_call_of_a_tool_with_an_endless_schema_names_its_parameters(tmp_path):
    build_tiny_tokenizer(tmp_path, vocab_size=512, chat_template=TOOLS_CHAT_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}]
    with pytest.raises(FieldError) as err:
        plan_tools(tools, "required", Tokenizer.from_dir(tmp_path))
    assert err.value.param == "tools[0].function.parameters"
    assert "a $ref cycle with no finite instance" in str(err.value)
    assert plan_tools(tools, "auto", Tokenizer.from_dir(tmp_path)).guide is None      # auto enforces nothing


def test_the_engine_words_a_schema_made_of_refs_alone_plainly(engine):
    guide = Guide("json", json.dumps(SELF), source="response_format.json_schema")
    with pytest.raises(ConfigError) as err:
        engine.validate_request("Hi", SamplingParams(guide=guide))
    message = str(err.value)
    assert message == ("response_format.json_schema's JSON schema is invalid: it has no finite instance (a $ref cycle "
                       "never reaches a value); fix the schema")
    assert err.value.source == "response_format.json_schema"


def test_the_parsers_item_limit_is_named_in_plain_words():
    reason = "parser error: Too many items (limit 50000; ff_tokens); try avoiding single-byte/short lexemes"
    assert plain(reason, "json") == ("the grammar grew past its parser's limit of 50000 items (a $ref cycle with no "
                                     "finite instance does this)")
    assert plain("some other reason", "json") == "some other reason"


# The check takes no account of minProperties: this object must hold c, which must hold another, without end.
# The grammar library takes it and fails on the reply's first token.
UNCHECKED = {"type": "object", "properties": {"c": {"$ref": "#"}}, "minProperties": 1, "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_a_guide_that_fails_mid_reply_names_its_field_in_plain_words(http, stream):
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": UNCHECKED}}})
    error = sse_events(r.text.splitlines())[-1]["error"] if stream else r.json()["error"]
    assert error["param"] == "response_format.json_schema" and error["code"] == "generation_failed"
    assert error["message"].startswith("the output could not follow its guide: the grammar grew past its parser's "
                                       "limit of")
    assert "Too many items" not in error["message"]
