"""The streamed response's own path: its body past the middleware chain, a client that hangs up, and what
a streamed request still reports (headers, access line, histograms)."""
from __future__ import annotations

import asyncio
import json
import logging
import re

import httpx
import pytest

from engine.loop import EngineLoop
from engine.server.asgi import SERVER_SEND
from engine.server.engine_client import EngineClient, Stream
from engine.server.metrics import Latency
from engine.server.settings import ServerSettings
from engine.server.sse import EventStream
from http_helpers import KEY, sse_events


async def _chunks():
    yield "data: é\n\n"
    yield b""
    yield b"data: [DONE]\n\n"


def _serve(scope: dict) -> tuple[list[dict], list[dict]]:
    """(messages the chain's send got, messages the server's own send got) for one EventStream."""
    chain, server = [], []

    async def chain_send(message: dict) -> None:
        chain.append(message)

    async def server_send(message: dict) -> None:
        server.append(message)
    if scope.pop("with_server_send", False):
        scope[SERVER_SEND] = server_send
    asyncio.run(EventStream(_chunks())(scope, None, chain_send))
    return chain, server


def test_the_start_goes_through_the_chain_and_the_body_straight_to_the_server():
    chain, server = _serve({"type": "http", "with_server_send": True})
    assert [m["type"] for m in chain] == ["http.response.start"]
    assert chain[0]["status"] == 200
    headers = dict(chain[0]["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-cache" and b"content-length" not in headers
    # str chunks go as UTF-8, empty ones not at all, and the end closes the body
    assert [m["body"] for m in server] == ["data: é\n\n".encode(), b"data: [DONE]\n\n", b""]
    assert [m["more_body"] for m in server] == [True, True, False]


def test_without_the_servers_send_everything_goes_through_the_chain():
    chain, server = _serve({"type": "http"})
    assert server == []
    assert [m["type"] for m in chain] == ["http.response.start"] + ["http.response.body"] * 3


def test_a_stream_whose_client_hung_up_stops_waiting_at_once():
    async def run() -> tuple[list, bool]:
        client = EngineClient(EngineLoop(), ServerSettings())
        stream = Stream(client, ["r1", "r2"], lambda: None)
        waiting = asyncio.ensure_future(stream.batch())
        await asyncio.sleep(0)
        assert not waiting.done() and not stream.done
        stream.hang_up()
        return await asyncio.wait_for(waiting, 5), stream.done
    assert asyncio.run(run()) == ([], True)


def test_a_histogram_takes_several_equal_observations_at_once():
    h = Latency("x", "doc", (0.001, 0.01))
    h.observe(0.004, 3)
    h.observe(0.0005)
    assert h.counts == [1, 3, 0] and abs(h.sum - 0.0125) < 1e-12


def test_a_served_stream_keeps_its_headers_access_line_and_inter_token_counts(url, caplog):
    caplog.set_level(logging.INFO, logger="strata.server")
    body = {"prompt": "Once upon a time", "max_tokens": 9, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        gaps0 = _inter_token_count(c)
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
            assert r.headers["x-accel-buffering"] == "no" and r.headers["transfer-encoding"] == "chunked"
            lines = list(r.iter_lines())
        events = sse_events(lines)
        assert [line for line in lines if line][-1] == "data: [DONE]"
        assert events[-1]["usage"]["completion_tokens"] == 9
        assert _inter_token_count(c) - gaps0 == 8          # every token after the first, however they were grouped
    access = r"POST /v1/completions 200 in=\d+ out=9 ttft=\d+\.\dms \d+\.\d tok/s finish=length"
    assert any(re.fullmatch(access, r.getMessage()) for r in caplog.records if r.name == "strata.server")


def _inter_token_count(c: httpx.Client) -> float:
    text = c.get("/metrics").text
    return float(re.search(r"^strata_inter_token_latency_seconds_count (\S+)$", text, re.M).group(1))


def test_sse_events_are_json_objects_of_the_openai_shape(url):
    body = {"prompt": [11, 12, 13], "max_tokens": 4, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            raw = b"".join(r.iter_bytes())
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(e[6:]) for e in events[:-2]]
    assert all(set(ch) == {"id", "object", "created", "model", "choices"} for ch in chunks)
    assert [ch["choices"][0]["finish_reason"] for ch in chunks][-1] == "length"


def _events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        with c.stream("POST", path, json={**body, "max_tokens": 3, "ignore_eos": True, "stream": True}) as r:
            return sse_events(r.iter_lines())


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                                       ("/v1/completions", {"prompt": "Hi"})], ids=["chat", "completions"])
def test_with_include_usage_every_chunk_before_the_usage_one_says_usage_null(url, path, body):
    events = _events(url, path, {**body, "stream_options": {"include_usage": True}})
    assert len(events) >= 3 and events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert all("usage" not in e for e in _events(url, path, body))          # not asked for: no usage field at all
