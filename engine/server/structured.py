"""Structured output: an OpenAI ``response_format`` as the grammar guide the engine enforces.

``{"type": "text"}`` (or no response_format) leaves the output free; ``{"type": "json_object"}`` makes
it any JSON object; ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` makes it a
JSON value that follows ``schema`` (without a schema: any JSON object). The schema is enforced whatever
``strict`` says: masking the logits costs the same either way, and output that misses the schema helps
no one.
"""
from __future__ import annotations

import json

import llguidance

from engine.errors import ConfigError
from engine.guided import Guide
from engine.server import refused
from engine.server.fields import bad, show
from engine.server.schema_refs import endless_ref

_TYPES = ("text", "json_object", "json_schema")
# the fields of each response_format type, and of a json_schema (OpenAI's)
_FORMAT_FIELDS = {"text": frozenset({"type"}), "json_object": frozenset({"type"}),
                  "json_schema": frozenset({"type", "json_schema"})}
_JSON_SCHEMA_FIELDS = frozenset({"name", "description", "schema", "strict"})


class FieldError(ConfigError):
    """A request field that is malformed; ``param`` is its path (``response_format.json_schema.schema``),
    ``code`` the error's code (``unknown_parameter`` for a field of no name the object has)."""

    def __init__(self, param: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def refuse_unknown(obj: dict, known: frozenset[str], what: str, where: str) -> None:
    """FieldError (code ``unknown_parameter``) naming the first field of ``obj``, the object at ``where``,
    that ``what`` (``a tool``) does not have, with the closest name it has: a misspelt field is never ignored."""
    found = refused.unknown_field(obj, known, what, f"{where}.")
    if found is not None:
        raise FieldError(*found, code="unknown_parameter")


def kind_of(value: object) -> str:
    """How a JSON value is named in messages: 'an object', 'a list', 'a string', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _huge_number(value: object) -> int | None:
    """The first integer in ``value`` (a parsed schema) past 64 bits, which the grammar library cannot hold."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if not -2 ** 63 <= value < 2 ** 64 else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((n for n in map(_huge_number, items) if n is not None), None)


def schema_problem(schema: dict) -> str | None:
    """Why the grammar library cannot enforce ``schema`` (one line), or None when it can."""
    huge = _huge_number(schema)
    if huge is not None:
        digits = str(huge)
        shown = digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} digits)"
        return f"it holds the integer {shown}, past the 64 bits a schema's numbers may take; use a smaller bound"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:      # a value JSON cannot hold (NaN)
        return " ".join(str(exc).split())
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        return " ".join(messages[0].split())
    ref = endless_ref(schema)      # the library takes such a schema, and fails on it later
    return None if ref is None else f"a $ref cycle with no finite instance: {ref} can only be built from itself"


_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_ONE = ("items", "additionalItems", "not", "if", "then", "else", "contains")


def closed_objects(schema: object) -> object:
    """``schema`` with ``additionalProperties: false`` on every object with properties that does not say otherwise.

    A schema that leaves extra keys open lets a model go on writing made-up keys until max_tokens; what
    a client that sends a schema wants back is its keys (as OpenAI's strict mode and other engines read
    it). An object that names ``additionalProperties`` keeps its own rule. Returns a new schema.
    """
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_objects(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS or key in _SUBSCHEMA_ONE or key == "additionalProperties":
            out[key] = closed_objects(value)
        else:
            out[key] = value
    # an object that lists no properties ({"type": "object"}) means any object, and stays open
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def guide_for(response_format: object) -> Guide | None:
    """The guide that enforces ``response_format``, or None when the output is free text.

    Raises FieldError (a ConfigError) naming the field (``response_format.json_schema.schema``, ...)
    for anything malformed, with the shape the field needs.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise FieldError("response_format", "response_format must be an object such as {\"type\": "
                         f"\"json_object\"}} (got {kind_of(response_format)})")
    kind = response_format.get("type")
    if kind not in _TYPES:
        raise FieldError("response_format.type", "response_format.type must be \"text\", \"json_object\" or "
                         f"\"json_schema\" (got {show(kind)})")
    for key in ("json_schema", "schema"):     # "schema" beside json_object: how some other servers take one
        if kind == "json_object" and key in response_format:
            raise FieldError(f"response_format.{key}", f"response_format.{key} is not a field of a json_object "
                             "response_format; send {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., "
                             "\"schema\": ...}} to make the reply follow the schema, or leave it out",
                             code="unknown_parameter")
    refuse_unknown(response_format, _FORMAT_FIELDS[kind], f"a {kind} response_format", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json", "", source="response_format")
    return Guide("json", _schema_text(response_format.get("json_schema")), source="response_format.json_schema")


def read_guide(response_format: object) -> Guide | None:
    """:func:`guide_for` on a request's field: a malformed one is a 400 naming its part."""
    try:
        return guide_for(response_format)
    except FieldError as exc:
        raise bad(exc.param, str(exc), exc.code) from None


def _schema_text(spec: object) -> str:
    """The schema of a ``json_schema`` response_format, checked, as text ("" = any JSON object)."""
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise FieldError(where, f"{where} must be an object such as {{\"name\": \"answer\", \"schema\": "
                                f"{{\"type\": \"object\", ...}}}} (got {kind_of(spec)})")
    refuse_unknown(spec, _JSON_SCHEMA_FIELDS, "a json_schema", where)
    for key in ("name", "description"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise FieldError(f"{where}.{key}", f"{where}.{key} must be a string (got {kind_of(spec[key])})")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise FieldError(f"{where}.strict", f"{where}.strict must be true or false "
                                            f"(got {kind_of(spec['strict'])})")
    schema = spec.get("schema")
    if schema is None:
        return ""
    if not isinstance(schema, dict):
        raise FieldError(f"{where}.schema", f"{where}.schema must be a JSON object (got {kind_of(schema)}); "
                         "send the JSON schema itself, e.g. {\"type\": \"object\", \"properties\": {...}}")
    schema = closed_objects(schema)
    problem = schema_problem(schema)
    if problem is not None:
        raise FieldError(f"{where}.schema", f"{where}.schema cannot be enforced ({problem}); fix or remove "
                                            "that part of the schema")
    return json.dumps(schema)
