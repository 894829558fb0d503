"""DeepSeek-V2 / V3 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``): what the families add to the
generic model, and ``info`` on DeepSeek-V2-Lite's and DeepSeek-V3's configs alone (no weights).

Parity with transformers (logits, greedy, chunked prefill, fused experts in memory, pipeline and
expert parallel) runs in test_parity.py and the other family tests with every family, on a V2-like
tiny model (queries straight from the hidden state, group-limited softmax routing, YaRN with
mscale_all_dim) and a V3-like one (low-rank queries, biased sigmoid routing in groups). Here: V3
without interleaved rotary pairs, the latent cache (its size, int8 / fp8 storage), the rotary order
through every path that stores query rows (8-bit resident weights, a converted folder), offloaded
experts with predictions, and bad configs.
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
from row_order import check_8bit_rows_keep_the_order, cosine
from tiny_models import build_tiny_model

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 260], [1, 99, 4], [1, 250, 251, 252, 253, 17, 6]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

# DeepSeek-V2-Lite's config.json as released (the fields the model reads)
V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 1,
           "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
           "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
           "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
           "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
           "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
           "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                            "original_max_position_embeddings": 4096, "type": "yarn"},
           "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "tie_word_embeddings": False,
           "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400}
# DeepSeek-V3's (and R1's)
V3 = {**V2_LITE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
      "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_group": 8,
      "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
      "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096, "type": "yarn"},
      "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_group": 4, "topk_method": "noaux_tc",
      "vocab_size": 129280}


@pytest.fixture(scope="module")
def v2_wide(tmp_path_factory):
    # hidden and expert FFN of 128, so that int4 groups of 128 divide them
    return build_tiny_model(tmp_path_factory.mktemp("ds_v2_wide"), "deepseek_v2", wide=True)


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("ds_v3"), "deepseek_v3")


def _matches_transformers(path) -> None:
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4)
    for ids, got in zip(PROMPTS, llm.engine.score_batch(PROMPTS)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert (got - ref).abs().max().item() <= 1e-4


def test_v3_with_rotary_pairs_in_halves_matches_transformers(tmp_path):
    # rope_interleave false: the checkpoint's rotary dimensions pair j with j + p/2 already, kept as they are
    path = build_tiny_model(tmp_path / "m", "deepseek_v3", rope_interleave=False)
    spec = read_spec(path)
    assert not spec.mla.interleaved and spec.mla.q_lora_rank == 48
    _matches_transformers(path)


def test_the_groups_choose_experts_the_free_choice_would_not(v3):
    # the tiny V3 keeps 2 of 4 groups: without the limit some tokens would take other experts
    from engine.models.moe_transformer import router_logits
    llm = LLM(str(v3), device="cpu", dtype="float32")
    model, spec = llm.engine.loaded.model, llm.engine.loaded.spec
    assert (spec.route_groups, spec.route_keep_groups, spec.routed_scale) == (4, 2, 2.5)
    moe = next(layer.moe for layer in model.w.layers if layer.moe is not None)
    x = torch.randn(64, spec.hidden, generator=torch.Generator().manual_seed(0))
    _, ids = model.route(router_logits(x, moe), moe.score_bias)
    groups = ids.long() // (spec.num_experts // 4)                          # [T, k]
    assert all(len(set(row)) <= 2 for row in groups.tolist())
    free = torch.topk(torch.sigmoid(router_logits(x, moe)) + moe.score_bias, spec.top_k).indices
    assert not torch.equal(free.sort(-1).values, ids.long().sort(-1).values)


def test_the_cache_keeps_one_latent_row_a_token_and_int8_fp8_storage_follow_it(v3):
    spec = read_spec(v3)
    ref = LLM(str(v3), device="cpu", dtype="float32")
    cache = ref.engine.loaded.cache
    assert (cache.k[0].shape[1:], cache.v[0].shape[1:]) == ((1, 32), (1, 8))   # the latent, the rotary key
    assert ref.engine.loaded.kv_sizing.bytes_per_token == spec.num_layers * (32 + 8) * 4
    want = ref.engine.score_batch(PROMPTS)
    # one scale per token and plane (the latent's, the rotary key's): int8 rows are near exact; fp8's 3-bit
    # mantissa moves some tiny-model
    # positions' logits (a routing choice flips), as it does for the other families
    for kv, least in (("int8", 0.999), ("fp8", 0.95)):
        got = LLM(str(v3), device="cpu", dtype="float32", kv_cache_dtype=kv).engine.score_batch(PROMPTS)
        assert cosine(got, want) >= least


def test_8bit_resident_weights_and_a_converted_folder_keep_the_rotary_order(v2_wide, tmp_path):
    # the queries' and the latent's rotary rows are reordered at load
    check_8bit_rows_keep_the_order(v2_wide, tmp_path)
    kv_b = LLM(str(tmp_path / "int4"), device="cpu").engine.loaded.weights.layers[0].attn.kv_up_k
    assert kv_b.dtype == torch.float32                  # kv_b_proj folds into queries and outputs: never 8-bit


@pytest.mark.parametrize("fixture", ["v2_wide", "v3"])
def test_offloaded_experts_with_predictions_generate_what_resident_ones_do(fixture, request):
    # prefetch depth 2 predicts later layers' experts (V3: sigmoid(logits / rms) + bias; groups ignored)
    path = request.getfixturevalue(fixture)
    ref = [o.token_ids for o in LLM(str(path), device="cpu").generate(PROMPTS, GREEDY)]
    with LLM(str(path), device="cpu", expert_pool_size="50%", prefetch_depth=2) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
        assert st.misses > 0 and st.prefetch_hits > 0


def _write(folder, base=V2_LITE, **changes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**base, **changes}))
    return folder


def test_v2_lite_reads_as_released(tmp_path):
    spec = read_spec(_write(tmp_path / "DeepSeek-V2-Lite"))
    m = spec.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope, m.qk_rope, m.v_head_dim) == (0, 512, 128, 64, 128)
    assert m.interleaved
    mscale = 0.1 * 0.707 * torch.log(torch.tensor(40.0)).item() + 1
    assert m.softmax_scale == pytest.approx(192 ** -0.5 * mscale ** 2)
    assert spec.rope_scaling.mscale == pytest.approx(1.0)          # mscale / mscale_all_dim: the tables unscaled
    assert (spec.route_groups, spec.route_keep_groups, spec.routed_scale, spec.norm_topk_prob) == (1, 1, 1.0, False)
    assert spec.moe_layers[:2] == (False, True) and spec.shared_ffn == 2 * 1408
    assert (spec.kv_heads_stored, spec.kv_head_dim_stored, spec.kv_v_dim_stored) == (1, 512, 64)


def test_fields_a_config_leaves_out_take_transformers_defaults(tmp_path):
    keys = ("first_k_dense_replace", "n_shared_experts", "routed_scaling_factor", "norm_topk_prob", "topk_method",
            "q_lora_rank", "scoring_func", "n_group", "topk_group")
    bare = {k: v for k, v in V3.items() if k not in keys}
    spec = read_spec(_write(tmp_path / "v3", bare))
    assert spec.moe_layers[:4] == (False, False, False, True)
    assert (spec.shared_ffn, spec.routed_scale, spec.norm_topk_prob, spec.mla.q_lora_rank) == (2048, 2.5, True, 1536)
    assert (spec.route_groups, spec.route_keep_groups) == (8, 4)            # DeepseekV3Config's n_group, topk_group
    bare = {k: v for k, v in V2_LITE.items() if k not in keys}
    spec = read_spec(_write(tmp_path / "v2", bare))
    assert (spec.route_groups, spec.route_keep_groups, spec.shared_ffn, spec.norm_topk_prob) == (1, 1, 2 * 1408, False)


def test_v2_renormalises_or_scales_its_weights_never_both(tmp_path):
    # DeepSeek-V2's router: with norm_topk_prob the top-k weights are renormalised and not scaled
    spec = read_spec(_write(tmp_path / "n", norm_topk_prob=True, routed_scaling_factor=16.0))
    assert (spec.renormalize, spec.routed_scale) == (True, 1.0)
    spec = read_spec(_write(tmp_path / "s", norm_topk_prob=False, routed_scaling_factor=16.0))
    assert (spec.renormalize, spec.routed_scale) == (False, 16.0)


@pytest.mark.parametrize("base, changes, error, words", [
    (V2_LITE, {"attention_bias": True}, UnsupportedModelError, "attention_bias true is not supported"),
    (V2_LITE, {"topk_method": "noaux_tc"}, ModelLoadError,
     "'topk_method' is \"noaux_tc\" but must be \"greedy\" or \"group_limited_greedy\""),
    (V3, {"scoring_func": "softmax"}, ModelLoadError, "'scoring_func' is \"softmax\" but must be \"sigmoid\""),
    (V3, {"n_group": 7}, ModelLoadError, "'n_group' is 7 but must be a divisor of the 256 routed experts"),
    (V3, {"topk_group": 9}, ModelLoadError, "'topk_group' is 9 but must be an integer from 1 to 8"),
    (V2_LITE, {"topk_method": "group_limited_greedy", "n_group": 32, "topk_group": 2}, ModelLoadError,
     "'topk_group' is 2 but must be enough groups of 2 experts for the 6 a token takes"),
    (V2_LITE, {"qk_rope_head_dim": 63}, ModelLoadError, "'qk_rope_head_dim' is 63 but must be an even number"),
    (V2_LITE, {"moe_layer_freq": 30}, ModelLoadError, "'moe_layer_freq' is 30 but must be an integer from 1 to 27"),
    (V3, {"routed_scaling_factor": 1e308}, ModelLoadError,
     "'routed_scaling_factor' is 1e+308 but must be a finite number above 0 and at most 100 (released models use 1 "
     "to 16)"),
])
def test_a_config_deepseek_cannot_run_is_one_line_naming_the_field(tmp_path, base, changes, error, words):
    with pytest.raises(error) as e:
        read_spec(_write(tmp_path / "m", base, **changes))
    assert words in str(e.value) and "\n" not in str(e.value)


def _line(out: str, head: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(head))


def test_info_on_deepseek_v2_lite_plans_a_24g_card(tmp_path, capsys):
    folder = _write(tmp_path / "DeepSeek-V2-Lite")
    assert main(["info", "--model", str(folder), "--gpu-memory-budget", "24G"]) == 0
    out = capsys.readouterr().out
    D, H, L = 2048, 16, 27
    attention = L * (H * 192 * D + 576 * D + H * 256 * 512 + D * H * 128)
    assert re.search(rf"^attention\s+{attention:,}\s", out, re.M)
    assert re.search(r"^total\s+15,706,484,224\s", out, re.M)          # 15.7 billion, as DeepSeek-V2-Lite
    assert "KV per token      : 30.38 KiB" in out                        # 27 layers x 576 values x 2 bytes
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0


def test_info_on_deepseek_v3_names_the_fixes_that_fit_a_24g_card(tmp_path, capsys):
    folder = _write(tmp_path / "DeepSeek-V3", V3)
    args = ["info", "--model", str(folder), "--gpu-memory-budget", "24G", "--weight-format", "int4"]
    assert main(args) == 2
    assert "use --resident-weights int8" in capsys.readouterr().err
    # 32 sequences are more than a direct-read step takes: staged for copies and the layers ahead
    assert main(args + ["--resident-weights", "int8", "--max-batch", "32"]) == 2
    err = capsys.readouterr().err
    assert "staging slots" in err and "lower --max-batch" in err
    # the fix named works: at 16 (the default) a layer misses at most 16 x 8 experts, half a layer's
    # staging, and 88 experts are pooled beside it
    assert main(args + ["--resident-weights", "int8", "--max-batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "88/14848 experts (1%)" in _line(out, "expert pool") and "128 staging slots" in _line(out, "expert pool")
    assert re.search(r"^total\s+671,026,419,200\s", out, re.M)
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0


def test_info_plans_kimi_k2_on_a_24g_card(tmp_path, capsys):
    # Kimi K2: V3's architecture with 384 experts in one group, 64 heads and its own model_type
    kimi = {**V3, "model_type": "kimi_k2", "n_routed_experts": 384, "n_group": 1, "topk_group": 1,
            "num_attention_heads": 64, "num_key_value_heads": 64, "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.827, "vocab_size": 163840, "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                             "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}
    folder = _write(tmp_path / "Kimi-K2", kimi)
    assert main(["info", "--model", str(folder), "--gpu-memory-budget", "24G", "--weight-format", "int4",
                 "--resident-weights", "int8", "--max-batch", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^total\s+1,026,408,232,448\s", out, re.M)          # a trillion, as Kimi K2
    assert "active per token: 31,687,102,976 parameters" in out            # 32 billion active
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0



def test_the_multi_token_prediction_layer_v3_ships_is_not_read(tmp_path):
    # DeepSeek-V3's checkpoint holds one more layer (num_nextn_predict_layers) past num_hidden_layers
    from safetensors.torch import load_file, save_file
    path = build_tiny_model(tmp_path / "m", "deepseek_v3")
    ref = [o.token_ids for o in LLM(str(path), device="cpu").generate(PROMPTS, GREEDY)]
    state = load_file(path / "model.safetensors")
    extra = {"model.layers.3.eh_proj.weight": torch.randn(64, 128), "model.layers.3.enorm.weight": torch.ones(64),
             "model.layers.3.self_attn.kv_a_proj_with_mqa.weight": torch.randn(40, 64)}
    save_file({**state, **extra}, path / "model.safetensors")
    assert [o.token_ids for o in LLM(str(path), device="cpu").generate(PROMPTS, GREEDY)] == ref


def test_prefill_in_head_passes_and_decode_in_chunks_match_transformers(v3, monkeypatch):
    # a long prompt's heads a few at a time over chunks of its context (PREFILL_BYTES); decode steps over
    # the context in chunks with a running softmax (DECODE_BYTES), contexts ending inside, at and before a chunk
    import engine.models.mla as mla
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(v3, dtype=torch.float32).eval()
    ids = [1 + (7 * i) % 500 for i in range(200)]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    monkeypatch.setattr(mla, "PREFILL_BYTES", 3 * 64 * 200 * 4)         # 3 of the 4 heads, then 1
    got = LLM(str(v3), device="cpu", dtype="float32", prefill_chunk=64).engine.score_batch([ids])[0]
    assert (got - ref).abs().max().item() <= 1e-4
    monkeypatch.setattr(mla, "PREFILL_BYTES", 4 * (64 + 40) * 19)       # one head over 19 positions a pass
    got = LLM(str(v3), device="cpu", dtype="float32", prefill_chunk=64).engine.score_batch([ids])[0]
    assert (got - ref).abs().max().item() <= 1e-4
    prompts = [ids[:150], ids[:7], ids[:33]]
    want = [_hf_greedy(hf, p, 10) for p in prompts]
    monkeypatch.setattr(mla, "DECODE_BYTES", 3 * 4 * (2 * 40 + 4) * 16)  # chunks of 16 positions at batch 3
    llm = LLM(str(v3), device="cpu", dtype="float32", max_batch=4)
    assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0,
                                                                       ignore_eos=True))] == want


def _hf_greedy(hf, ids, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def test_a_tiktoken_vocabulary_that_is_incomplete_is_one_line(v3, tmp_path, capsys):
    # Moonlight and Kimi K2 ship tiktoken.model and no tokenizer.json (read: tests/engine/test_tiktoken_vocab.py)
    import shutil
    folder = tmp_path / "kimi"
    shutil.copytree(v3, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tiktoken.model").write_text("IQ== 0\n")
    assert main(["generate", "--model", str(folder), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "tiktoken.model: 255 of the 256 single bytes have no token" in err and err.count("\n") == 1