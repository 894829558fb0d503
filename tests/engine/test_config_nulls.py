"""config.json mistakes that used to load silently: a null where transformers would not read the default,
rope_scaling hidden behind rope_parameters, token ids outside the vocabulary or of the wrong type, and a
damaged generation_config.json. Each is one line naming the file, the field, what was found and the fix."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.checkpoint.spec import read_spec, spec_from_config
from engine.errors import ModelLoadError, UnsupportedModelError
from main import main
from tiny_models import ROOT

DEMO = ROOT / "resources" / "models" / "demo"
DEMO_CONFIG = json.loads((DEMO / "config.json").read_text())     # vocab_size 4096, max_position_embeddings 512
FOLDER = DEMO.parent / "m"
FILE = FOLDER / "config.json"
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 1e6}


def _spec(**changes):
    return spec_from_config({**DEMO_CONFIG, **changes}, FOLDER)


def _refused(error: type = ModelLoadError, **changes) -> str:
    with pytest.raises(error) as info:
        _spec(**changes)
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# ---- rope_parameters and rope_scaling together ------------------------------------------------------

def test_a_bad_rope_scaling_beside_rope_parameters_is_refused_as_it_is_alone():
    bad = {"rope_type": "yarn", "factor": "x"}
    alone = _refused(rope_parameters=None, rope_scaling=bad)
    both = _refused(rope_scaling=bad)                               # the demo sets rope_parameters
    for msg in (alone, both):
        assert msg.startswith(f"{FILE}: field 'rope_scaling.factor' is \"x\" but must be a finite number above 0")


def test_an_unsupported_rope_scaling_beside_rope_parameters_names_rope_scaling():
    msg = _refused(UnsupportedModelError, rope_scaling={"rope_type": "longrope", "factor": 4.0})
    assert "rope scaling type 'longrope' is not supported" in msg and "remove rope_scaling from config.json" in msg


@pytest.mark.parametrize("params,scaling", [
    ({"rope_type": "default", "rope_theta": 1e4}, {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 128}),
    (YARN, {**YARN, "factor": 2.0}),
    (YARN, {**YARN, "rope_theta": 5e5}),
], ids=["default-vs-yarn", "two-factors", "two-thetas"])
def test_rope_parameters_and_rope_scaling_that_disagree_are_refused_naming_both(params, scaling):
    msg = _refused(rope_parameters=params, rope_scaling=scaling)
    assert msg.startswith(f"{FILE}: fields 'rope_parameters' (") and "and 'rope_scaling' (" in msg
    assert msg.endswith("both set the RoPE and disagree; delete the one that is wrong (transformers would use "
                        "rope_scaling)")


def test_rope_parameters_and_rope_scaling_that_agree_load_as_either_alone():
    # the older spelling ("type") and a theta given once are the same RoPE
    scaling = {"type": "yarn", "factor": 4, "original_max_position_embeddings": 128}
    both = _spec(rope_parameters=YARN, rope_scaling=scaling)
    alone = _spec(rope_parameters=YARN)
    assert both.rope_scaling == alone.rope_scaling and both.rope_scaling.factor == 4.0
    assert both.rope_theta == alone.rope_theta == 1e6
    assert _spec(rope_parameters=None, rope_scaling=scaling, rope_theta=2e5).rope_scaling == alone.rope_scaling


# ---- nulls -------------------------------------------------------------------------------------------

# transformers refuses these nulls (its config classes type them int / float / bool / str) or builds a model
# that cannot run from them (a null rope_theta): Strata refuses them too, where they once took a default
REFUSED_NULLS = [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, "rope_parameters.rope_theta",
     "a finite number above 0"),
    ({"rope_parameters": None, "rope_theta": None}, "rope_theta", "a finite number above 0"),
    ({"num_experts": None}, "num_experts", "an integer >= 0"),
    ({"num_local_experts": None}, "num_local_experts", "an integer >= 0"),
    ({"num_experts": None, "num_local_experts": None}, "num_local_experts", "an integer >= 0"),
    ({"norm_topk_prob": None}, "norm_topk_prob", "true or false"),
    ({"rms_norm_eps": None}, "rms_norm_eps", "a finite number above 0"),
    ({"max_position_embeddings": None}, "max_position_embeddings", "an integer from 1 to 2147483647"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size", "a positive integer"),
    ({"tie_word_embeddings": None}, "tie_word_embeddings", "true or false"),
    ({"attention_bias": None}, "attention_bias", "true or false"),
    ({"hidden_act": None}, "hidden_act", "a string"),
    ({"decoder_sparse_step": None}, "decoder_sparse_step", "a positive integer"),
    ({"rope_parameters": {**YARN, "truncate": None}}, "rope_parameters.truncate", "true or false"),
    ({"rope_parameters": {**YARN, "original_max_position_embeddings": None}},
     "rope_parameters.original_max_position_embeddings", "a positive integer"),
    ({"rope_parameters": {**YARN, "partial_rotary_factor": None}}, "rope_parameters.partial_rotary_factor",
     "a finite number above 0"),
    ({"rope_parameters": {"rope_type": None, "rope_theta": 1e4}}, "rope_parameters.rope_type", "a string"),
]


@pytest.mark.parametrize("changes,field,expected", REFUSED_NULLS, ids=[r[1] for r in REFUSED_NULLS])
def test_a_null_transformers_would_not_read_as_the_default_is_refused(changes, field, expected):
    msg = _refused(**changes)
    assert msg.startswith(f"{FILE}: field '{field}' is null but must be {expected}")
    assert msg.endswith("correct it or restore config.json from the original checkpoint")


def test_nulls_transformers_reads_as_the_default_still_load_as_the_default():
    ref = _spec(rope_parameters=YARN)
    # YaRN's factor and betas: transformers puts in max_position / original and 32 / 1
    nulls = _spec(rope_parameters={**YARN, "factor": None, "beta_fast": None, "beta_slow": None,
                                   "attention_factor": None})
    assert nulls.rope_scaling == ref.rope_scaling and nulls.rope_scaling.factor == 512 / 128
    # a top-level rope_theta beside a nested one is not read (transformers takes the nested one)
    assert _spec(rope_parameters=YARN, rope_theta=None).rope_theta == 1e6
    assert _spec(partial_rotary_factor=None, original_max_position_embeddings=None, quantization_config=None,
                 torch_dtype=None, bos_token_id=None, pad_token_id=None).rotary_dim == 0


# ---- token ids ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("eos_token_id", 99999), ("eos_token_id", 4096), ("eos_token_id", -1), ("eos_token_id", "3"),
    ("eos_token_id", 3.5), ("eos_token_id", True), ("eos_token_id", [0, 99999]), ("eos_token_id", ["0"]),
    ("eos_token_id", {"id": 0}), ("bos_token_id", 5000), ("pad_token_id", "0"),
])
def test_token_ids_outside_the_vocabulary_or_not_integers_are_refused(field, value):
    msg = _refused(**{field: value})
    assert msg.startswith(f"{FILE}: field '{field}' is {json.dumps(value)} but must be a token id from 0 to 4095 "
                          "(below vocab_size) or a list of them; correct it or restore config.json")


def test_token_ids_in_the_vocabulary_load():
    _spec(eos_token_id=4095, bos_token_id=0, pad_token_id=None)
    _spec(eos_token_id=[0, 1, 2])
    _spec(pad_token_id=-1)                      # older configs' "no padding token"


# ---- generation_config.json -------------------------------------------------------------------------

def _folder_with(tmp_path, generation) -> object:
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(DEMO / "config.json", folder / "config.json")
    text = generation if isinstance(generation, str) else json.dumps(generation)
    (folder / "generation_config.json").write_text(text)
    return folder


@pytest.mark.parametrize("generation,field,expected", [
    ({"eos_token_id": "abc", "temperature": "hot"}, "eos_token_id", "a token id from 0 to 4095"),
    ({"eos_token_id": [0, 99999]}, "eos_token_id", "a token id from 0 to 4095"),
    ({"bos_token_id": -2}, "bos_token_id", "a token id from 0 to 4095"),
    ({"temperature": "hot"}, "temperature", "a number >= 0"),
    ({"temperature": -0.5}, "temperature", "a number >= 0"),
    ({"top_p": 1.5}, "top_p", "a number from 0 to 1"),
    ({"min_p": "0.1"}, "min_p", "a number from 0 to 1"),
    ({"repetition_penalty": 0}, "repetition_penalty", "a number above 0"),
    ({"top_k": 2.5}, "top_k", "an integer >= 0"),
    ({"max_new_tokens": 0}, "max_new_tokens", "a positive integer"),
    ({"do_sample": "yes"}, "do_sample", "true or false"),
])
def test_a_damaged_generation_config_is_one_line_naming_the_field(tmp_path, generation, field, expected):
    folder = _folder_with(tmp_path, generation)
    with pytest.raises(ModelLoadError) as info:
        read_spec(folder)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{folder / 'generation_config.json'}: field '{field}' is {json.dumps(generation[field])} "
                          f"but must be {expected}")
    assert msg.endswith("correct it or restore generation_config.json from the original checkpoint")


def test_a_generation_config_as_released_loads(tmp_path):
    released = {"bos_token_id": 0, "eos_token_id": [0, 2], "pad_token_id": 0, "do_sample": True,
                "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_length": 512, "min_p": None,
                "transformers_version": "4.51.0"}
    assert read_spec(_folder_with(tmp_path, released)).vocab_size == 4096


def test_a_generation_config_that_is_not_json_is_one_line(tmp_path):
    folder = _folder_with(tmp_path, "{eos_token_id: 2")
    with pytest.raises(ModelLoadError, match=r"generation_config.json is not valid JSON \(.*\); restore the file"):
        read_spec(folder)


@pytest.mark.parametrize("name,changes,field", [
    ("config.json", {"eos_token_id": 99999}, "eos_token_id"),
    ("config.json", {"num_experts": None}, "num_experts"),
    ("generation_config.json", {"eos_token_id": "abc", "temperature": "hot"}, "eos_token_id"),
])
def test_cli_refuses_them_with_exit_2(model, capsys, name, changes, field):
    cfg = json.loads((model / name).read_text())
    (model / name).write_text(json.dumps({**cfg, **changes}))
    code = main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert err.startswith(f"error: {model / name}: field '{field}' is ")
