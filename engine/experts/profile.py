"""Routing profiles: per MoE layer, how many tokens each expert received.

Recorded by the engine (``--record-routing FILE``) from ``ExpertStats.activations`` and read back
by the static placement policy. Format (JSON)::

    {"format": "strata-routing-profile", "version": 1,
     "num_layers": L, "num_experts": E, "counts": [[c_00, ..., c_0E-1], ...]}
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from engine.errors import ConfigError

FORMAT = "strata-routing-profile"
VERSION = 1


def write_routing_profile(path: str | Path, counts: Sequence[Sequence[int]]) -> None:
    """Write ``counts [L][E]`` (routed-token counts) as a routing profile."""
    rows = [[int(c) for c in row] for row in counts]
    num_experts = len(rows[0]) if rows else 0
    if any(len(r) != num_experts for r in rows):
        raise ValueError("every layer of a routing profile needs the same number of experts")
    doc = {"format": FORMAT, "version": VERSION, "num_layers": len(rows), "num_experts": num_experts,
           "counts": rows}
    Path(path).write_text(json.dumps(doc))


def read_routing_profile(path: str | Path, num_layers: int, num_experts: int) -> list[list[int]]:
    """Read a profile and check it matches the model (``[L][E]`` non-negative counts)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read routing profile {path} ({err.strerror}); "
                          "record one with --record-routing FILE") from None
    except ValueError:
        raise ConfigError(f"routing profile {path} is not valid JSON; record it again with --record-routing FILE") from None
    return check_routing_profile(doc, num_layers, num_experts, str(path))


def check_routing_profile(doc: object, num_layers: int, num_experts: int, name: str = "routing profile"
                          ) -> list[list[int]]:
    """Validate a parsed profile document; returns its counts."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{name} is not a Strata routing profile; record one with --record-routing FILE")
    counts = doc.get("counts")
    shape_ok = (isinstance(counts, list) and len(counts) == num_layers
                and all(isinstance(r, list) and len(r) == num_experts for r in counts))
    if not shape_ok:
        raise ConfigError(
            f"{name} was recorded for {doc.get('num_layers')} layers x {doc.get('num_experts')} experts, "
            f"but the model has {num_layers} x {num_experts}; record a profile with this model")
    if not all(isinstance(c, int) and c >= 0 for r in counts for c in r):
        raise ConfigError(f"{name} holds counts that are not non-negative integers; record it again")
    return counts
