"""Every way a model folder can be wrong gives one line naming the file or field and the fix, exit code 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.conftest import run_cli
from tiny_models import ROOT


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_folder(capsys, tmp_path):
    code, err = run_cli(capsys, "generate", "--model", str(tmp_path / "nope"), "--prompt", "hi")
    assert code == 2
    assert err == f"error: model folder '{tmp_path / 'nope'}' does not exist; pass --model with a folder that holds config.json and *.safetensors"


def test_missing_config(capsys, model):
    (model / "config.json").unlink()
    code, err = run_cli(capsys, "info", "--model", str(model))
    assert code == 2 and "config.json is missing" in err and err.count("\n") == 0


def test_unsupported_architecture_names_supported_ones(capsys, model):
    _edit_config(model, architectures=["LlamaForCausalLM"], model_type="llama")
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2
    assert "architecture 'LlamaForCausalLM' is not supported" in err
    assert "Qwen3MoeForCausalLM" in err and "MixtralForCausalLM" in err


def test_unsupported_rope_scaling(capsys, model):
    _edit_config(model, rope_parameters={"rope_type": "longrope", "factor": 4.0, "rope_theta": 10000.0})
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2 and "rope scaling type 'longrope' is not supported" in err and "default" in err


def test_truncated_shard(capsys, model):
    f = model / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2 and "model.safetensors is not a readable safetensors file" in err and "truncated" in err


def test_missing_shard_of_an_index(capsys, model):
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    (model / "model.safetensors").unlink()
    save_file({k: tensors[k] for k in names[: len(names) // 2]}, model / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {k: ("model-00001-of-00002.safetensors" if i < len(names) // 2
                                                 else "model-00002-of-00002.safetensors") for i, k in enumerate(names)}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2 and "shard model-00002-of-00002.safetensors" in err and "is missing" in err


def test_sharded_checkpoint_loads(model):
    """The index + shards layout (what large checkpoints use) loads and matches the single file."""
    from engine import LLM
    ref = LLM(str(model), device="cpu").score([1, 2, 3, 4])
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    (model / "model.safetensors").unlink()
    half = len(names) // 2
    for part, keys in enumerate((names[:half], names[half:]), 1):
        save_file({k: tensors[k] for k in keys}, model / f"model-0000{part}-of-00002.safetensors")
    index = {"weight_map": {k: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, k in enumerate(names)}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(LLM(str(model), device="cpu").score([1, 2, 3, 4]), ref)


def test_tensor_of_the_wrong_shape(capsys, model):
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.0.self_attn.o_proj.weight"
    tensors[name] = torch.zeros(7, 7)
    save_file(tensors, model / "model.safetensors")
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2 and f"tensor '{name}' has shape [7, 7] but config.json implies" in err


def test_cli_prints_no_traceback_and_exits_2(tmp_path):
    """The real process: one line on stderr, exit code 2, no traceback."""
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "info", "--model", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'config.json'} is missing; a model folder needs "
                                                "the Hugging Face config.json beside its *.safetensors"]


def test_index_whose_weight_map_is_a_list(capsys, model):
    """Once a traceback: an index whose weight_map is a list of pairs instead of an object."""
    tensors = load_file(model / "model.safetensors")
    index = model / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": [[k, "model.safetensors"] for k in sorted(tensors)]}))
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2
    assert err == (f"error: {index} has a 'weight_map' that is a list, expected an object mapping tensor names to "
                   "shard files; restore it from the original checkpoint")


def test_tensor_of_an_integer_dtype(capsys, model):
    """Once silent gibberish: an int32 tensor where a floating-point weight belongs."""
    tensors = load_file(model / "model.safetensors")
    name = "model.embed_tokens.weight"
    tensors[name] = tensors[name].to(torch.int32)
    save_file(tensors, model / "model.safetensors")
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2 and f"tensor '{name}' is int32 but Qwen3MoeForCausalLM weights are floating point" in err


@pytest.mark.parametrize("where", ["onto", "under"])
def test_convert_onto_or_under_a_regular_file(capsys, good_model, tmp_path, where):
    f = tmp_path / "weights.txt"
    f.write_text("mine")
    dst = f if where == "onto" else f / "out"
    code, err = run_cli(capsys, "convert", str(good_model), str(dst), "--weights", "fp8", "--force")
    assert code == 2 and err.count("\n") == 0 and "is a file" in err
    assert f.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["weights.txt"]
