"""``BenchRun``: one run of a workload, in-process or against a server."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.bench.metrics import RequestRecord, Summary
from engine.bench.workload import Workload

if TYPE_CHECKING:
    from engine.bench.engine_side import EngineFigures


@dataclass(frozen=True)
class BenchRun:
    """What a run targeted, what was sent, and what came back."""

    target: str                      # "in-process", or the server's base URL
    model: str
    workload: Workload
    summary: Summary
    records: tuple[RequestRecord, ...]
    engine: "EngineFigures | None" = None     # in-process runs only: what the engine measured
    device: str | None = None                 # in-process runs only
    engine_config: dict | None = None         # in-process runs only: the EngineConfig as resolved at load
