"""Engine logits and greedy generations against the transformers implementation of each family."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tiny_models import build_tiny_model, family_configs

FAMILIES = list(family_configs())
# Prompts of different lengths in one batch: padding-free batching must not mix sequences.
PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 260], [1, 99, 4], [1, 250, 251, 252, 253, 17, 6]]


@pytest.fixture(scope="module", params=FAMILIES)
def family_pair(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM
    path = build_tiny_model(tmp_path_factory.mktemp(request.param), request.param)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # prefill_chunk 5 forces chunked prefill (a prompt split over several steps)
    llm = LLM(str(path), device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4)
    return request.param, hf, llm


def assert_logits_match(hf, llm, prompts) -> None:
    """Strata's batched prompt logits equal transformers' per prompt, max |delta| <= 1e-4 at fp32."""
    ours = llm.engine.score_batch(prompts)
    for ids, got in zip(prompts, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() <= 1e-4


def test_batched_logits_match_transformers(family_pair):
    _, hf, llm = family_pair
    assert_logits_match(hf, llm, PROMPTS)


def _hf_greedy(hf, ids, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def test_greedy_generation_matches_transformers_batched_and_alone(family_pair):
    _, hf, llm = family_pair
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    batched = llm.generate(PROMPTS, params)
    for ids, out in zip(PROMPTS, batched):
        ref = _hf_greedy(hf, ids, 32)
        assert out.token_ids == ref
        assert llm.generate([ids], params)[0].token_ids == ref
        assert out.finish_reason == "length"


def test_in_memory_state_dict_with_fused_experts(family_pair):
    """A transformers model's own state_dict (experts fused as [E, 2F, D] / [E, D, F]) runs without a disk."""
    from pathlib import Path

    from engine.checkpoint.memory import DictSource
    from engine.checkpoint.spec import spec_from_config
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.loading import LoadedModel
    _, hf, _ = family_pair
    cfg = hf.config.to_dict()
    spec = spec_from_config(cfg, Path("memory"))
    config = EngineConfig(model="memory", device="cpu", dtype="float32")
    engine = LLMEngine(config, LoadedModel(config, spec, DictSource(hf.state_dict()), None))
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPTS[0]])).logits[0].float()
    assert (engine.score(PROMPTS[0]) - ref).abs().max().item() <= 1e-4
