"""Running the server: /health, /metrics, /v1/strata/stats and /config, the log lines, model switches,
a graceful stop, and the bind rules."""
from __future__ import annotations

import logging
import re
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ConfigError
from engine.gpu_monitor import FakeMonitor, GpuSample
from engine.loop import EngineLoop
from engine.server import BackgroundServer, ServerSettings, check_bind
from engine.server.logs import StatsLog
from engine.server.metrics import Latency, ServerMetrics
from http_helpers import DEMO, engine_idle, sse_events

ASK = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True}


def _metrics(http) -> dict[tuple[str, tuple], float]:
    text = http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_count_requests_and_tokens(http):
    before = _metrics(http)
    key = ("strata_http_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))
    r = http.post("/v1/completions", json=ASK).json()
    http.post("/v1/completions", json={**ASK, "temperature": -1})
    after = _metrics(http)
    assert after[key] - before.get(key, 0) == 1
    bad = ("strata_http_requests_total", (("endpoint", "/v1/completions"), ("status", "400")))
    assert after[bad] - before.get(bad, 0) == 1
    done = ("strata_completion_tokens_total", ())
    assert after[done] - before.get(done, 0) == r["usage"]["completion_tokens"] == 5
    ttft = ("strata_time_to_first_token_seconds_count", ())
    assert after[ttft] - before.get(ttft, 0) == 1
    gaps = ("strata_inter_token_latency_seconds_count", ())
    assert after[gaps] - before.get(gaps, 0) == 4                     # between 5 tokens
    for name in ("strata_requests_running", "strata_requests_queued", "strata_batch_size",
                 "strata_kv_blocks_used_ratio", "strata_expert_hit_rate", "strata_host_to_device_bytes_total"):
        assert (name, ()) in after, name
    assert not any(name.startswith("strata_gpu_") for name, _ in after)      # the CPU has no GPU to read


def test_the_batch_size_gauge_reads_0_when_nothing_runs(http, loop):
    assert http.post("/v1/completions", json={**ASK, "n": 3}).status_code == 200
    engine_idle(loop)
    assert loop.call(lambda e: e.stats().batch_size).result(60) > 0       # the engine keeps its last step's
    after = _metrics(http)
    assert after[("strata_requests_running", ())] == 0 and after[("strata_batch_size", ())] == 0


def test_stats_are_the_engine_stats_as_json(http):
    before = http.get("/v1/strata/stats").json()
    http.post("/v1/completions", json=ASK)
    after = http.get("/v1/strata/stats").json()
    assert after["generated_tokens"] - before["generated_tokens"] == 5
    assert after["model_name"] == "demo" and "hit_rate" not in after["experts"] and "hits" in after["experts"]
    assert after["kv_blocks_total"] > 0 and "memory" in after


def test_config_lists_live_options_applies_a_valid_change_and_refuses_with_the_engines_words(http, loop):
    options = http.get("/v1/strata/config").json()["options"]
    assert options["prefill_chunk"]["usable"] and options["prefill_chunk"]["value"] == 2048
    assert options["expert_pool_size"]["usable"]                # every expert resident, and the pool still live
    try:
        r = http.post("/v1/strata/config", json={"prefill_chunk": 64})
        assert r.status_code == 200 and r.json() == {"applied": {"prefill_chunk": "prefill_chunk = 64"}}
        assert loop.call(lambda e: e.scheduler.prefill_chunk).result(10) == 64
        assert http.post("/v1/completions", json=ASK).status_code == 200
    finally:
        http.post("/v1/strata/config", json={"prefill_chunk": 2048})
    refused = http.post("/v1/strata/config", json={"max_batch": 0})
    assert refused.status_code == 400
    assert refused.json()["error"] == {"message": "max_batch must be an integer >= 1 (got 0)",
                                       "type": "invalid_request_error", "param": "max_batch", "code": "invalid_option"}
    both = http.post("/v1/strata/config", json={"max_batch": 4, "prefetch_depth": "x"})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prefetch_depth"   # the one refused
    try:
        huge = http.post("/v1/strata/config", json={"max_batch": 100000})
        assert huge.status_code == 200
        assert re.fullmatch(r"max_batch = 100000 \(the KV cache has \d+ blocks of \d+ tokens, so at most \d+ "
                            r"sequences run at once, fewer the longer they are\)", huge.json()["applied"]["max_batch"])
    finally:
        http.post("/v1/strata/config", json={"max_batch": 16})
    try:
        half = http.post("/v1/strata/config", json={"expert_pool_size": "50%"})
        assert half.status_code == 200 and "expert pool:" in half.json()["applied"]["expert_pool_size"]
        assert half.json()["applied"]["expert_pool_size"].startswith("expert_pool_size = 50%; ")
        cold = http.post("/v1/strata/config", json={"cold_experts": "bus"})   # the answer names the new value
        assert cold.status_code == 200 and cold.json()["applied"]["cold_experts"].startswith("cold_experts = bus; ")
        assert http.post("/v1/completions", json=ASK).status_code == 200
        assert http.get("/v1/strata/stats").json()["experts"]["misses"] > 0
    finally:
        http.post("/v1/strata/config", json={"expert_pool_size": "100%", "cold_experts": "auto"})
    assert http.post("/v1/strata/config", json={}).status_code == 400


def test_config_accepts_an_option_sent_with_the_value_it_has_even_where_it_cannot_change(http):
    options = http.get("/v1/strata/config").json()["options"]
    assert options["cuda_graphs"] == {"value": False, "usable": False, "reason": options["cuda_graphs"]["reason"]}
    r = http.post("/v1/strata/config", json={"cuda_graphs": False})
    assert r.status_code == 200
    assert r.json() == {"applied": {"cuda_graphs": "cuda_graphs is already false; nothing to change"}}
    back = http.post("/v1/strata/config", json={k: v["value"] for k, v in options.items()})     # GET's values
    assert back.status_code == 200 and set(back.json()["applied"]) == set(options)
    assert http.get("/v1/strata/config").json()["options"] == options
    assert http.post("/v1/strata/config", json={"cuda_graphs": True}).status_code == 400
    assert http.post("/v1/strata/config", json={"cuda_graphs": 0}).status_code == 400       # false, not 0


def test_access_lines_and_stats_lines_are_logged(http, loop, caplog):
    caplog.set_level(logging.INFO, logger="strata.server")
    stats = StatsLog(loop, every=3)
    loop.add_tick(stats.tick)
    try:
        http.post("/v1/completions", json={**ASK, "max_tokens": 12})
        # the reply can reach the client before the tick of its last step runs; a call the loop takes
        # in a later iteration waits for that tick
        loop.call(lambda engine: None).result(timeout=60)
    finally:
        loop.remove_tick(stats.tick)
    access = r"POST /v1/completions 200 in=\d+ out=12 ttft=\d+\.\dms \d+\.\d tok/s finish=length"

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "strata.server"]

    # the access line is written once the server has sent the last byte, which the client may read first
    for _ in range(400):
        if any(re.fullmatch(access, line) for line in logged()):
            break
        time.sleep(0.05)
    lines = logged()
    assert any(re.fullmatch(access, line) for line in lines), lines
    stat = r"\[Stats\] step=\d+ throughput=\d+\.\d\d tok/s running=[01] queued=0 hit_rate=(\d\.\d{3}|-) bus=\d+\.\d\d GB/s"
    assert any(re.fullmatch(stat, line) for line in lines), lines
    assert len(stats.step_ms) >= 12


