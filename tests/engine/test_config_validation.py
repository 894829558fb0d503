"""Every config.json field the loader reads is checked for type and range: one line naming the file,
the field, what was found and what is expected — never a traceback, never a silent wrong model."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.checkpoint.spec import read_spec, spec_from_config
from engine.errors import ModelLoadError, UnsupportedModelError
from main import main
from tiny_models import ROOT

DEMO = ROOT / "resources" / "models" / "demo"

DEMO_CONFIG = json.loads((ROOT / "resources" / "models" / "demo" / "config.json").read_text())
HERE = Path("/models/demo")
FILE = HERE / "config.json"

# a Qwen2-MoE config: the family with a shared expert, decoder_sparse_step and mlp_only_layers
QWEN2 = dict(architectures=["Qwen2MoeForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=96,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=2, decoder_sparse_step=1,
             mlp_only_layers=[1], max_position_embeddings=512, rms_norm_eps=1e-6, hidden_act="silu")


def _spec(base: dict = DEMO_CONFIG, **changes):
    return spec_from_config({**base, **changes}, HERE)


def _refused(error: type, base: dict = DEMO_CONFIG, **changes) -> str:
    with pytest.raises(error) as info:
        _spec(base, **changes)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{HERE}")
    return msg


# field, bad value, what the message must say is expected
BAD_FIELDS = [
    ("num_hidden_layers", "six", "a positive integer"),
    ("num_hidden_layers", None, "a positive integer"),
    ("num_hidden_layers", 0, "a positive integer"),
    ("num_hidden_layers", -3, "a positive integer"),
    ("num_hidden_layers", 2.5, "a positive integer"),
    ("num_hidden_layers", True, "a positive integer"),
    ("num_hidden_layers", [6], "a positive integer"),
    ("hidden_size", "128", "a positive integer"),
    ("hidden_size", 0, "a positive integer"),
    ("num_attention_heads", 0, "a positive integer"),
    ("num_attention_heads", "4", "a positive integer"),
    ("num_key_value_heads", 3, "a divisor of num_attention_heads (4)"),
    ("num_key_value_heads", 8, "a divisor of num_attention_heads (4)"),
    ("num_key_value_heads", 0, "a positive integer"),
    ("head_dim", 33, "an even number"),
    ("head_dim", 0, "a positive integer"),
    ("head_dim", "32", "a positive integer"),
    ("vocab_size", 0, "a positive integer"),
    ("vocab_size", {"size": 4096}, "a positive integer"),
    ("intermediate_size", -5, "a positive integer"),
    ("moe_intermediate_size", 0, "a positive integer"),
    ("moe_intermediate_size", "128", "a positive integer"),
    ("num_experts_per_tok", 17, "an integer from 1 to 16 (the model has 16 routed experts)"),
    ("num_experts_per_tok", 0, "an integer from 1 to 16"),
    ("num_experts_per_tok", "2", "an integer from 1 to 16"),
    ("num_experts_per_tok", None, "an integer from 1 to 16"),
    ("num_experts", "16", "an integer >= 0"),
    ("num_experts", 8, "equal to num_local_experts (16)"),
    ("num_local_experts", -1, "an integer >= 0"),
    ("rms_norm_eps", 0, "a finite number above 0"),
    ("rms_norm_eps", -1e-6, "a finite number above 0"),
    ("rms_norm_eps", "1e-6", "a finite number above 0"),
    ("rms_norm_eps", math.nan, "a finite number above 0"),
    ("rms_norm_eps", math.inf, "a finite number above 0"),
    ("rms_norm_eps", False, "a finite number above 0"),
    ("rope_parameters", "yarn", "an object such as"),
    ("rope_parameters", [10000.0], "an object such as"),
    ("rope_parameters", 10000.0, "an object such as"),
    ("max_position_embeddings", 0, "an integer from 1 to 2147483647"),
    ("max_position_embeddings", "512", "an integer from 1 to 2147483647"),
    ("tie_word_embeddings", "yes", "true or false"),
    ("tie_word_embeddings", 2, "true or false"),
    ("norm_topk_prob", "true", "true or false"),
    ("norm_topk_prob", 0.5, "true or false"),
    ("attention_bias", "false", "true or false"),
    ("clip_qkv", -1, "a finite number above 0"),
    ("clip_qkv", "8", "a finite number above 0"),
    ("mlp_only_layers", [6], "a list of integers from 0 to 5"),
    ("mlp_only_layers", [-1], "a list of integers from 0 to 5"),
    ("mlp_only_layers", [1.5], "a list of integers from 0 to 5"),
    ("mlp_only_layers", "1", "a list of integers from 0 to 5"),
    ("mlp_only_layers", {"1": True}, "a list of integers from 0 to 5"),
    ("decoder_sparse_step", 0, "a positive integer"),
    ("decoder_sparse_step", "2", "a positive integer"),
    ("architectures", "Qwen3MoeForCausalLM", 'a list of strings such as ["Qwen3MoeForCausalLM"]'),
    ("architectures", [3], "a list of strings"),
    ("dtype", "int3", "one of bfloat16, float16, float32, float64"),
    ("dtype", 16, "one of bfloat16"),
    ("hidden_act", 5, "a string"),
    ("max_position_embeddings", 1e30, "an integer from 1 to 2147483647 (positions are 32-bit integers)"),
    ("max_position_embeddings", 1 << 31, "an integer from 1 to 2147483647"),
]


@pytest.mark.parametrize("field,value,expected", BAD_FIELDS, ids=[f"{f}={v!r}" for f, v, _ in BAD_FIELDS])
def test_bad_field_names_file_field_value_and_what_is_expected(field, value, expected):
    msg = _refused(ModelLoadError, **{field: value})
    assert msg.startswith(f"{FILE}: field '{field}' is {json.dumps(value)} but must be {expected}")
    assert msg.endswith("correct it or restore config.json from the original checkpoint")


@pytest.mark.parametrize("changes,field,expected", [
    ({"rope_parameters": None, "rope_scaling": "yarn"}, "rope_scaling", "an object such as"),
    ({"rope_parameters": {"rope_type": 3}}, "rope_parameters.rope_type", "a string"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters.rope_theta", "a finite number"),
    ({"rope_parameters": {"rope_theta": "big"}}, "rope_parameters.rope_theta", "a finite number above 0"),
    ({"rope_parameters": None, "rope_theta": -1.0}, "rope_theta", "a finite number above 0"),
    ({"head_dim": None, "hidden_size": 130}, "hidden_size", "a multiple of 2 x num_attention_heads (8)"),
    ({"head_dim": None, "hidden_size": 132}, "hidden_size", "a multiple of 2 x num_attention_heads (8)"),
    ({"dtype": None, "torch_dtype": "float8"}, "torch_dtype", "one of bfloat16"),
], ids=["rope_scaling-string", "rope_type-int", "rope_theta-0", "nested-theta-string", "theta-negative",
        "hidden-not-multiple", "head-size-odd", "torch_dtype-unknown"])
def test_nested_and_derived_fields_are_checked(changes, field, expected):
    msg = _refused(ModelLoadError, **changes)
    assert f"field '{field}' is " in msg and f"but must be {expected}" in msg


@pytest.mark.parametrize("field,value,expected", [
    ("shared_expert_intermediate_size", -1, "an integer >= 0"),
    ("shared_expert_intermediate_size", "48", "an integer >= 0"),
    ("mlp_only_layers", [4], "a list of integers from 0 to 3"),
    ("num_experts_per_tok", 7, "an integer from 1 to 6"),
])
def test_family_fields_of_qwen2_moe_are_checked(field, value, expected):
    msg = _refused(ModelLoadError, QWEN2, **{field: value})
    assert f"field '{field}' is {json.dumps(value)} but must be {expected}" in msg


@pytest.mark.parametrize("base,changes,says", [
    (DEMO_CONFIG, {"num_experts": 0, "num_local_experts": 0}, "declares no routed experts"),
    (DEMO_CONFIG, {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    (DEMO_CONFIG, {"mlp_only_layers": [0, 1, 2, 3, 4, 5]}, "every one of the 6 layers is a dense MLP"),
    (QWEN2, {"decoder_sparse_step": 5}, "every one of the 4 layers is a dense MLP"),
    (DEMO_CONFIG, {"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, "rope scaling type 'longrope'"),
    (DEMO_CONFIG, {"architectures": [], "model_type": "llama"}, "architecture 'model_type=llama' is not supported"),
])
def test_unsupported_models_are_one_line(base, changes, says):
    assert says in _refused(UnsupportedModelError, base, **changes)


def test_null_means_not_given_for_optional_fields():
    """Hugging Face writes null for unset optional fields whose null transformers reads as the default: the
    same model as the field left out (nulls it refuses are refused here too: test_config_nulls.py)."""
    ref = _spec()
    same = _spec(head_dim=None, hidden_size=128, num_attention_heads=4)   # 128 / 4 = 32, the explicit head_dim
    assert same.head_dim == ref.head_dim == 32
    assert _spec(num_key_value_heads=None).num_kv_heads == 4
    assert _spec(mlp_only_layers=None).moe_layers == ref.moe_layers
    assert _spec(rope_parameters=None).rope_theta == 10000.0
    assert _spec(clip_qkv=None, eos_token_id=None, dtype=None).clip_qkv is None


def test_values_that_mean_the_same_are_accepted():
    assert _spec(num_hidden_layers=6.0).num_layers == 6                   # JSON written by a float-happy tool
    assert _spec(norm_topk_prob=0).norm_topk_prob is False and _spec(norm_topk_prob=1).norm_topk_prob is True
    assert _spec(dtype=None, torch_dtype="bf16").checkpoint_dtype == "bfloat16"
    assert _spec(rope_parameters=None, rope_theta=1000000).rope_theta == 1e6
    assert _spec(num_experts_per_tok=16).top_k == 16                      # every expert is still a valid top-k
    spec = spec_from_config(QWEN2, HERE)
    assert spec.moe_layers == (True, False, True, True) and spec.shared_ffn == 48


def test_a_value_too_long_to_show_is_cut_short():
    msg = _refused(ModelLoadError, mlp_only_layers=list(range(100, 200)))
    assert "..." in msg and len(msg) < 300


def test_read_spec_names_the_real_file(tmp_path):
    cfg = {**DEMO_CONFIG, "num_hidden_layers": "six"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=f"^{tmp_path / 'config.json'}: field 'num_hidden_layers' is \"six\""):
        read_spec(tmp_path)


@pytest.mark.parametrize("changes,field", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),      # crashed at the first step
    ({"num_experts_per_tok": 0}, "num_experts_per_tok"),      # ran, and wrote a wrong reply
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"rope_parameters": "yarn"}, "rope_parameters"),
])
def test_cli_refuses_a_bad_config_with_exit_2(model, capsys, changes, field):
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, **changes}))
    code = main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert err.startswith(f"error: {model / 'config.json'}: field '{field}' is ")


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_experts"])
def test_counts_too_large_for_any_model_are_refused_before_any_loop(tmp_path, key):
    cfg = json.loads((DEMO / "config.json").read_text())
    cfg[key] = 10 ** 12
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=f"field '{key}' is 1000000000000 but must be at most"):
        read_spec(tmp_path)


def test_a_lost_architectures_list_of_a_supported_model_says_what_to_add(tmp_path):
    cfg = json.loads((DEMO / "config.json").read_text())
    del cfg["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"field 'architectures' is missing or empty; for model_type 'qwen3_moe' "
                                             r'add "architectures": \["Qwen3MoeForCausalLM"\]'):
        read_spec(tmp_path)


def test_an_unsupported_rope_names_the_key_that_holds_it(tmp_path):
    cfg = json.loads((DEMO / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000, "factor": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="remove rope_parameters from config.json"):
        read_spec(tmp_path)


def test_a_file_given_as_the_model_folder_is_called_a_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file, not a model folder"):
        read_spec(tmp_path / "model.safetensors")


def test_folders_broken_in_other_ways_name_what_is_wrong(tmp_path):
    import shutil
    from engine.checkpoint.reader import SafetensorsReader
    with pytest.raises(ModelLoadError, match="^no model folder was given; pass --model"):
        read_spec("")
    (tmp_path / "dir" / "config.json").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="config.json is a folder, not a file"):
        read_spec(tmp_path / "dir")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "config.json").symlink_to(tmp_path / "blobs" / "gone")
    with pytest.raises(ModelLoadError, match="is a link to .*gone, which does not exist; fetch the checkpoint again"):
        read_spec(tmp_path / "link")
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ModelLoadError, match="names no architecture \\(neither 'architectures' nor 'model_type'\\)"):
        read_spec(tmp_path / "none")
    # gpt-oss ships its weights twice: Hugging Face's at the top, its own format in original/
    (tmp_path / "oss" / "original").mkdir(parents=True)
    (tmp_path / "oss" / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"]}))
    (tmp_path / "oss" / "original" / "config.json").write_text(json.dumps({"num_hidden_layers": 24, "num_experts": 32}))
    with pytest.raises(ModelLoadError) as e:
        read_spec(tmp_path / "oss" / "original")
    assert str(e.value) == (f"{tmp_path / 'oss' / 'original'} holds weights in a format of their own, not a Hugging "
                            f"Face checkpoint (its config.json names no architecture); open {tmp_path / 'oss'} instead")
    shutil.copytree(DEMO, tmp_path / "cache")
    (tmp_path / "cache" / "model.safetensors").unlink()
    (tmp_path / "cache" / "model.safetensors").symlink_to(tmp_path / "blobs" / "weights")
    with pytest.raises(ModelLoadError, match="model.safetensors is a link to .*weights, which does not exist"):
        SafetensorsReader(tmp_path / "cache").names()
