"""GLM-4.5 and GLM-4.5-Air (``Glm4MoeForCausalLM``): what the family adds to the generic model, and
``info`` on GLM-4.5-Air's config alone (no weights).

The family's parity with transformers (logits, greedy, chunked prefill, fused experts in memory) runs
in test_parity.py with every other family, on a GLM-4.5-like tiny model (q/k norm, routed scaling 2.5);
here: the Air variant (no q/k norm, scaling 1), the half-head RoPE through every path that stores q/k
weights (8-bit resident weights, a converted folder), predictions with the choice bias, and bad configs.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from engine import LLM, SamplingParams
from engine.checkpoint.spec import read_spec
from engine.errors import ModelLoadError, UnsupportedModelError
from main import main
from row_order import check_8bit_rows_keep_the_order
from tiny_models import build_tiny_model

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 260], [1, 99, 4], [1, 250, 251, 252, 253, 17, 6]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

# GLM-4.5-Air's config.json as released
AIR = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "head_dim": 128, "hidden_act": "silu",
       "hidden_size": 4096, "partial_rotary_factor": 0.5, "intermediate_size": 10944,
       "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
       "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
       "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
       "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None,
       "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "use_qk_norm": False, "vocab_size": 151552}


@pytest.fixture(scope="module")
def air_tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("glm_air"), "glm4_moe", use_qk_norm=False,
                            routed_scaling_factor=1.0)


@pytest.fixture(scope="module")
def glm_wide(tmp_path_factory):
    # hidden and expert FFN of 128, so that int4 groups of 128 divide them
    return build_tiny_model(tmp_path_factory.mktemp("glm_wide"), "glm4_moe", wide=True)


def test_the_air_variant_matches_transformers(air_tiny):
    from transformers import AutoModelForCausalLM
    spec = read_spec(air_tiny)
    assert spec.qk_norm is None and spec.rope_dim == 8 and spec.routed_scale == 1.0
    assert spec.moe_layers == (False, True, True) and spec.shared_ffn == 32
    hf = AutoModelForCausalLM.from_pretrained(air_tiny, dtype=torch.float32).eval()
    llm = LLM(str(air_tiny), device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4)
    for ids, got in zip(PROMPTS, llm.engine.score_batch(PROMPTS)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert (got - ref).abs().max().item() <= 1e-4


def test_8bit_resident_weights_and_a_converted_folder_keep_the_half_head_rope(glm_wide, tmp_path):
    # q and k rows are reordered at load for the half-head RoPE
    check_8bit_rows_keep_the_order(glm_wide, tmp_path)


def test_offloaded_experts_with_predictions_generate_what_resident_ones_do(glm_wide):
    # prefetch depth 2 predicts later layers' experts with the choice bias (sigmoid(logits / rms) + bias)
    ref = [o.token_ids for o in LLM(str(glm_wide), device="cpu").generate(PROMPTS, GREEDY)]
    spec = read_spec(glm_wide)
    half = spec.num_moe_layers * spec.num_experts // 2
    with LLM(str(glm_wide), device="cpu", expert_pool_size=f"{100 * half // (spec.num_moe_layers * spec.num_experts)}%",
             prefetch_depth=2) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
        assert st.misses > 0 and st.prefetch_hits > 0


def _write(folder, **changes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**AIR, **changes}))
    return folder


@pytest.mark.parametrize("changes, error, words", [
    ({"n_group": 8, "topk_group": 4}, UnsupportedModelError, "group-limited expert routing (n_group 8, topk_group 4)"),
    ({"partial_rotary_factor": 1.5}, ModelLoadError, "'partial_rotary_factor' is 1.5 but must be a fraction"),
    ({"first_k_dense_replace": 46}, ModelLoadError, "'first_k_dense_replace' is 46 but must be an integer from 0 to 45"),
    ({"n_routed_experts": 64, "num_experts": 128}, ModelLoadError, "equal to"),
    ({"routed_scaling_factor": "big"}, ModelLoadError, "'routed_scaling_factor' is \"big\""),
])
def test_a_config_glm_cannot_run_is_one_line_naming_the_field(tmp_path, changes, error, words):
    with pytest.raises(error) as e:
        read_spec(_write(tmp_path / "m", **changes))
    assert words in str(e.value) and "\n" not in str(e.value)


def _line(out: str, head: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(head))


def test_info_on_glm_4_5_air_plans_a_24g_card(tmp_path, capsys):
    folder = _write(tmp_path / "GLM-4.5-Air")
    spec = read_spec(folder)
    assert (spec.num_moe_layers, spec.num_experts, spec.top_k, spec.rope_dim, spec.shared_ffn) == (45, 128, 8, 64, 1408)
    assert main(["info", "--model", str(folder), "--gpu-memory-budget", "24G", "--weight-format", "int4"]) == 0
    out = capsys.readouterr().out
    D, F, V, L = 4096, 1408, 151552, 46
    q, kv = 96 * 128, 8 * 128
    attention = L * ((q + 2 * kv) * D + (q + 2 * kv) + D * q)           # q/k/v/o weights and q/k/v biases
    shared = 45 * 3 * D * F
    routed = 45 * 128 * 3 * D * F
    total = 2 * V * D + attention + 3 * D * 10944 + shared + routed + 45 * 128 * (D + 1) + (2 * L + 1) * D
    assert re.search(rf"^total\s+{total:,}\s", out, re.M)             # 106.9 billion, as GLM-4.5-Air
    assert re.search(rf"^attention\s+{attention:,}\s", out, re.M)
    assert "46 (45 MoE), 128 experts, top-8" in out
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0
    slots = int(re.search(r"= (\d+)/5760 experts", _line(out, "expert pool")).group(1))
    assert 500 < slots < 5760


def test_fields_a_config_leaves_out_take_transformers_defaults(tmp_path):
    # Glm4MoeConfig's defaults: half-head RoPE, renormalised top-k, eps 1e-5, one shared expert, one dense layer
    bare = {k: v for k, v in AIR.items() if k not in ("partial_rotary_factor", "norm_topk_prob", "rms_norm_eps",
                                                      "n_shared_experts", "first_k_dense_replace")}
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(bare))
    spec = read_spec(folder)
    assert (spec.rope_dim, spec.norm_topk_prob, spec.rms_norm_eps, spec.shared_ffn) == (64, True, 1e-5, 1408)
    assert spec.moe_layers[:2] == (False, True)


def test_the_router_and_its_choice_bias_stay_float32_in_bfloat16_and_in_a_converted_folder(glm_wide, tmp_path):
    # a bfloat16 rounding of the router's scores or of the choice bias changes which experts some tokens get
    from safetensors import safe_open
    dst = tmp_path / "conv"
    assert main(["convert", str(glm_wide), str(dst), "--weights", "int4"]) == 0
    with safe_open(str(dst / "resident.safetensors"), "pt") as f:
        kinds = {k: f.get_slice(k).get_dtype() for k in f.keys() if ".mlp.gate." in k}
    assert kinds and set(kinds.values()) == {"F32"}
    for folder in (glm_wide, dst):
        moe = next(layer.moe for layer in LLM(str(folder), device="cpu", dtype="bfloat16").engine.loaded.weights.layers
                   if layer.moe is not None)
        assert moe.router.dtype == moe.score_bias.dtype == torch.float32
