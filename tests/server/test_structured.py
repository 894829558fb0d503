"""response_format as a guide: text is free, json_object is any JSON object, json_schema follows its
schema; anything malformed is refused with one line naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.errors import ConfigError
from engine.guided import Guide
from engine.server.structured import FieldError, closed_objects, guide_for

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
# bounded fields: a model writes into an unbounded string until max_tokens
VERSE = {"type": "object",
         "properties": {"book": {"type": "string", "maxLength": 12},
                        "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
                        "mood": {"enum": ["joy", "fear", "hope"]}},
         "required": ["book", "chapter", "mood"], "additionalProperties": False}


def json_schema(**spec) -> dict:
    return {"type": "json_schema", "json_schema": spec}


def follows_verse(value: object) -> bool:
    """``value`` is valid against VERSE (a validator for exactly the keywords VERSE uses)."""
    if not isinstance(value, dict) or set(value) != {"book", "chapter", "mood"}:
        return False
    return (isinstance(value["book"], str) and len(value["book"]) <= 12 and type(value["chapter"]) is int
            and 1 <= value["chapter"] <= 150 and value["mood"] in ("joy", "fear", "hope"))


def test_text_or_nothing_leaves_the_output_free():
    assert guide_for(None) is None
    assert guide_for({"type": "text"}) is None


def test_json_object_is_any_json_object():
    assert guide_for({"type": "json_object"}) == Guide("json", "", source="response_format")


def test_json_schema_carries_the_schema_itself():
    guide = guide_for(json_schema(name="verse", schema=VERSE, strict=True))
    assert guide.kind == "json" and json.loads(guide.spec) == VERSE
    assert guide.source == "response_format.json_schema"


@pytest.mark.parametrize("spec", [{"name": "verse"}, {"name": "verse", "schema": None, "strict": None},
                                  {"schema": VERSE, "strict": False}, {"schema": VERSE, "description": "a verse"}])
def test_optional_json_schema_fields_may_be_left_out(spec):
    guide = guide_for(json_schema(**spec))
    assert guide.kind == "json" and guide.spec == ("" if spec.get("schema") is None else json.dumps(VERSE))


@pytest.mark.parametrize("response_format,param,message", [
    ("json_object", "response_format",
     "response_format must be an object such as {\"type\": \"json_object\"} (got a string)"),
    ({"type": "json"}, "response_format.type",
     "response_format.type must be \"text\", \"json_object\" or \"json_schema\" (got \"json\")"),
    ({}, "response_format.type", "(got null)"),
    ({"type": "json_schema"}, "response_format.json_schema",
     "response_format.json_schema must be an object such as {\"name\": \"answer\", \"schema\""),
    ({"type": "json_schema", "json_schema": [VERSE]}, "response_format.json_schema", "(got a list)"),
    (json_schema(name="verse", schema=[VERSE]), "response_format.json_schema.schema",
     "response_format.json_schema.schema must be a JSON object (got a list); send the JSON schema itself"),
    (json_schema(name="verse", schema=json.dumps(VERSE)), "response_format.json_schema.schema",
     "response_format.json_schema.schema must be a JSON object (got a string)"),
    (json_schema(name=7, schema=VERSE), "response_format.json_schema.name",
     "response_format.json_schema.name must be a string (got a number)"),
    (json_schema(description=["x"], schema=VERSE), "response_format.json_schema.description",
     "must be a string (got a list)"),
    (json_schema(name="verse", schema=VERSE, strict="yes"), "response_format.json_schema.strict",
     "response_format.json_schema.strict must be true or false (got a string)"),
    (json_schema(name="verse", schema={"type": "objekt"}), "response_format.json_schema.schema",
     "response_format.json_schema.schema cannot be enforced (Invalid type: objekt); fix or remove that part"),
    (json_schema(schema={"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
     "response_format.json_schema.schema", "cannot be enforced (Pointer '/$defs/missing' does not exist)"),
    (json_schema(schema={"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}),
     "response_format.json_schema.schema", "cannot be enforced (regex parse error:"),
    (json_schema(schema={"type": "integer", "minimum": 10 ** 30}), "response_format.json_schema.schema",
     "cannot be enforced (it holds the integer 100000000000... (31 digits), past the 64 bits a schema's numbers "
     "may take; use a smaller bound)"),
])
def test_a_malformed_response_format_names_its_field(response_format, param, message):
    with pytest.raises(FieldError) as err:
        guide_for(response_format)
    assert isinstance(err.value, ConfigError) and err.value.param == param
    assert message in str(err.value)
    assert "\n" not in str(err.value)                 # one line, even for the grammar library's excerpts


@pytest.fixture(scope="module")
def llm():
    with LLM(str(DEMO), device="cpu") as model:
        yield model


def test_the_engine_output_under_a_json_schema_parses_and_follows_it(llm):
    guide = guide_for(json_schema(name="verse", schema=VERSE, strict=True))
    for prompt in ("And God said", "The LORD is my shepherd"):
        out = llm.generate(prompt, SamplingParams(guide=guide, temperature=0, max_tokens=80))[0]
        assert out.finish_reason == "stop", out.text
        assert follows_verse(json.loads(out.text)), out.text


def test_objects_with_properties_take_no_extra_keys_unless_the_schema_says_so():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                                               "c": {"type": "array", "items": {"properties": {"d": {}}}},
                                               "open": {"type": "object"}},
              "$defs": {"x": {"properties": {"y": {}}, "additionalProperties": True}}}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["open"]      # any object stays any object
    assert closed["$defs"]["x"]["additionalProperties"] is True            # the schema's own rule is kept
    assert "additionalProperties" not in schema                            # the client's schema is not changed
    guide = guide_for({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    assert json.loads(guide.spec)["additionalProperties"] is False
