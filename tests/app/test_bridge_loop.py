"""The bridge runs the shared engine loop: the window's replies and another front end's jobs (the local
server's) run on one engine, show in its stats, and live through its model switches and its bugs."""
from __future__ import annotations

import queue

from engine.loop import Job
from engine.sampling import SamplingParams

from app.messages import GenerationSettings
from app.paths import default_model_dir
from tests.app.conftest import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS
from tests.app.received import Received

TIMEOUT = 30_000
DEMO = str(default_model_dir())


def _greedy(window, max_tokens: int) -> None:
    window.chat_pane.settings_box.set_settings(GenerationSettings(temperature=0.0, top_p=1.0, top_k=0,
                                                                  max_tokens=max_tokens))


def _job(window, rid: str, max_tokens: int) -> queue.Queue:
    """Submit a job straight to the bridge's loop, as the HTTP server does; its deltas land in the queue."""
    out: queue.Queue = queue.Queue()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    window.bridge.engine_loop.submit(Job(rid, "And the earth was", params, out.put)).result(10)
    return out


def _deltas(qtbot, out: queue.Queue) -> list:
    got: list = []

    def finished() -> bool:
        while not out.empty():
            got.append(out.get_nowait())
        return bool(got) and got[-1].finished
    qtbot.waitUntil(finished, timeout=REPLY_TIMEOUT_MS)
    return got


def test_window_replies_and_direct_jobs_run_together_on_one_engine(window, qtbot):
    loop = window.bridge.engine_loop
    stats = Received(window.bridge.stats)
    finished_before = stats.wait(qtbot).requests_finished
    together = [0]
    loop.add_tick(lambda: together.__setitem__(0, max(together[0], loop.in_flight())))   # on the loop thread
    _greedy(window, 40)
    out = _job(window, "direct-1", 40)
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        window.chat.send("In the beginning")
    deltas = _deltas(qtbot, out)
    assert done.args[0].completion_tokens > 0 and done.args[0].error is None
    assert deltas[-1].finish_reason == "length" and sum(len(d.new_token_ids) for d in deltas) == 40
    assert together[0] == 2                          # both were in the engine at once
    # the window's stats are the shared engine's: they count the job it never sent
    stats.wait(qtbot, lambda s: s.requests_finished >= finished_before + 2)
    assert loop.in_flight() == 0


def test_a_model_switch_ends_direct_jobs_and_the_loop_serves_the_new_model(window, qtbot):
    loop = window.bridge.engine_loop
    old = loop.call(lambda engine: engine).result(10)
    out = _job(window, "long", window.model.context_tokens // 2)
    qtbot.waitUntil(lambda: not out.empty(), timeout=REPLY_TIMEOUT_MS)          # it runs
    window.bridge.pause("held for the switch")        # ... and cannot finish first (the load queues after it)
    with qtbot.waitSignal(window.model_ready, timeout=LOAD_TIMEOUT_MS):
        window.open_model(DEMO)
    final = _deltas(qtbot, out)[-1]
    assert final.finish_reason == "error" and final.error == "the model was changed to demo"
    assert loop.call(lambda engine: engine).result(10) is not old
    window.bridge.resume("switched")
    after = _deltas(qtbot, _job(window, "after", 6))
    assert after[-1].finish_reason == "length" and sum(len(d.new_token_ids) for d in after) == 6


def test_a_reply_cut_short_by_a_model_switch_reads_stopped_not_failed(window, qtbot):
    # The chat's reply in flight when another model is opened ends as "closed": its line says it was
    # stopped and why, not that it failed; what it said so far stays.
    _greedy(window, 4000)
    with qtbot.waitSignal(window.chat.reply_done, timeout=LOAD_TIMEOUT_MS) as done:
        window.chat.send("In the beginning")
        qtbot.waitUntil(lambda: window.chat.live is not None and bool(window.chat.live.bubble.text),
                        timeout=REPLY_TIMEOUT_MS)
        window.bridge.pause("held for the switch")
        window.open_model(DEMO)
    stats = done.args[0]
    assert stats.finish_reason == "closed" and stats.error == "the model was changed to demo"
    assert stats.finish_words() == "stopped: the model was changed to demo"
    reply = window.chat.current.messages[-1]
    assert reply.content and "stopped: the model was changed to demo" in reply.stats
    window.bridge.resume("switched")


def _break_next_step(engine) -> None:
    """The engine's next step raises, as a bug would; the one after works again."""
    real = engine.step

    def broken():
        engine.step = real
        raise RuntimeError("a bug in the step")
    engine.step = broken


def test_a_bug_in_a_step_is_an_internal_banner_and_every_request_ends(window, qtbot):
    _greedy(window, 30)
    errors: list = []
    window.bridge.error.connect(errors.append)
    window.bridge.pause("both requests go into the broken step")
    out = _job(window, "direct-bug", 30)
    context = Received(window.bridge.context)
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        window.chat.send("In the beginning")
        context.wait(qtbot)                             # the reply is in the engine, waiting
        window.bridge.engine_loop.call(_break_next_step).result(10)
        window.bridge.resume("go")
    job_end = _deltas(qtbot, out)[-1]
    qtbot.waitUntil(lambda: bool(errors), timeout=TIMEOUT)
    assert [(e.source, e.message) for e in errors] == [("internal", "internal error: a bug in the step")]
    assert window.banners.level("engine") == "red"
    assert done.args[0].finish_reason == "error" and "a bug in the step" in done.args[0].error
    assert job_end.finish_reason == "error" and "a bug in the step" in job_end.error
    # the loop lives on: the next reply streams
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as again:
        window.chat.send("And God said")
    assert again.args[0].error is None and again.args[0].completion_tokens > 0


def test_the_load_tests_http_prompt_has_exactly_the_tokens_asked_for(window):
    ids = window.bridge.synthetic_prompt_ids(37)
    assert len(ids) == 37 and all(isinstance(i, int) for i in ids)
