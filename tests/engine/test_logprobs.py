"""Logprobs: every chosen token's log-probability under the model's raw logits, and the likeliest
alternatives, reported one for one with the token ids of each streamed delta."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ConfigError
from engine.sampling import SamplingParams

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
PROMPT = "And God said"


@pytest.fixture(scope="module")
def engine():
    with LLMEngine(EngineConfig(model=str(DEMO), device="cpu")) as eng:
        yield eng


def run(eng: LLMEngine, jobs: dict[str, tuple[str | list[int], SamplingParams]]) -> dict[str, dict]:
    """Run every job to the end in one batch; per job its deltas and what they add up to."""
    for rid, (prompt, params) in jobs.items():
        eng.add_request(rid, prompt, params)
    out = {rid: {"deltas": [], "ids": [], "logprobs": [], "text": ""} for rid in jobs}
    while eng.has_unfinished():
        for d in eng.step():
            o = out[d.request_id]
            o["deltas"].append(d)
            o["ids"] += d.new_token_ids
            o["logprobs"] += d.logprobs
            o["text"] += d.new_text
            if d.finished:
                o["reason"] = d.finish_reason
    return out


def reference(eng: LLMEngine, prompt_ids: list[int], out_ids: list[int]) -> torch.Tensor:
    """log_softmax of the scored logits at the positions that predicted each output token: [n, V]."""
    logits = eng.score(prompt_ids + out_ids[:-1])                       # [T, V]
    return logits[len(prompt_ids) - 1:].float().log_softmax(dim=-1)


def test_greedy_logprobs_equal_log_softmax_of_the_scored_logits(engine):
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=5)
    got = run(engine, {"g": (PROMPT, params)})["g"]
    ref = reference(engine, engine.tokenizer.encode(PROMPT), got["ids"])
    assert len(got["logprobs"]) == len(got["ids"]) == 10
    for k, (tok, lp) in enumerate(zip(got["ids"], got["logprobs"])):
        assert lp.token_id == tok
        assert lp.logprob == pytest.approx(ref[k, tok].item(), abs=1e-4)
        ids, values = [t for t, _ in lp.top], [v for _, v in lp.top]
        assert len(lp.top) == 5
        assert values == sorted(values, reverse=True)
        assert ids[0] == tok                     # greedy picks the likeliest token
        want = ref[k].topk(5)
        np.testing.assert_allclose(values, want.values.tolist(), atol=1e-4)
        assert set(ids) == set(want.indices.tolist())


def test_logprobs_are_taken_before_penalty_temperature_and_filters(engine):
    """Sampling with a repetition penalty, a low temperature and top-k changes which token is drawn,
    never the logprob reported for it: that is the model's own."""
    params = SamplingParams(max_tokens=12, temperature=0.6, top_k=4, repetition_penalty=1.5, seed=3,
                            ignore_eos=True, logprobs=3)
    got = run(engine, {"s": (PROMPT, params)})["s"]
    ref = reference(engine, engine.tokenizer.encode(PROMPT), got["ids"])
    assert len(got["logprobs"]) == len(got["ids"]) == 12
    for k, (tok, lp) in enumerate(zip(got["ids"], got["logprobs"])):
        assert lp.logprob == pytest.approx(ref[k, tok].item(), abs=1e-4)
        np.testing.assert_allclose([v for _, v in lp.top], ref[k].topk(3).values.tolist(), atol=1e-4)


def test_logprobs_zero_reports_only_the_chosen_tokens(engine):
    got = run(engine, {"z": (PROMPT, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0))})["z"]
    assert [lp.token_id for lp in got["logprobs"]] == got["ids"]
    assert all(lp.top == () and lp.logprob <= 0.0 for lp in got["logprobs"])


def test_rows_ask_for_different_numbers_of_alternatives_in_one_batch(engine):
    jobs = {"none": (PROMPT, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)),
            "two": ("In the beginning", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)),
            "twenty": (PROMPT, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=20))}
    got = run(engine, jobs)
    assert got["none"]["logprobs"] == []
    assert all(d.logprobs == () for d in got["none"]["deltas"])
    assert {len(lp.top) for lp in got["two"]["logprobs"]} == {2}
    assert {len(lp.top) for lp in got["twenty"]["logprobs"]} == {20}
    # the same prompt, alone or beside rows that ask for more or nothing: the same tokens and logprobs
    assert got["twenty"]["ids"] == got["none"]["ids"]
    alone = run(engine, {"a": jobs["twenty"]})["a"]
    assert alone["ids"] == got["twenty"]["ids"]
    np.testing.assert_allclose([lp.logprob for lp in alone["logprobs"]],
                               [lp.logprob for lp in got["twenty"]["logprobs"]], atol=1e-5)


def test_each_delta_carries_one_logprob_per_token_including_a_dropped_stop_token(engine):
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    full = run(engine, {"f": (PROMPT, greedy)})["f"]["ids"]
    stop_at = full[5]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1, stop_token_ids=(stop_at,),
                            stop=("zzz-never",))
    got = run(engine, {"s": (PROMPT, params)})["s"]
    assert got["reason"] == "stop"
    assert got["ids"] == full[:full.index(stop_at) + 1]     # the stop token is in token_ids, not in the text
    for d in got["deltas"]:
        assert [lp.token_id for lp in d.logprobs] == list(d.new_token_ids)
    ref = reference(engine, engine.tokenizer.encode(PROMPT), got["ids"])
    assert got["logprobs"][-1].logprob == pytest.approx(ref[-1, stop_at].item(), abs=1e-4)


@pytest.mark.parametrize("value", [-1, 21, 2.5, True, "3", [2]])
def test_logprobs_outside_0_to_20_are_one_line_errors(value):
    with pytest.raises(ConfigError, match=r"^logprobs must be a whole number from 0 to 20 \(got .*\); "
                                          r"0 reports only the chosen tokens, None turns it off$"):
        SamplingParams(logprobs=value)


def test_logprobs_in_range_are_kept_as_plain_ints():
    assert SamplingParams().logprobs is None
    for value in (0, 20, np.int64(7)):         # a numpy integer (e.g. from a parsed array) becomes an int
        got = SamplingParams(logprobs=value).logprobs
        assert got == value and type(got) is int
