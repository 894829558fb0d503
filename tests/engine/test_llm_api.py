"""The Python API stays usable: a ``generate`` call runs or is refused as a whole, with one SamplingParams per prompt."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ConfigError, DeviceOutOfMemoryError

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd"]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def llm():
    with LLM(str(DEMO), device="cpu") as model:
        yield model


@pytest.fixture(scope="module")
def alone(llm):
    """Each prompt's greedy 12-token reply, run on its own."""
    return [llm.generate(p, greedy(12))[0] for p in PROMPTS]


def assert_idle(llm):
    assert not llm.engine.has_unfinished()
    assert llm.stats().kv_blocks_used == 0


def test_one_sampling_params_per_prompt_gives_each_its_own_max_tokens(llm, alone):
    outs = llm.generate(PROMPTS, [greedy(3), greedy(12), greedy(7)])
    assert [len(o.token_ids) for o in outs] == [3, 12, 7]
    assert [o.finish_reason for o in outs] == ["length"] * 3
    for out, ref in zip(outs, alone):               # batching and per-prompt limits change no token
        assert out.token_ids == ref.token_ids[:len(out.token_ids)]


def test_stop_strings_apply_to_their_own_prompt_only(llm, alone):
    stop = alone[1].text[4:8]
    assert stop.strip() and stop not in alone[0].text        # so only the second prompt can stop on it
    outs = llm.generate(PROMPTS[:2], [greedy(12), greedy(12, stop=(stop,))])
    assert outs[0].text == alone[0].text and outs[0].finish_reason == "length"
    assert outs[1].text == alone[1].text[:alone[1].text.index(stop)] and outs[1].finish_reason == "stop"


def test_outputs_stay_in_prompt_order(llm):
    prompts = ["And", "In the beginning God created the heavens", [1, 2, 3, 4, 5, 6, 7]]
    outs = llm.generate(prompts, [greedy(9), greedy(2), greedy(5)])     # the long prompt finishes first
    assert [o.prompt_token_ids for o in outs] == [llm.tokenizer.encode(prompts[0]),
                                                  llm.tokenizer.encode(prompts[1]), prompts[2]]
    assert [len(o.token_ids) for o in outs] == [9, 2, 5]
    assert len({o.request_id for o in outs}) == 3


@pytest.mark.parametrize("bad, match", [
    ("", "prompt 2 of 3: the prompt is empty"),
    ([5, 99999, 7], "prompt 2 of 3: token id 99999 is outside the vocabulary"),
    ([5] * 600, "prompt 2 of 3: the prompt has 600 tokens but the context holds 512"),
    ([5, "x", 7], "prompt 2 of 3: a prompt's token ids must be whole numbers"),
    ([5, True], "prompt 2 of 3: a prompt's token ids must be whole numbers"),
    (None, "prompt 2 of 3: a prompt is text or a list of token ids"),
])
def test_a_bad_prompt_in_the_middle_refuses_the_whole_call_and_the_next_call_works(llm, alone, bad, match):
    before = llm.stats().requests_finished
    with pytest.raises(ConfigError, match=match):
        llm.generate([PROMPTS[0], bad, PROMPTS[2]], greedy(12))
    assert_idle(llm)
    assert llm.stats().requests_finished == before             # nothing of the refused call ran
    outs = llm.generate([PROMPTS[0], PROMPTS[2]], greedy(12))
    assert [o.token_ids for o in outs] == [alone[0].token_ids, alone[2].token_ids]


def test_a_list_of_params_of_the_wrong_length_is_one_line(llm):
    with pytest.raises(ConfigError, match="^got 2 SamplingParams for 3 prompts; pass one for every prompt"):
        llm.generate(PROMPTS, [greedy(3), greedy(4)])
    with pytest.raises(ConfigError, match="params must be a SamplingParams or a list of them"):
        llm.generate(PROMPTS, {"max_tokens": 3})
    with pytest.raises(ConfigError, match=r"prompt 3 of 3: sampling parameters must be a SamplingParams \(got dict\)"):
        llm.generate(PROMPTS, [greedy(3), greedy(4), {"max_tokens": 3}])
    assert_idle(llm)


@pytest.mark.parametrize("failure", [KeyboardInterrupt, DeviceOutOfMemoryError])
def test_an_exception_in_the_middle_of_a_call_leaves_nothing_behind(llm, alone, monkeypatch, failure):
    # the third step fails, whether it runs at once or is launched ahead of the last one's read-back
    runner, calls = llm.engine.runner, []

    def failing(real):
        def step(*args, **kw):
            calls.append(1)
            if len(calls) == 3:
                raise failure("the third step failed")
            return real(*args, **kw)
        return step
    monkeypatch.setattr(runner, "run", failing(runner.run))
    monkeypatch.setattr(runner, "launch", failing(runner.launch))
    with pytest.raises(failure):
        llm.generate(PROMPTS, greedy(12))
    assert_idle(llm)
    outs = llm.generate(PROMPTS, greedy(12))
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]


