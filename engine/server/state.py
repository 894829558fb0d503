"""What one app's handlers share: the settings, the engine link, the metrics and the logs."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from starlette.requests import Request

from engine.server.asgi import RECORD, AccessRecord, Counts
from engine.server.engine_client import EngineClient
from engine.server.fields import parse_json_object
from engine.server.logs import StatsLog
from engine.server.metrics import ServerMetrics
from engine.server.settings import ServerSettings


@dataclass
class ServerState:
    settings: ServerSettings
    client: EngineClient
    metrics: ServerMetrics
    counts: Counts
    stats_log: StatsLog


def state_of(request: Request) -> ServerState:
    return request.app.state.strata


def record_of(request: Request) -> AccessRecord:
    """The access record the outermost middleware made (a fresh one when the app runs without it)."""
    return request.scope.setdefault(RECORD, AccessRecord(time.perf_counter()))


async def json_body(request: Request) -> dict:
    return parse_json_object(await request.body(), request.headers.get("content-type"),
                             request.headers.get("content-encoding"))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def created() -> int:
    return int(time.time())