def test_a_stop_ends_streams_in_flight_frees_the_port_and_logs_a_summary(loop, caplog):
    caplog.set_level(logging.INFO, logger="strata.server")
    srv = BackgroundServer(loop, ServerSettings(port=0))
    url = srv.start()
    port = int(url.rsplit(":", 1)[1])
    with httpx.Client(base_url=url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={**ASK, "max_tokens": 400, "stream": True}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            assert srv.in_flight == 1
            stopper = threading.Thread(target=srv.stop, kwargs={"grace_s": 0.2})
            stopper.start()
            rest = sse_events(lines)
    stopper.join(30)
    assert first and rest[-1]["choices"][0]["finish_reason"] == "abort"      # ended properly, then [DONE]
    engine_idle(loop)
    with socket.socket() as s:                  # nothing listens there any more (a closed connection may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[Summary]")]
    assert summary and re.fullmatch(r"\[Summary\] requests=1 total_tokens=\d+ \(prompt=\d+ completion=\d+\) "
                                    r"avg_ttft=\d+\.\dms p50_step=(\d+\.\d\dms|-)", summary[-1]), summary


def test_a_stop_while_a_client_is_still_sending_its_body_is_quick_and_quiet(loop, caplog):
    # A request whose body never finishes arriving holds its connection open: the stop cancels it
    # after the grace (and the moment cancelled streams get to end), not after uvicorn's own timeout,
    # and logs no traceback for it.
    caplog.set_level(logging.INFO)
    srv = BackgroundServer(loop, ServerSettings(port=0))
    url = srv.start()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\"")
        deadline = time.monotonic() + 10
        while srv.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        srv.stop(grace_s=0.2)
        took = time.monotonic() - t0
    assert not srv.running and took < 5, took
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]


