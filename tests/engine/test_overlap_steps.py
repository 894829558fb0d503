"""Decode steps launched ahead of the last step's read-back (``overlap_steps``): the same output as
steps run one at a time, whatever ends a request while the next step is already launched."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.engine import LLMEngine
from tiny_models import build_tiny_model

PROMPTS = [[1, 5, 9], [1, 7], [2, 4, 6, 8, 10], [3]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("overlap") / "m", "mixtral")


@pytest.fixture(scope="module")
def engines(model_dir):
    """One engine that launches decode steps ahead and one that does not, on the same model."""
    on = LLMEngine(EngineConfig(model=str(model_dir), device="cpu", overlap_steps=True))
    off = LLMEngine(EngineConfig(model=str(model_dir), device="cpu", overlap_steps=False))
    yield on, off
    on.close()
    off.close()


def run(eng: LLMEngine, jobs: dict[str, tuple[list[int], SamplingParams]], between=None) -> dict:
    """Every job to its end, stepping by hand; per request its streamed token ids and text, finish
    reason and logprobs (``between(eng, step_index)`` runs before each step)."""
    for rid, (prompt, params) in jobs.items():
        eng.add_request(rid, prompt, params)
    out = {rid: {"ids": [], "text": "", "reason": None, "logprobs": []} for rid in jobs}
    i = 0
    while eng.has_unfinished():
        if between is not None:
            between(eng, i)
        for d in eng.step():
            o = out.setdefault(d.request_id, {"ids": [], "text": "", "reason": None, "logprobs": []})
            assert o["reason"] is None, f"{d.request_id} got output after it ended"
            o["ids"] += d.new_token_ids
            o["text"] += d.new_text
            o["logprobs"] += [(lp.token_id, round(lp.logprob, 5)) for lp in d.logprobs]
            if d.finished:
                o["reason"] = d.finish_reason
        i += 1
    assert eng.stats().kv_blocks_used == 0
    return out


def both(engines, jobs, between=None) -> tuple[dict, int]:
    on, off = engines
    before = on.steps_ahead
    got, want = run(on, jobs, between), run(off, jobs, between)
    assert got == want
    assert off.steps_ahead == 0
    return got, on.steps_ahead - before


def test_greedy_and_seeded_requests_with_different_lengths_and_logprobs(engines):
    # the batch shrinks as requests reach their max_tokens; seeded sampling draws in the same order;
    # logprobs of steps launched ahead land beside the read-back of the step before
    jobs = {f"r{i}": (p, SamplingParams(max_tokens=6 + 5 * i, temperature=0.0 if i % 2 else 0.9, seed=i,
                                        ignore_eos=True, logprobs=2 if i < 2 else None))
            for i, p in enumerate(PROMPTS)}
    got, ahead = both(engines, jobs)
    assert [len(got[f"r{i}"]["ids"]) for i in range(4)] == [6, 11, 16, 21]
    assert all(len(got[r]["logprobs"]) == len(got[r]["ids"]) for r in ("r0", "r1"))
    assert ahead >= 15            # most decode steps ran ahead of the last one's read-back
    on, off = engines
    assert on.stats().steps_ahead == on.steps_ahead and off.stats().steps_ahead == 0


def test_stop_strings_and_stop_tokens_end_requests_whose_next_step_is_already_launched(engines):
    on, off = engines
    full = run(off, {"f": (PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))})["f"]
    stop_text = full["text"][4:7]
    stop_token = full["ids"][6]
    jobs = {"s": (PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=(stop_text,))),
            "t": (PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True,
                                             stop_token_ids=(stop_token,))),
            "long": (PROMPTS[1], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))}
    got, ahead = both(engines, jobs)
    assert got["s"]["reason"] == got["t"]["reason"] == "stop" and got["long"]["reason"] == "length"
    assert got["t"]["ids"] == full["ids"][:full["ids"].index(stop_token) + 1]
    assert ahead > 0


def test_an_abort_a_request_added_midway_and_a_live_change_between_steps(engines):
    # each breaks the steady batch: the step launched ahead is read back first, nothing is lost
    def between(eng, i):
        if i == 3:
            eng.abort("a")
        if i == 5:
            eng.add_request("late", [1, 3, 5], SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True))
        if i == 9:
            eng.reconfigure(prefetch_depth=1)
    jobs = {"a": (PROMPTS[0], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)),
            "b": (PROMPTS[2], SamplingParams(max_tokens=25, temperature=0.0, ignore_eos=True))}
    on, off = engines
    got, ahead = both(engines, jobs, between)
    assert got["a"]["reason"] == "abort" and got["b"]["reason"] == "length" and got["late"]["reason"] == "length"
    assert len(got["b"]["ids"]) == 25 and len(got["late"]["ids"]) == 7
    assert ahead > 0


def test_the_context_limit_ends_a_request_at_the_same_token(model_dir):
    outs = {}
    for overlap in (True, False):
        with LLM(str(model_dir), device="cpu", max_model_len=20, overlap_steps=overlap) as llm:
            outs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(
                [PROMPTS[2], PROMPTS[3]], SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))]
            assert llm.stats().kv_blocks_used == 0
    assert outs[True] == outs[False]
    assert [len(ids) for ids, _ in outs[True]] == [15, 19] and {r for _, r in outs[True]} == {"length"}


def test_guides_and_repetition_penalties_run_their_steps_one_at_a_time(engines):
    on, _ = engines
    before = on.steps_ahead
    run(on, {"p": (PROMPTS[0], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                              repetition_penalty=1.3))})
    assert on.steps_ahead == before


def test_a_sampling_that_runs_out_of_memory_is_retried_on_its_own_read_back_set(model_dir, monkeypatch):
    # The step launched behind one in flight fails while sampling (the GPU's memory, say): the loop
    # steps on, the step is launched again into the set of buffers it was given, and the step in
    # flight still reads its own token back (read-backs staged as on a GPU, into buffers of their own).
    import torch
    import engine.runner.model_runner as mr
    from engine.runner.staging import HostStaging
    from engine.errors import DeviceOutOfMemoryError
    jobs = {"a": (PROMPTS[0], SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)),
            "b": (PROMPTS[2], SamplingParams(max_tokens=14, temperature=0.7, seed=3, ignore_eos=True))}
    with LLMEngine(EngineConfig(model=str(model_dir), device="cpu", overlap_steps=False)) as off:
        want = run(off, jobs)
    real, calls = mr.sample, []

    def sample(*args, **kw):
        calls.append(1)
        if len(calls) == 8:
            raise torch.OutOfMemoryError("out of memory")
        return real(*args, **kw)
    monkeypatch.setattr(mr, "sample", sample)
    with LLMEngine(EngineConfig(model=str(model_dir), device="cpu")) as on:
        on.runner._stagings = (HostStaging(copies=True, pinned=False), HostStaging(copies=True, pinned=False))
        for rid, (prompt, params) in jobs.items():
            on.add_request(rid, prompt, params)
        got = {rid: [] for rid in jobs}
        failures = 0
        while on.has_unfinished():
            try:
                deltas = on.step()
            except DeviceOutOfMemoryError:
                failures += 1                      # what the engine loop does: it logs and steps on
                continue
            for d in deltas:
                got[d.request_id] += d.new_token_ids
        assert failures == 1 and on.steps_ahead > 0 and on.stats().kv_blocks_used == 0
    assert got == {rid: want[rid]["ids"] for rid in jobs}


def test_an_abort_now_keeps_what_a_drain_read_back_and_leaves_no_step_behind(model_dir):
    # a live change reads the step in flight back (its token held for the next step); the request is
    # then ended at once: its final delta carries that token, and with no request left the step
    # launched for it is read at once, not after the engine idled
    with LLMEngine(EngineConfig(model=str(model_dir), device="cpu")) as eng:
        eng.add_request("a", PROMPTS[0], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
        ids = []
        for _ in range(5):
            ids += [t for d in eng.step() for t in d.new_token_ids]
        assert eng._ahead is not None                       # a step is in flight
        eng.reconfigure(prefetch_depth=1)
        final = eng.abort_now("a")
        ids += final.new_token_ids
        assert final.finished and final.finish_reason == "abort" and len(ids) == final.completion_tokens
        assert eng._ahead is None and not eng.has_unfinished() and eng.step() == []
        eng.add_request("b", PROMPTS[1], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
        assert eng.stats().kv_blocks_used == 0
