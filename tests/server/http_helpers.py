"""Helpers of the HTTP tests (beside conftest.py's fixtures)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.loop import EngineLoop
from engine.server import BackgroundServer, ServerSettings

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
KEY = "test-key"
TIMEOUT = 60.0


def engine_idle(loop: EngineLoop, timeout: float = 20.0) -> dict:
    """Poll the loop until the engine runs and holds nothing (bounded, generous); the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        state = loop.call(lambda e: {"running": len(e.scheduler.running), "waiting": len(e.scheduler.waiting),
                                     "kv_blocks_used": e.loaded.allocator.num_used,
                                     "generated": e.stats().generated_tokens}).result(TIMEOUT)
        if not (state["running"] or state["waiting"] or state["kv_blocks_used"]) or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def sse_events(lines) -> list[dict]:
    """The JSON events of a server-sent event stream's lines, up to [DONE]."""
    out = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        out.append(json.loads(line[6:]))
    return out


def serving(folder: Path):
    """A server over an engine of ``folder`` on the CPU: yields (server, tokenizer), then stops both."""
    eng = LLMEngine(EngineConfig(model=str(folder), device="cpu"))
    loop = EngineLoop(eng, idle_wait_s=0.01)
    loop.start_thread(f"{folder.name}-engine")
    srv = BackgroundServer(loop, ServerSettings(port=0, api_key=KEY))
    srv.start()
    yield srv, eng.tokenizer
    srv.stop()
    loop.stop()
    loop.join(30)
    eng.close()
