"""Request lifecycle: stop strings, stop tokens, abort, preemption under a small KV cache, streaming."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.engine import LLMEngine
from engine.config import EngineConfig
from tiny_models import build_tiny_model

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("req") / "m", "mixtral")


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), device="cpu")


def test_stop_string_cuts_text_and_finishes(llm):
    full = llm.generate([[1, 5, 9]], GREEDY)[0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    out = llm.generate([[1, 5, 9]], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]


def test_the_last_delta_says_whether_a_stop_string_ended_the_request(llm):
    # a front end tells "the request's stop string cut it" from "the model ended it" (a tool call cut in
    # half is then no call, where one the model left unfinished is its text)
    full = llm.generate([[1, 5, 9]], GREEDY)[0]
    stop, token = full.text[3:6], full.token_ids[4]
    engine = llm.engine
    for params, cut in ((SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=(stop,)), True),
                        (SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=(token,),
                                        stop=("zzz-never",)), False),
                        (SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, stop=("zzz-never",)), False)):
        rid = engine.add_request(None, [1, 5, 9], params)
        deltas = []
        while engine.has_unfinished():
            deltas += [d for d in engine.step() if d.request_id == rid]
        assert deltas[-1].finished and deltas[-1].stop_string is cut
        assert not any(d.stop_string for d in deltas[:-1])


def test_stop_token_id_finishes_with_stop(llm):
    full = llm.generate([[1, 5, 9]], GREEDY)[0]
    target = full.token_ids[4]
    out = llm.generate([[1, 5, 9]], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                   stop_token_ids=(target,)))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: full.token_ids.index(target) + 1]


def test_seeded_sampling_is_reproducible(llm):
    p = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    a, b = llm.generate([[1, 5, 9]], p)[0], llm.generate([[1, 5, 9], [1, 2]], p)[0]
    assert a.token_ids == b.token_ids


def test_abort_mid_generation_frees_everything(model_dir):
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    eng.add_request("a", [1, 5, 9], SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    eng.add_request("b", [1, 7], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    eng.abort("a")
    finished = {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.finished:
                finished[d.request_id] = d.finish_reason
    assert finished == {"a": "abort", "b": "length"}
    assert eng.stats().kv_blocks_used == 0


def test_preemption_under_a_tiny_kv_cache_keeps_outputs(model_dir, llm):
    """Blocks run out: the youngest request is preempted and recomputed; no output changes, none is lost."""
    prompts = [[1, 5, 9, 11], [1, 7, 8], [1, 20, 21, 22, 23], [1, 3]]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want = [llm.generate([p], params)[0].token_ids for p in prompts]
    bpt = 2 * 3 * 2 * 16 * 4          # layers * kv heads * head_dim * fp32, K and V
    small = LLM(str(model_dir), device="cpu", kv_block_size=4, kv_cache_size=bpt * 4 * 20, max_model_len=64)
    got = small.generate(prompts, params)
    assert [o.token_ids for o in got] == want
    assert small.stats().preemptions > 0


def test_streamed_deltas_add_up_to_the_final_text(model_dir):
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    eng.add_request("s", "The expert pool", SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    text, ids, ttft = "", [], None
    while eng.has_unfinished():
        for d in eng.step():
            text += d.new_text
            ids += d.new_token_ids
            ttft = ttft if d.ttft_ms is None else d.ttft_ms
    assert text == eng.tokenizer.decode(ids)
    assert len(ids) == 20 and ttft is not None and ttft > 0
    s = eng.stats()
    assert s.generated_tokens == 20 and s.requests_finished == 1 and s.kv_blocks_used == 0


def test_prompt_longer_than_the_context_is_refused(llm):
    # the context is the model's whole max_position_embeddings: only shortening the prompt can work
    from engine.errors import ConfigError
    with pytest.raises(ConfigError, match="^the prompt has 600 tokens but the context holds 512, prompt and reply "
                                          "together; shorten the prompt to 511 tokens or fewer$"):
        llm.generate([[1] * 600], GREEDY)


def test_out_of_memory_in_a_step_keeps_every_request(model_dir, monkeypatch):
    """A step that runs out of device memory becomes one clear error; the requests survive and finish later."""
    import torch

    from engine.errors import DeviceOutOfMemoryError
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    eng.add_request("a", [1, 5, 9], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    real = eng.runner.run

    def oom_once(sched):
        monkeypatch.setattr(eng.runner, "run", real)
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(eng.runner, "run", oom_once)
    with pytest.raises(DeviceOutOfMemoryError, match="every request is kept"):
        eng.step()
    ids = []
    while eng.has_unfinished():
        for d in eng.step():
            ids += d.new_token_ids
    assert len(ids) == 6


@pytest.mark.parametrize("prompt, match", [
    ([1, "5"], r"a prompt's token ids must be whole numbers \(found '5'\)"),
    ([1, 2.0], r"a prompt's token ids must be whole numbers \(found 2.0\)"),
    ([1, None], r"a prompt's token ids must be whole numbers \(found None\)"),
    (b"\x01\x05", r"a prompt is text or a list of token ids \(got bytes\)"),
    (17, r"a prompt is text or a list of token ids \(got int\)"),
    ({"prompt": "hi"}, r"a prompt is text or a list of token ids \(got dict\)"),
])
def test_prompts_of_the_wrong_kind_are_one_line_errors_and_queue_nothing(model_dir, prompt, match):
    from engine.errors import ConfigError
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    with pytest.raises(ConfigError, match=match):
        eng.add_request("x", prompt, GREEDY)
    assert not eng.has_unfinished()
    eng.add_request("x", [1, 5, 9], GREEDY)           # the id was not taken by the refused request


def test_a_stop_token_outside_the_vocabulary_is_refused(llm):
    from engine.errors import ConfigError
    with pytest.raises(ConfigError, match=r"stop token id 512 is outside the vocabulary \(0..511\)"):
        llm.generate([[1, 5, 9]], SamplingParams(max_tokens=4, stop_token_ids=(512,)))


def test_abort_now_ends_a_request_between_steps_and_frees_its_blocks(model_dir):
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    eng.add_request("a", "The expert pool", SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    eng.add_request("b", [1, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    ids = []
    for _ in range(4):
        ids += [t for d in eng.step() if d.request_id == "a" for t in d.new_token_ids]
    final = eng.abort_now("a")
    assert final.finished and final.finish_reason == "abort" and final.completion_tokens == len(ids) > 0
    assert eng.abort_now("a") is None                  # already gone: nothing to do
    while eng.has_unfinished():
        assert all(d.request_id == "b" for d in eng.step())
    assert eng.stats().kv_blocks_used == 0
    assert eng.context_tokens == 512
