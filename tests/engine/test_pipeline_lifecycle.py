"""A pipeline's stages from start to end: a stage process that ends before it joins fails the load at
once with one line, an engine collected without close() stops its stages, and a live change either
reaches every stage or none (a stopped pipeline refuses it)."""
from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from engine import LLM
from engine.checkpoint.spec import read_spec
from engine.config import EngineConfig
from engine.errors import PipelineError, ReconfigureError
from engine.parallel.load import stage_configs
from engine.parallel.pipeline import Pipeline
from engine.parallel.plan import plan_pipeline
from parallel_helpers import GREEDY, OPTIONS, PROMPTS, alive, children, gone
from tiny_models import build_tiny_model

# a stage process that runs the real worker, except on ``rank``, which says why on stderr and exits
# (before joining, or once it marked itself in the store: while the others join the process group)
FAKE_WORKER = """
import sys
from datetime import timedelta
from multiprocessing.connection import Connection

import torch.distributed as dist

from engine.parallel import worker

conn = Connection(int(sys.argv[1]))
start = conn.recv()
if start["rank"] == {rank}:
    if {joins}:
        store = dist.TCPStore("127.0.0.1", start["store"], start["world"], is_master=False,
                              timeout=timedelta(seconds=60))
        store.set("joined/{rank}", "1")
    print("CUDA error: no CUDA-capable device is detected", file=sys.stderr, flush=True)
    sys.exit(3)
worker.run(conn, start)
"""


# a stage process that runs the real worker, except that on ``rank`` it sends itself ``signal`` when it
# is told to warm up its links (SIGKILL: it dies there; SIGSTOP: it hangs there)
WARM_UP_WORKER = """
import os
import signal
import sys
from multiprocessing.connection import Connection

from engine.parallel import worker


class StageConn(Connection):
    signalled = False

    def recv(self):
        msg = super().recv()
        if self.signalled and msg[0] == "warm_up":
            os.kill(os.getpid(), signal.{signal})
        return msg


conn = StageConn(int(sys.argv[1]))
start = conn.recv()
conn.signalled = start["rank"] == {rank}
worker.run(conn, start)
"""


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("pp-life-mixtral"), "mixtral")


def _pipeline(folder, stages: int, **kwargs) -> Pipeline:
    spec = read_spec(folder)
    config = EngineConfig(model=str(folder), pipeline_parallel=stages, **OPTIONS)
    plan = plan_pipeline(spec, stages, 4, "bf16", 1 << 10)
    cpu = torch.device("cpu")
    return Pipeline(config, plan, stage_configs(config, plan, cpu), folder, cpu, spec, **kwargs)


