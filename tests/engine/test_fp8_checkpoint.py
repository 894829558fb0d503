"""Checkpoints that ship their matrices in fp8 with block scales (DeepSeek-V3 / R1, Kimi K2, Qwen3-*-FP8):
read as the dense checkpoint of their dequantised values, experts kept as Strata's fp8 by default.

The tiny fp8 folders are made here the way those releases are: every linear weight but the embedding,
the LM head and the routers as e4m3 with one float32 ``weight_scale_inv`` per block (16 x 16 here,
128 x 128 in the releases; the matrices' edges leave partial blocks), and the config's
``quantization_config``. A second folder holds the same values dequantised, in float32: the reference.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.checkpoint.spec import read_spec
from engine.errors import ModelLoadError, UnsupportedModelError
from main import main
from tiny_models import build_tiny_model

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 260], [1, 99, 4], [1, 250, 251, 252, 253, 17, 6]]
BLOCK = (16, 16)
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}


def _quantised(name: str, t: torch.Tensor) -> bool:
    return (t.dim() == 2 and name.endswith("proj.weight")) and "embed" not in name


def _to_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    rows, cols = BLOCK
    nb, kb = -(-n // rows), -(-k // cols)
    padded = torch.zeros(nb * rows, kb * cols)
    padded[:n, :k] = w.float()
    amax = padded.view(nb, rows, kb, cols).abs().amax((1, 3)).clamp(min=1e-12)     # [nb, kb]
    scale = amax / 448.0
    full = scale.repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
    return (w.float() / full).to(torch.float8_e4m3fn), scale


def _fp8_pair(src, root):
    """(fp8 folder, float32 folder of the same values) made from the tiny model ``src``."""
    fp8, dense = root / "fp8", root / "dense"
    shutil.copytree(src, fp8)
    shutil.copytree(src, dense)
    state = load_file(src / "model.safetensors")
    out, ref = {}, {}
    for name, t in state.items():
        if _quantised(name, t):
            values, scale = _to_blocks(t)
            out[name], out[name + "_scale_inv"] = values, scale
            full = scale.repeat_interleave(BLOCK[0], 0)[:t.shape[0]].repeat_interleave(BLOCK[1], 1)[:, :t.shape[1]]
            ref[name] = values.float() * full
        else:
            out[name] = ref[name] = t
    assert any(".experts.0." in n and n.endswith("_scale_inv") for n in out)   # routed experts in fp8 too
    save_file(out, fp8 / "model.safetensors")
    save_file(ref, dense / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    (fp8 / "config.json").write_text(json.dumps({**cfg, "quantization_config": QUANT}))
    return fp8, dense


@pytest.fixture(scope="module", params=["qwen3_moe", "deepseek_v3"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"fp8_{request.param}")
    # widths that are not multiples of the block: partial blocks at the edges (hidden 64, expert 24)
    src = build_tiny_model(root / "src", request.param, moe_intermediate_size=24)
    return _fp8_pair(src, root)


def test_an_fp8_checkpoint_reads_as_its_dequantised_values(pair):
    fp8, dense = pair
    spec = read_spec(fp8)
    assert (spec.expert_storage, spec.weight_block) == ("fp8", BLOCK)
    want = LLM(str(dense), device="cpu", dtype="float32").engine.score_batch(PROMPTS)
    got = LLM(str(fp8), device="cpu", dtype="float32", weight_format="bf16").engine.score_batch(PROMPTS)
    # bf16 experts on the CPU's float32 path: the experts' values rounded to bf16 once, nothing else
    assert all(torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.999 for a, b in zip(got, want))
    exact = LLM(str(fp8), device="cpu", dtype="float32", weight_format="bf16", resident_weights="bf16")
    assert exact.engine.loaded.weights.layers[0].attn.qkv.dtype == torch.float32


def test_its_experts_stay_fp8_by_default_and_convert_names_the_source(pair, tmp_path):
    fp8, dense = pair
    llm = LLM(str(fp8), device="cpu", dtype="float32")
    assert llm.engine.loaded.layout.fmt == "fp8"
    want = LLM(str(dense), device="cpu", dtype="float32", weight_format="fp8").engine.score_batch(PROMPTS)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(llm.engine.score_batch(PROMPTS), want))
    dst = tmp_path / "bf16"
    assert main(["convert", str(fp8), str(dst), "--weights", "bf16"]) == 0
    manifest = json.loads((dst / "strata.json").read_text())
    assert manifest["source_experts"] == "fp8" and "block scales" in manifest["quantisation"]
    LLM(str(dst), device="cpu").generate([PROMPTS[0]])


def test_info_plans_the_fp8_experts(pair, capsys):
    fp8, _ = pair
    assert main(["info", "--model", str(fp8), "--gpu-memory-budget", "1G"]) == 0
    assert "in fp8" in capsys.readouterr().out


def _copy(folder, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(folder, dst)
    return dst


def test_a_block_scale_of_the_wrong_shape_is_one_line(pair, tmp_path):
    folder = _copy(pair[0], tmp_path)
    state = load_file(folder / "model.safetensors")
    name = next(n for n in state if n.endswith("o_proj.weight_scale_inv"))
    state[name] = state[name][:, :1].contiguous()
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ModelLoadError) as e:
        LLM(str(folder), device="cpu")
    assert "needs" in str(e.value) and "weight_block_size" in str(e.value) and "\n" not in str(e.value)


def test_an_fp8_config_without_block_sizes_is_one_line(pair, tmp_path):
    folder = _copy(pair[0], tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="without quantization_config.weight_block_size"):
        read_spec(folder)
    cfg["quantization_config"] = {**QUANT, "weight_block_size": [128]}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="two block sizes"):
        read_spec(folder)


def test_a_missing_block_scale_or_config_names_what_to_restore(pair, tmp_path):
    folder = _copy(pair[0], tmp_path)
    state = load_file(folder / "model.safetensors")
    name = next(n for n in state if n.endswith("o_proj.weight_scale_inv"))
    save_file({k: v for k, v in state.items() if k != name}, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="block scale .* is missing from the checkpoint; the download is incomplete"):
        LLM(str(folder), device="cpu")
    save_file(state, folder / "model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "quantization_config"}))
    with pytest.raises(ModelLoadError, match="has block scales beside it but config.json has no fp8 quantization_config"):
        LLM(str(folder), device="cpu")


def test_scales_that_are_not_positive_numbers_are_one_line(pair, tmp_path):
    folder = _copy(pair[0], tmp_path)
    state = load_file(folder / "model.safetensors")
    name = next(n for n in state if n.endswith("o_proj.weight_scale_inv"))
    state[name] = -state[name]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="_scale_inv' holds scales that are not finite numbers above 0"):
        LLM(str(folder), device="cpu")