def test_single_prompts_as_text_ids_or_a_tensor(llm, alone):
    ids = llm.tokenizer.encode(PROMPTS[0])
    for prompt in (PROMPTS[0], ids, tuple(ids), torch.tensor(ids)):
        out, = llm.generate(prompt, greedy(12))
        assert out.token_ids == alone[0].token_ids and out.prompt_token_ids == ids
    assert llm.generate([], greedy(3)) == []
    with pytest.raises(ConfigError, match=r"prompts must be text, a list of token ids, or a list of those \(got bytes\)"):
        llm.generate(b"In the beginning", greedy(3))


def test_the_engine_and_add_request_say_the_same(llm):
    eng = llm.engine
    for bad in ("", [4096], [1.5], b"abc"):
        with pytest.raises(ConfigError) as checked:
            eng.validate_request(bad, greedy(3))
        with pytest.raises(ConfigError) as added:
            eng.add_request(None, bad, greedy(3))
        assert str(checked.value) == str(added.value)
    assert_idle(llm)


def test_the_context_is_one_property_away(llm):
    assert llm.context_tokens == llm.engine.context_tokens == 512


def test_closing_an_engine_gives_its_memory_back_at_once(tmp_path):
    # The workbench closes one model and loads the next on the same card: close() itself lets go of the
    # weights, cache and pool (the model's objects refer to each other, so dropping the engine alone
    # would leave them to Python's collector), keeps the counters, and refuses new work in one line.
    import gc
    import weakref
    with LLM(str(DEMO), device="cpu", expert_pool_size="50%") as model:
        model.generate(PROMPTS[0], greedy(4))
        loaded = model.engine.loaded
        held = [weakref.ref(x) for x in (loaded.weights.embed, loaded.cache.k[0], loaded.model, loaded.experts)]
        tokens = model.stats().generated_tokens
        assert tokens == 4
        enabled = gc.isenabled()
        gc.disable()                              # nothing but close() may free them
        try:
            model.close()
            assert all(ref() is None for ref in held)
        finally:
            if enabled:
                gc.enable()
        assert model.engine.closed and model.stats().generated_tokens == tokens
        with pytest.raises(ConfigError, match="was closed.*load the model again"):
            model.generate(PROMPTS[0], greedy(2))
        for use in (model.engine.step, lambda: model.reconfigure(prefetch_depth=1), lambda: model.score([1, 2, 3])):
            with pytest.raises(ConfigError, match="was closed"):
                use()
    model.close()                                 # closing again (here by the with block) does nothing


def test_a_request_still_running_when_the_engine_closes_ends_as_aborted():
    with LLM(str(DEMO), device="cpu") as model:
        engine = model.engine
        engine.add_request("left", PROMPTS[0], greedy(8))
        engine.step()
        model.close()
        assert not engine.has_unfinished() and engine.abort_now("left") is None


def test_a_text_as_long_as_the_context_is_scored_and_one_token_more_is_refused(llm):
    # scoring continues nothing, so the text may fill the context; a prompt to continue may not
    limit = llm.engine.loaded.max_model_len
    ids = [(7 * i) % 300 + 1 for i in range(limit + 1)]
    assert tuple(llm.score(ids[:limit]).shape) == (limit, llm.engine.loaded.spec.vocab_size)
    with pytest.raises(ConfigError, match=f"^the text has {limit + 1} tokens but the context holds {limit}; score "
                                          f"{limit} tokens or fewer at a time$"):
        llm.score(ids)
    with pytest.raises(ConfigError, match=f"shorten the prompt to {limit - 1} tokens or fewer"):
        llm.generate([ids[:limit]], greedy(1))
    assert_idle(llm)


def test_an_option_llm_does_not_have_is_one_line_naming_the_nearest():
    from engine.llm import _check_options
    with pytest.raises(ConfigError, match=r"^LLM has no option 'expert_pool'; did you mean expert_pool_size\?$"):
        _check_options({"expert_pool": 3})
    with pytest.raises(ConfigError, match=r"^LLM has no option 'zzz'; see EngineConfig for the options"):
        LLM(str(DEMO), zzz=1)
    _check_options({"device": "cpu", "overlap_steps": False})
