"""Routing profiles: per MoE layer, how many tokens each expert received.

Recorded by the engine (``--record-routing FILE``) from ``ExpertStats.activations`` and read back
by the static placement policy. Format (JSON)::

    {"format": "strata-routing-profile", "version": 1,
     "num_layers": L, "num_experts": E, "counts": [[c_00, ..., c_0E-1], ...]}

Both paths are checked when the model loads: a profile to read must exist and fit the model, a
profile to record must have a writable place, so nothing is found wrong only when the engine closes.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

from engine.errors import ConfigError
from engine.file_modes import as_new_file

FORMAT = "strata-routing-profile"
VERSION = 1
_RECORD = "record one with --record-routing FILE"


def check_record_target(path: str | Path) -> None:
    """Refuse a ``--record-routing`` path the profile could not be written to when the engine closes."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"--record-routing {path} is a folder; give a file path such as {p / 'routing.json'}")
    folder = p.parent
    if not folder.exists():
        raise ConfigError(f"--record-routing {path}: the folder {folder} does not exist; create it first or "
                          "record to a file in an existing folder")
    if not folder.is_dir():
        raise ConfigError(f"--record-routing {path}: {folder} is a file, not a folder; record to a file in a folder")
    if p.exists() and not (p.is_file() and os.access(p, os.W_OK)):
        raise ConfigError(f"--record-routing {path} exists and cannot be overwritten; record to another file")
    if p.exists() and not _is_profile(p):
        raise ConfigError(f"--record-routing {path} exists and is not a routing profile, so it is kept; record to "
                          "a new file (an earlier profile may be recorded over)")
    try:                       # a real write tells what permissions, ACLs and read-only mounts allow
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".strata-probe-"):
            pass
    except OSError as err:
        raise ConfigError(f"--record-routing {path}: cannot write into {folder} ({err.strerror}); record to a "
                          "folder you can write to") from None


def _is_profile(p: Path) -> bool:
    """Whether ``p`` holds a profile Strata wrote (the only kind of file a recording may replace)."""
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def write_routing_profile(path: str | Path, counts: Sequence[Sequence[int]]) -> None:
    """Write ``counts [L][E]`` (routed-token counts) as a routing profile, atomically (an older file at
    ``path`` stays whole until the new one is complete)."""
    rows = [[int(c) for c in row] for row in counts]
    num_experts = len(rows[0]) if rows else 0
    if any(len(r) != num_experts for r in rows):
        raise ValueError("every layer of a routing profile needs the same number of experts")
    doc = {"format": FORMAT, "version": VERSION, "num_layers": len(rows), "num_experts": num_experts,
           "counts": rows}
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(doc))
                f.flush()
                os.fsync(f.fileno())
            as_new_file(tmp)                      # the user's file: not a temporary file's private mode
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise ConfigError(f"could not write the routing profile to {path} ({err.strerror}); the folder changed "
                          "while the engine ran — record again to a writable file") from None


def read_routing_profile(path: str | Path, num_layers: int, num_experts: int) -> list[list[int]]:
    """Read a profile and check it matches the model (``[L][E]`` non-negative counts)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read --routing-profile {path} ({err.strerror}); give an existing profile file, "
                          f"or {_RECORD}") from None
    except ValueError:
        raise ConfigError(f"--routing-profile {path} is not valid JSON; {_RECORD} again") from None
    return check_routing_profile(doc, num_layers, num_experts, f"--routing-profile {path}")


def check_routing_profile(doc: object, num_layers: int, num_experts: int, name: str = "routing profile"
                          ) -> list[list[int]]:
    """Validate a parsed profile document; returns its counts."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{name} is not a Strata routing profile; {_RECORD}")
    if doc.get("version", VERSION) != VERSION:
        raise ConfigError(f"{name} has format version {doc.get('version')!r}, this Strata reads version {VERSION}; "
                          f"{_RECORD} with this version")
    counts = doc.get("counts")
    shape_ok = (isinstance(counts, list) and len(counts) == num_layers
                and all(isinstance(r, list) and len(r) == num_experts for r in counts))
    if not shape_ok:
        raise ConfigError(
            f"{name} was recorded for {doc.get('num_layers')} layers x {doc.get('num_experts')} experts, "
            f"but the model has {num_layers} x {num_experts}; record a profile with this model")
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for r in counts for c in r):
        raise ConfigError(f"{name} holds counts that are not non-negative integers; {_RECORD} again")
    return counts