@pytest.mark.parametrize("joins", [False, True], ids=["before-joining", "while-joining"])
def test_a_stage_that_exits_at_start_fails_the_load_at_once_in_one_line(mixtral, tmp_path, joins):
    """No wait for the links' timeout: the process is watched while the stages join. Joining the
    process group waits 1 s at most here, which only the case of a stage already marked in the store
    reaches; either way the stage, its exit code and its last stderr line are named. Before joining,
    the real stage 1 waits in the join for 10 s, so that its own timeout cannot come before stage 2's
    exit on a busy machine (the load fails at stage 2's exit, not after those 10 s)."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER.format(rank=2, joins=joins))
    before = children()
    with pytest.raises(PipelineError) as err:
        _pipeline(mixtral, 3, worker_argv=(str(script),), rendezvous_timeout_s=1.0 if joins else 10.0)
    text = str(err.value)
    assert text.startswith("pipeline stage 2 of 3 (layers "), text
    assert "ended before it joined the pipeline (exit code 3: CUDA error: no CUDA-capable device is detected); " \
           "every stage was stopped — load the model again" in text, text
    assert "\n" not in text
    assert gone(list(children() - before))      # the real stage 1, waiting to join, was stopped too
    assert not dist.is_initialized()
    # the failed join leaves nothing behind: a pipeline loads and runs next, in this process
    llm = LLM(str(mixtral), pipeline_parallel=2, **OPTIONS)
    try:
        assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == 16
    finally:
        llm.engine.close()


def _load_with_worker(folder, script, monkeypatch, pids: list[int], **pipeline_options):
    """``LLM(folder, pipeline_parallel=3)`` whose stage processes run ``script`` (their pids go to ``pids``)."""
    from engine.parallel import load

    def started(*args, **kwargs) -> Pipeline:
        pipeline = Pipeline(*args, worker_argv=(str(script),), **pipeline_options, **kwargs)
        pids.extend(pipeline.pids)
        return pipeline

    monkeypatch.setattr(load, "Pipeline", started)
    return LLM(str(folder), pipeline_parallel=3, **OPTIONS)


def _warm_up_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pipeline-warm-up"]


@pytest.mark.parametrize("signal_name,why", [
    ("SIGKILL", r"\(process (\d+)\) ended unexpectedly \(killed by SIGKILL\)"),
    ("SIGSTOP", r"\(process (\d+)\) did not build its links within 2 s")], ids=["dies", "hangs"])
def test_a_stage_that_dies_or_hangs_while_the_links_warm_up_fails_the_load(mixtral, tmp_path, monkeypatch,
                                                                           signal_name, why):
    """Stage 1 is killed (or stopped) as the links are first used at load: the first stage, watching
    the processes meanwhile, fails the load at once (a hung stage once the join's time is up) with one
    line naming the stage and its process, and stops every stage; the process group is left."""
    script = tmp_path / "warm_up_worker.py"
    script.write_text(WARM_UP_WORKER.format(rank=1, signal=signal_name))
    pids: list[int] = []
    with pytest.raises(PipelineError) as err:
        _load_with_worker(mixtral, script, monkeypatch, pids, rendezvous_timeout_s=2.0)
    text = str(err.value)
    match = re.fullmatch(rf"pipeline stage 1 of 3 \(layers 1\) {why}; every stage was stopped — load the model again",
                         text)
    assert match, text
    assert int(match.group(1)) == pids[0]
    assert gone(pids)                            # the stage after it, waiting on it, was stopped too
    assert not dist.is_initialized()
    deadline = time.monotonic() + 10
    while _warm_up_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _warm_up_threads()                # nothing of the warm-up is left waiting in this process


def test_an_engine_collected_without_close_stops_its_stages(mixtral):
    llm = LLM(str(mixtral), pipeline_parallel=3, **OPTIONS)
    pids = llm.engine.loaded.pipeline.pids
    assert len(pids) == 2 and all(alive(p) for p in pids)
    del llm
    gc.collect()
    assert gone(pids)
    assert not dist.is_initialized()             # the process group was left too: another pipeline may load
    again = LLM(str(mixtral), pipeline_parallel=2, **OPTIONS)
    again.engine.close()


def test_the_warm_up_builds_every_link_in_an_order_without_a_cycle(mixtral):
    llm = LLM(str(mixtral), pipeline_parallel=3, **OPTIONS)
    try:
        # each worker reports the edge it sent on: down the stages, then the last one back to the first
        assert llm.engine.loaded.pipeline.warmed_edges == ((0, 1), (1, 2), (2, 0))
    finally:
        llm.engine.close()


def test_a_live_change_the_first_stage_refuses_reaches_no_stage(mixtral):
    """Every stage checks a change before any applies it: the first stage's card refusing it (its
    budget cannot hold the pool) leaves the other stage as it was, not changed and changed back."""
    llm = LLM(str(mixtral), pipeline_parallel=2, **OPTIONS)
    first = llm.engine.loaded
    try:
        before, pool = [s.experts.pool_slots_total for s in llm.stats().stages], llm.engine.config.expert_pool_size
        outputs = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        copied = [s.experts.h2d_bytes for s in llm.stats().stages]
        first.experts.r.pool.budget_bytes = 1                # the engine's own card has room for no pool
        with pytest.raises(ReconfigureError, match=r"^stage 0: an expert pool of \d+ slots plus \d+ staging slots "
                                                   r"needs .* but the GPU memory budget leaves 1 B for it; lower "
                                                   r"expert_pool_size or raise gpu_memory_budget; no stage changed$"):
            llm.reconfigure(expert_pool_size="50%", prefetch_depth=0)
        first.experts.r.pool.budget_bytes = None
        st = llm.stats()
        assert [s.experts.h2d_bytes for s in st.stages] == copied       # stage 1's pool never shrank and refilled
        assert [s.experts.pool_slots_total for s in st.stages] == before
        assert llm.engine.config.expert_pool_size == pool
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == outputs
    finally:
        llm.engine.close()


def test_a_live_change_is_checked_everywhere_before_it_is_applied_anywhere(mixtral, monkeypatch):
    """Stages 1 and 2 refuse at the check: no stage applies it, and the refusal names them once. A
    change every card accepted but one fails to apply (an allocation) is given back on every stage."""
    llm = LLM(str(mixtral), pipeline_parallel=3, **OPTIONS)
    pipeline = llm.engine.loaded.pipeline
    try:
        before, pool = [s.experts.pool_slots_total for s in llm.stats().stages], llm.engine.config.expert_pool_size
        outputs = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        expect = pipeline.expect

        def refuse(kind_refused: str, ranks: set[int], replaced: list):
            """The first ``kind_refused`` answer of each stage of ``ranks`` replaced by a refusal."""
            def answer(w, kind):
                got = expect(w, kind)
                if kind == kind_refused and w.rank in ranks:
                    ranks.discard(w.rank)
                    replaced.append(got)
                    return (kind, "an expert pool of 2 slots does not fit this card's budget", {})[:len(got)]
                return got
            return answer

        checked: list = []
        monkeypatch.setattr(pipeline, "expect", refuse("checked", {1, 2}, checked))
        copied = [s.experts.h2d_bytes for s in llm.stats().stages]
        with pytest.raises(ReconfigureError, match=r"^stages 1 and 2: an expert pool of 2 slots does not fit this "
                                                   r"card's budget; no stage changed$"):
            llm.reconfigure(expert_pool_size="50%", prefetch_depth=0)
        assert checked == [("checked", None)] * 2              # both had accepted it, and were told nothing more
        assert [s.experts.h2d_bytes for s in llm.stats().stages] == copied     # no stage touched its pool
        assert [s.experts.pool_slots_total for s in llm.stats().stages] == before
        # stage 2 accepted, yet failed to apply it (its answer replaced: its process did apply it)
        applied: list = []
        monkeypatch.setattr(pipeline, "expect", refuse("reconfigured", {2}, applied))
        with pytest.raises(ReconfigureError, match=r"^stage 2: an expert pool of 2 slots does not fit this card's "
                                                   r"budget; no stage changed$"):
            llm.reconfigure(expert_pool_size="50%", prefetch_depth=0)
        assert applied[0][1] is None                           # it had applied the change, and was given it back
        now = [s.experts.h2d_bytes for s in llm.stats().stages]
        # the first stage applies last: it never changed its pool, while stage 1, which applied the change
        # before it was undone, brought the experts the half-size pool dropped back over the bus
        assert now[0] == copied[0] and now[1] > copied[1]
        assert [s.experts.pool_slots_total for s in llm.stats().stages] == before
        assert llm.engine.config.expert_pool_size == pool
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == outputs
        # a change every stage takes goes through, and is what a later refusal puts back
        monkeypatch.undo()
        llm.reconfigure(expert_pool_size="50%")
        assert [s.experts.pool_slots_total for s in llm.stats().stages] == [n // 2 for n in before]
    finally:
        llm.engine.close()


def test_a_stopped_pipeline_refuses_live_changes(mixtral):
    llm = LLM(str(mixtral), pipeline_parallel=2, **OPTIONS)
    pids = llm.engine.loaded.pipeline.pids
    try:
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(PipelineError):
            llm.generate([[1, 2, 3]], GREEDY)
        for change in (dict(prefetch_depth=0), dict(max_batch=2)):
            with pytest.raises(PipelineError, match=r"^pipeline stage 1 of 2 .* ended unexpectedly \(killed by "
                                                    r"SIGKILL\); every stage was stopped — load the model again$"):
                llm.reconfigure(**change)
    finally:
        llm.engine.close()
