"""Many clients at once, and clients that go away: each stream gets exactly its own tokens, in order,
and a client that disconnects leaves the engine with nothing running and every KV block free."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import httpx
import openai

from http_helpers import KEY, engine_idle

PROMPTS = ["Once upon a time", "The king said", "In the morning", "The sea"]
LONGEST = 19          # the 32 streams ask for 4 to 19 tokens
LONG = 400            # tokens a cancelled request would have made had it run to the end


def _closed_count(http, endpoint: str) -> float:
    """strata_http_requests_total for ``endpoint`` with status 499 (client closed request)."""
    prefix = f'strata_http_requests_total{{endpoint="{endpoint}",status="499"}} '
    return next((float(line[len(prefix):]) for line in http.get("/metrics").text.splitlines()
                 if line.startswith(prefix)), 0.0)


def _wait_for_access_line(caplog, pattern: str, timeout: float = 20.0) -> str:
    """The access line matching ``pattern`` (written once the server has wound the request up; bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if r.name == "strata.server"]
        found = next((line for line in lines if re.fullmatch(pattern, line)), None)
        if found is not None:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no access line matches {pattern!r}: {lines}")


def test_32_concurrent_streams_each_get_exactly_their_tokens_as_if_alone(url, client, engine):
    alone = {}
    for p in PROMPTS:                 # greedy: a shorter reply is a prefix of the longest one
        r = client.completions.create(model="demo", prompt=p, max_tokens=LONGEST, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        alone[p] = r.choices[0].model_extra["token_ids"]
    jobs = [(PROMPTS[i % len(PROMPTS)], 4 + i % (LONGEST - 3)) for i in range(32)]      # 16 lengths

    async def one(aclient: openai.AsyncOpenAI, prompt: str, n: int) -> tuple[list[int], str, int]:
        ids, text, usage = [], [], None
        stream = await aclient.completions.create(
            model="demo", prompt=prompt, max_tokens=n, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "return_token_ids": True})
        async for chunk in stream:
            for c in chunk.choices:
                ids += c.model_extra.get("token_ids", [])
                text.append(c.text)
            usage = chunk.usage or usage
        return ids, "".join(text), usage.completion_tokens

    async def run_all():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120) as aclient:
            return await asyncio.gather(*(one(aclient, p, n) for p, n in jobs))

    results = asyncio.run(run_all())
    for (prompt, n), (ids, text, used) in zip(jobs, results):
        assert ids == alone[prompt][:n], (prompt, n)
        assert text == engine.tokenizer.decode(ids) and used == n


def test_a_client_that_disconnects_mid_stream_is_cancelled_and_its_blocks_freed(url, loop, http, caplog):
    caplog.set_level(logging.INFO, logger="strata.server")
    closed = _closed_count(http, "/v1/completions")
    before = engine_idle(loop)["generated"]
    body = {"prompt": "Once upon a time", "max_tokens": LONG, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            events = (json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {"))
            got = [next(events) for _ in range(3)]                # three chunks, then hang up
            assert all(g["choices"] for g in got)
    after = engine_idle(loop)
    assert after["running"] == after["waiting"] == after["kv_blocks_used"] == 0
    assert after["generated"] - before < LONG // 2       # it was stopped, not run to its end
    # logged and counted as a request the client closed (499), not as a 200 that ended normally
    _wait_for_access_line(caplog, r"POST /v1/completions 499 in=\d+ out=\d+ ttft=\S+ \S+ tok/s finish=cancelled")
    assert _closed_count(http, "/v1/completions") == closed + 1


def test_a_non_streaming_client_that_gives_up_is_cancelled_too(url, loop, http, caplog):
    caplog.set_level(logging.INFO, logger="strata.server")
    closed = _closed_count(http, "/v1/chat/completions")
    before = engine_idle(loop)["generated"]
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": LONG, "ignore_eos": True}
    try:
        httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=0.3)
    except httpx.TimeoutException:
        pass
    after = engine_idle(loop)
    assert after["running"] == after["waiting"] == after["kv_blocks_used"] == 0
    assert after["generated"] - before < LONG // 2
    _wait_for_access_line(caplog, r"POST /v1/chat/completions 499 in=\d+ out=\d+ ttft=\S+ \S+ tok/s finish=cancelled")
    assert _closed_count(http, "/v1/chat/completions") == closed + 1
