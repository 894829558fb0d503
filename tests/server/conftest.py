"""A real server for the HTTP tests: the bundled demo model on the CPU, its EngineLoop on a thread, and
uvicorn on 127.0.0.1 at a free port, reached with the official ``openai`` client."""
from __future__ import annotations

import httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.loop import EngineLoop
from engine.server import BackgroundServer, ServerSettings
from http_helpers import DEMO, KEY, TIMEOUT


@pytest.fixture(scope="session")
def engine():
    eng = LLMEngine(EngineConfig(model=str(DEMO), device="cpu"))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def loop(engine):
    lp = EngineLoop(engine, idle_wait_s=0.01)
    lp.start_thread("test-engine")
    yield lp
    lp.stop()
    lp.join(30)


@pytest.fixture(scope="session")
def server(loop):
    srv = BackgroundServer(loop, ServerSettings(port=0, api_key=KEY))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="session")
def http(url):
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT) as c:
        yield c