def test_without_a_model_health_is_503_and_a_loaded_model_is_served_then_dropped():
    lp = EngineLoop(None, idle_wait_s=0.01)
    lp.start_thread("switch-engine")
    srv = BackgroundServer(lp, ServerSettings(port=0, served_model_name="served"))
    url = srv.start()
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            assert c.get("/health").status_code == 503
            assert c.get("/v1/models").json()["data"] == []
            r = c.post("/v1/completions", json={"prompt": "Hi"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
            eng = LLMEngine(EngineConfig(model=str(DEMO), device="cpu"))
            lp.call(lambda _: lp.set_engine(eng)).result(10)
            assert c.get("/health").json() == {"status": "ok"}
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["served"]
            assert c.post("/v1/completions", json={"model": "served", "prompt": "Hi", "max_tokens": 2}).status_code == 200
            with c.stream("POST", "/v1/completions", json={**ASK, "model": "served", "max_tokens": 400,
                                                            "stream": True}) as r:
                lines = r.iter_lines()
                next(line for line in lines if line.startswith("data: {"))
                lp.call(lambda _: lp.drop_engine("the model was unloaded")).result(10).close()
                error = sse_events(lines)[-1]["error"]
            assert error["message"] == "the model was unloaded; retry" and error["code"] == "model_not_loaded"
            assert c.get("/health").status_code == 503
    finally:
        srv.stop()
        lp.stop()
        lp.join(10)


def test_default_bind_is_loopback_and_an_open_bind_needs_a_key():
    assert ServerSettings().host == "127.0.0.1"
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        check_bind(host, None, False)
    with pytest.raises(ConfigError) as err:
        check_bind("0.0.0.0", None, False)
    assert str(err.value) == ("refusing to serve on 0.0.0.0 without an API key; give --api-key KEY (or STRATA_API_KEY), "
                              "or --no-api-key to serve it open")
    with pytest.raises(ConfigError):
        check_bind("my-host.example", None, False)
    check_bind("0.0.0.0", "secret", False)
    check_bind("0.0.0.0", None, True)


def test_background_server_refuses_an_open_bind_without_a_key(loop):
    with pytest.raises(ConfigError, match="refusing to serve on 0.0.0.0"):
        BackgroundServer(loop, ServerSettings(host="0.0.0.0", port=0)).start()


@pytest.mark.parametrize("settings,words", [({"port": 70000}, "port must be a whole number from 0 to 65535"),
                                            ({"api_key": " "}, "the API key is empty"),
                                            ({"max_queued": -1}, "max_queued must be a whole number >= 0")])
def test_bad_settings_are_refused_with_one_line(settings, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        ServerSettings(**settings)


def _samples(metrics: ServerMetrics) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(metrics.render().decode())
            for s in family.samples}


def test_gpu_series_come_from_nvml_readings_and_a_missing_reading_is_absent_not_zero():
    reading = GpuSample(timestamp=0.0, name="Fake GPU", gpu_temp_c=61.0, mem_temp_c=None, power_w=250.5)
    metrics = ServerMetrics(monitor_factory=lambda: FakeMonitor(reading))
    metrics.sample_gpu("cuda:0")
    got = _samples(metrics)
    assert got["strata_gpu_temperature_celsius"] == 61.0 and got["strata_gpu_power_watts"] == 250.5
    assert "strata_gpu_memory_temperature_celsius" not in got
    metrics.sample_gpu("cpu")
    assert not any(name.startswith("strata_gpu_") for name in _samples(metrics))
    absent = ServerMetrics(monitor_factory=lambda: FakeMonitor(GpuSample(timestamp=0.0, available=False)))
    absent.sample_gpu("cuda:0")
    assert not any(name.startswith("strata_gpu_") for name in _samples(absent))


def test_latency_buckets_count_each_value_under_every_bound_it_does_not_exceed():
    h = Latency("t_seconds", "t", (0.01, 0.1, 1.0))
    for v in (0.005, 0.01, 0.05, 2.0):
        h.observe(v)
    buckets = {s.labels["le"]: s.value for s in h.family().samples if s.name == "t_seconds_bucket"}
    assert buckets == {"0.01": 2, "0.1": 3, "1.0": 3, "+Inf": 4}
    assert next(s.value for s in h.family().samples if s.name == "t_seconds_sum") == pytest.approx(2.065)


def test_metrics_of_a_pipeline_have_a_series_per_card():
    from engine.telemetry import EngineStats, ExpertStats, MemoryStats, StageStats
    stages = (StageStats(0, "cuda:0", 0, 12, ExpertStats(hits=90, misses=10, h2d_bytes=1000),
                         MemoryStats(resident_bytes=5, expert_pool_bytes=6, kv_cache_bytes=7, workspace_bytes=8)),
              StageStats(1, "cuda:1", 12, 24, ExpertStats(hits=60, misses=40, h2d_bytes=4000), MemoryStats()))
    m = ServerMetrics(monitor_factory=FakeMonitor)
    m.update(EngineStats(stages=stages, experts=ExpertStats(hits=150, misses=50, h2d_bytes=5000)))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(m.render().decode()) for s in family.samples}
    assert got[("strata_card_expert_hit_rate", (("card", "0"), ("layers", "0-11")))] == 0.9
    assert got[("strata_card_expert_hit_rate", (("card", "1"), ("layers", "12-23")))] == 0.6
    assert got[("strata_card_host_to_device_bytes_total", (("card", "1"), ("layers", "12-23")))] == 4000
    assert got[("strata_card_memory_bytes", (("card", "0"), ("layers", "0-11"), ("use", "kv_cache")))] == 7
    assert got[("strata_expert_hit_rate", ())] == 0.75
    one = ServerMetrics(monitor_factory=FakeMonitor)
    one.update(EngineStats())
    assert b"strata_card_" not in one.render()
