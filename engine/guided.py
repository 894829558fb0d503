"""Constrained decoding: output that must follow a grammar (a JSON schema, a regular expression, Lark)."""
from __future__ import annotations

from dataclasses import dataclass

GUIDE_KINDS = ("json", "regex", "lark")


@dataclass(frozen=True)
class Guide:
    """What the output must match. ``kind`` "json": ``spec`` is a JSON schema as text ("" = any JSON
    object); "regex": a regular expression; "lark": a Lark grammar (llguidance's dialect)."""

    kind: str
    spec: str = ""
