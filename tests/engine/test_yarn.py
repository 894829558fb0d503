"""YaRN RoPE for any family: the inverse frequencies and attention factor of transformers' YaRN, and
a Qwen3-MoE model with YaRN scaling whose logits and greedy tokens match transformers'."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.checkpoint.spec import spec_from_config
from engine.models.layers import Rope, default_inv_freq, yarn_inv_freq
from tiny_models import build_tiny_model

BASE = {"rope_type": "yarn", "rope_theta": 10000.0}


@pytest.mark.parametrize("head_dim,max_position,rope", [
    (32, 512, {"factor": 4.0, "original_max_position_embeddings": 64}),                 # truncated ramp
    (64, 131072, {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                  "truncate": False, "rope_theta": 150000.0}),                          # gpt-oss's own
    (24, 1024, {"factor": 8.0, "original_max_position_embeddings": 128, "beta_fast": 16.0, "beta_slow": 2.0,
                "attention_factor": 0.9}),
    (32, 2048, {"factor": 40.0, "original_max_position_embeddings": 512, "mscale": 1.0, "mscale_all_dim": 0.5}),
])
def test_inverse_frequencies_and_attention_factor_match_transformers(head_dim, max_position, rope):
    from transformers import Qwen3MoeConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    params = {**BASE, **rope}
    hf = Qwen3MoeConfig(head_dim=head_dim, max_position_embeddings=max_position, rope_parameters=dict(params))
    ref_freq, ref_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    spec = spec_from_config(hf.to_dict() | {"architectures": ["Qwen3MoeForCausalLM"]}, Path("memory"))
    assert spec.rope_theta == params["rope_theta"]
    inv_freq = yarn_inv_freq(head_dim, spec.rope_theta, spec.rope_scaling)
    assert torch.equal(inv_freq, ref_freq)
    assert not torch.equal(inv_freq, default_inv_freq(head_dim, spec.rope_theta))
    assert spec.rope_scaling.mscale == pytest.approx(ref_factor, rel=1e-12)
    rope_tables = Rope(head_dim, spec.rope_theta, 8, torch.device("cpu"), torch.float32, spec.rope_scaling)
    assert rope_tables.cos[0, 0].item() == pytest.approx(ref_factor, rel=1e-6)      # cos(0) scaled


@pytest.fixture(scope="module")
def qwen3_yarn(tmp_path_factory):
    from transformers import AutoModelForCausalLM
    rope = {**BASE, "factor": 4.0, "original_max_position_embeddings": 16}    # ramp over the middle dimensions
    path = build_tiny_model(tmp_path_factory.mktemp("yarn") / "m", "qwen3_moe", rope_parameters=rope)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4)
    yield hf, llm
    llm.close()


def test_qwen3_moe_with_yarn_matches_transformers(qwen3_yarn):
    hf, llm = qwen3_yarn
    assert llm.engine.loaded.spec.rope_scaling.factor == 4.0
    gen = torch.Generator().manual_seed(3)
    prompts = [[1] + torch.randint(4, 500, (30,), generator=gen).tolist(), [1, 7, 9]]
    for ids, got in zip(prompts, llm.engine.score_batch(prompts)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert (got - ref).abs().max().item() <= 1e-4
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for ids, out in zip(prompts, llm.generate(prompts, params)):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert out.token_ids == ref[0, len(ids):].tolist()
