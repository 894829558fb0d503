"""Request bodies: JSON parsed strictly, and fields read with one-line refusals that name the field.

The endpoints read their bodies here rather than through pydantic models, so every refusal is one
sentence in the engine's own wording (sampling fields go through ``SamplingParams``, whose checks
name the field, the value and the fix).
"""
from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

from engine.server.errors import APIError, printable

MAX_DEPTH = 64            # deeper bodies are refused before anything walks them recursively
_JSON_TYPES = ("application/json", "text/plain", "application/x-www-form-urlencoded")


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


class _Overlong:
    """An integer with more digits than Python reads (``sys.get_int_max_str_digits()``), kept in place of
    the number so that the refusal can name its field."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


class _Huge:
    """A number past a 64-bit float's range (``1e400``), kept in place of the infinity Python reads it as,
    so that the refusal can name its field."""

    def __init__(self, text: str) -> None:
        self.text = text


def _parse_float(text: str) -> float | _Huge:
    value = float(text)
    return _Huge(text) if math.isinf(value) else value


def _parse_int(text: str) -> int | _Overlong:
    try:
        return int(text)
    except ValueError:
        return _Overlong(len(text.lstrip("-")))


def parse_json_object(raw: bytes, content_type: str | None, content_encoding: str | None = None) -> dict:
    """The body as a JSON object, or a 400/415 APIError saying what is wrong with it.

    Accepts the media types clients send JSON with (``curl -d`` says form-urlencoded). Refuses a
    compressed body (415, not a confusing "not UTF-8"), NaN and Infinity (not JSON), text that is not
    UTF-8, lone surrogates (which no tokenizer can encode), and nesting deeper than MAX_DEPTH.
    """
    encoding = (content_encoding or "").strip().lower()
    if encoding not in ("", "identity"):
        raise APIError(415, f"unsupported Content-Encoding {printable(encoding)}; send the body uncompressed",
                       code="unsupported_media_type")
    media = (content_type or "").split(";")[0].strip().lower()
    if media and media not in _JSON_TYPES and not media.endswith("+json"):
        raise APIError(415, f"the body is {media}; send JSON with Content-Type: application/json",
                       code="unsupported_media_type")
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        body = json.loads(raw, parse_constant=_no_constants, parse_int=_parse_int, parse_float=_parse_float)
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text; send JSON encoded as UTF-8", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, f"the request body nests deeper than {MAX_DEPTH} levels; send it with fewer levels of "
                            "objects and arrays (a deep JSON schema can define a part once in $defs and point to it "
                            "with $ref)", code="invalid_json") from None
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc}); send a JSON object",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object (got a JSON {_json_kind(body)})",
                       code="invalid_json")
    _check_tree(body)
    return body


def _check_tree(body: dict) -> None:
    """Depth, string and integer check without recursion (a deep body must not exhaust the stack)."""
    stack: list[tuple[Any, int, str]] = [(body, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            field = path.split(".")[0].split("[")[0]
            raise APIError(400, f"the request body nests deeper than {MAX_DEPTH} levels (in {field}); send "
                                f"{field} with fewer levels of objects and arrays", code="invalid_json", param=field)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str):
                _check_text(key)
            if isinstance(value, str):
                _check_text(value)
            elif isinstance(value, (dict, list, _Overlong, _Huge)):
                where = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}" if path else key
                if isinstance(value, _Overlong):
                    raise bad(where, f"{where}: the number has {value.digits} digits, more than any field takes; "
                                     "send an integer below 2**63")
                if isinstance(value, _Huge):
                    raise bad(where, f"{where}: {value.text[:40]} is beyond the range of a 64-bit float; send a "
                                     "number below 1e308")
                stack.append((value, depth + 1, where))


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, "the request body holds a lone UTF-16 surrogate escape (such as \\ud800), which is "
                            "not text; send valid Unicode", code="invalid_json") from None


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float, _Overlong, _Huge)) else type(value).__name__)


def show(value: object, limit: int = 60) -> str:
    """A request's value for an error message, spelt as JSON spells it (true, null, "5"), cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):          # not a JSON value (a caller's own object)
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def bad(name: str | None, message: str, code: str | None = None) -> APIError:
    """A 400 about the field ``name`` (None: the request as a whole)."""
    return APIError(400, message, param=name, code=code)


def is_whole(value: object) -> bool:
    """A JSON integer (not true or false, which Python counts as integers)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class Fields:
    """Typed reads of one JSON object's fields; an absent field or JSON null gives the default."""

    def __init__(self, body: Mapping[str, Any], prefix: str = "") -> None:
        self.body = body
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def given(self, key: str) -> bool:
        return self.body.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.body.get(key)
        return default if value is None else value

    def whole(self, key: str, default: int | None, lo: int, hi: int | None = None, hint: str = "") -> int | None:
        value = self.body.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo or (hi is not None and value > hi):
            span = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
            raise bad(self.name(key), f"{self.name(key)} must be a whole number {span} (got {show(value)})"
                      + (f"; {hint}" if hint else ""))
        return int(value)

    def number(self, key: str, default: float | None) -> float | None:
        value = self.body.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise bad(self.name(key), f"{self.name(key)} must be a number (got {show(value)})")
        try:
            number = float(value)                # an integer of 400 digits does not fit a double
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):            # JSON has no Infinity, but 1e999 parses as one
            raise bad(self.name(key), f"{self.name(key)} must be a finite number (got one beyond the "
                                      "largest a double holds)")
        return number

    def flag(self, key: str, default: bool) -> bool:
        value = self.body.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad(self.name(key), f"{self.name(key)} must be true or false (got {show(value)})")
        return value

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.body.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise bad(self.name(key), f"{self.name(key)} must be a string (got {show(value)})")
        return value

    def obj(self, key: str) -> dict | None:
        value = self.body.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise bad(self.name(key), f"{self.name(key)} must be a JSON object (got {show(value)})")
        return value

    def array(self, key: str) -> list | None:
        value = self.body.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise bad(self.name(key), f"{self.name(key)} must be a list (got {show(value)})")
        return value

    def unsupported(self, key: str, neutral: tuple, hint: str) -> None:
        """Refuse a field the engine does not implement unless it has its neutral value."""
        value = self.body.get(key)
        # a neutral value of the same JSON type only: false is not 0, nor true 1
        if value is not None and not any(value == n and isinstance(value, bool) == isinstance(n, bool)
                                         for n in neutral):
            raise bad(key, f"{key} is not supported by this server (got {show(value)}); {hint}",
                      code="unsupported_parameter")
