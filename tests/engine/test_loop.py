"""The shared engine loop: jobs, sinks, cancellation between steps, calls and refusals."""
from __future__ import annotations

import queue

import pytest

from engine import SamplingParams
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ConfigError, StrataError
from engine.loop import EngineLoop, Job
from tiny_models import build_tiny_model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = LLMEngine(EngineConfig(model=str(build_tiny_model(tmp_path_factory.mktemp("loop") / "m")), device="cpu"))
    yield eng
    eng.close()


@pytest.fixture
def loop(engine):
    lp = EngineLoop(engine, idle_wait_s=0.01)
    lp.start_thread()
    yield lp
    lp.stop()
    lp.join(10)


def _collect(out: queue.Queue, timeout: float = 30.0) -> list:
    got = []
    while not (got and got[-1].finished):
        got.append(out.get(timeout=timeout))
    return got


def test_jobs_stream_their_own_tokens_and_match_a_direct_run(loop, engine):
    outs = {rid: queue.Queue() for rid in ("a", "b")}
    prompts = {"a": [1, 5, 9], "b": [2, 3]}
    for rid, q in outs.items():
        loop.submit(Job(rid, prompts[rid], GREEDY, q.put)).result(10)
    streamed = {rid: [t for d in _collect(q) for t in d.new_token_ids] for rid, q in outs.items()}
    alone = loop.call(lambda e: _alone(e, prompts["a"])).result(30)
    assert streamed["a"] == alone
    assert len(streamed["b"]) == GREEDY.max_tokens
    assert loop.in_flight() == 0


def _alone(engine, prompt):
    engine.add_request("solo", prompt, GREEDY)
    ids = []
    while engine.has_unfinished():
        for d in engine.step():
            ids += d.new_token_ids
    return ids


def test_a_refused_job_resolves_to_its_error_and_is_never_queued(loop):
    sink_calls = []
    fut = loop.submit(Job("bad", [], GREEDY, sink_calls.append))
    with pytest.raises(ConfigError, match="prompt is empty"):
        fut.result(10)
    assert loop.call(lambda e: e.has_unfinished()).result(10) is False
    assert sink_calls == []


def test_cancel_ends_the_request_before_the_next_step(loop):
    out = queue.Queue()
    long = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)
    loop.submit(Job("long", [1, 2, 3], long, out.put)).result(10)
    out.get(timeout=30)                     # it is running
    loop.cancel("long")
    final = _collect(out)[-1]
    assert final.finish_reason == "abort"
    # the call runs after the cancel and before any further step: nothing is left in the engine
    assert loop.call(lambda e: (e.has_unfinished(), e.scheduler.running)).result(10) == (False, [])


def test_a_failing_sink_ends_only_its_request(loop):
    def broken(_):
        raise RuntimeError("front end bug")
    good = queue.Queue()
    loop.submit(Job("broken", [1, 2], GREEDY, broken)).result(10)
    loop.submit(Job("good", [1, 2], GREEDY, good.put)).result(10)
    assert _collect(good)[-1].finish_reason == "length"
    assert loop.call(lambda e: e.has_unfinished()).result(10) is False


def test_a_stopped_loop_refuses_what_was_still_queued(engine):
    lp = EngineLoop(engine)
    lp.stop()
    fut = lp.submit(Job("late", [1], GREEDY, lambda d: None))
    lp.run()
    with pytest.raises(StrataError, match="stopped"):
        fut.result(1)


def test_offering_the_gil_lets_a_waiting_thread_run_and_returns_without_sleeping(monkeypatch):
    # The loops that wait on the GPU or run steps back to back offer the GIL through a zero-timeout
    # select (engine/gil.py): a thread that needs the GIL gets it while the caller keeps offering, and
    # the offer never goes through time.sleep (a sleep of the timer slack, 50-120 us, on Linux).
    import sys
    import threading
    import time

    from engine.gil import offer_gil

    if sys.platform != "win32":
        monkeypatch.setattr(time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("slept")))
    ran = threading.Event()
    worker = threading.Thread(target=ran.set)
    worker.start()
    for _ in range(10_000_000):
        if ran.is_set():
            break
        offer_gil()
    worker.join(30)
    assert ran.is_set()
