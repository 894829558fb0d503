"""A gpt-oss checkpoint whose tokenizer lacks the harmony format's special tokens (a tokenizer swapped for
another, or a converted folder that lost them): a ``reasoning_effort`` is refused naming that cause and the
fix, not with "only for gpt-oss", which contradicts the model being gpt-oss."""
from __future__ import annotations

import httpx
import pytest
from http_helpers import KEY, TIMEOUT

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.loop import EngineLoop
from engine.server import BackgroundServer, ServerSettings
from tiny_models import build_tiny_model

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("gpt_oss") / "m", "gpt_oss")   # a plain tiny tokenizer
    eng = LLMEngine(EngineConfig(model=str(folder), device="cpu"))
    assert eng.tokenizer.harmony is None and eng.tokenizer.has_chat_template
    loop = EngineLoop(eng, idle_wait_s=0.01)
    loop.start_thread("gpt-oss-engine")
    srv = BackgroundServer(loop, ServerSettings(port=0, api_key=KEY))
    srv.start()
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT) as client:
        yield client
    srv.stop()
    loop.stop()
    loop.join(30)
    eng.close()


def test_reasoning_effort_on_gpt_oss_without_harmony_tokens_names_the_tokenizer(http):
    r = http.post("/v1/chat/completions", json={"model": "m", "messages": HI, "reasoning_effort": "low",
                                                "max_tokens": 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "reasoning_effort" and error["code"] == "unsupported_parameter"
    assert error["message"] == ("this gpt-oss checkpoint's tokenizer lacks the harmony format's special tokens "
                                "(<|channel|>, <|message|>, ...), so its prompt takes no reasoning_effort; leave it "
                                "out, or serve the model with the tokenizer files it was released with")


def test_the_same_request_without_reasoning_effort_is_answered(http):
    r = http.post("/v1/chat/completions", json={"model": "m", "messages": HI, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
