"""--resident-weights fp8 / int8: attention, dense and shared-expert MLPs and the LM head stay 8-bit on the
device, computed through the 8-bit linear path, counted at their real size, kept as stored by a converted
folder, and named in eval's report."""
from __future__ import annotations

import json
import re

import pytest
import torch

from engine import LLM, SamplingParams
from engine.checkpoint.plan import resident_bytes
from engine.config import EngineConfig
from engine.errors import ConfigError
from kernels.qlinear import QuantWeight
from main import main
from tiny_models import build_tiny_model

PROMPT = [1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 250, 18]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    # Qwen2-MoE: qkv bias, a shared expert with its gate, a dense layer between sparse ones, an untied LM head
    return build_tiny_model(tmp_path_factory.mktemp("res") / "src", "qwen2_moe")


def _matrices(llm: LLM) -> list:
    w = llm.engine.loaded.weights
    out = [w.lm_head]
    for layer in w.layers:
        out += [layer.attn.qkv, layer.attn.o]
        mlp = layer.mlp or (layer.moe.shared if layer.moe else None)
        if mlp is not None:
            out += [mlp.gate_up, mlp.down]
    return out


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_quantised_at_load_and_counted_at_their_size(src, fmt):
    full, small = LLM(str(src), device="cpu"), LLM(str(src), device="cpu", resident_weights=fmt)
    mats = _matrices(small)
    assert all(isinstance(m, QuantWeight) and m.fmt == fmt for m in mats)
    assert not any(isinstance(m, QuantWeight) for m in _matrices(full))
    spec = small.engine.loaded.spec
    # the plan (what info and the budget count) equals what was allocated
    assert small.engine.loaded.weights.resident_bytes() == resident_bytes(spec, 4, fmt)
    assert full.engine.loaded.weights.resident_bytes() == resident_bytes(spec, 4, "bf16")
    assert resident_bytes(spec, 4, fmt) < resident_bytes(spec, 4, "bf16") / 2
    assert small.engine.model_info.resident_format == fmt
    a, b = full.score(PROMPT), small.score(PROMPT)
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean()) > 0.97
    out = small.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0))[0]
    assert len(out.token_ids) == 6


def test_rows_quantised_a_block_at_a_time_equal_the_whole_matrix_quantised(src, monkeypatch):
    import engine.checkpoint.loader as loader
    from kernels.qlinear import quantize_rows
    full = _matrices(LLM(str(src), device="cpu"))
    monkeypatch.setattr(loader, "QUANT_LOAD_BYTES", 3 * full[1].shape[1] * 4)     # three float32 rows a block
    blocks = _matrices(LLM(str(src), device="cpu", resident_weights="int8"))
    assert min(m.shape[0] for m in full) > 3 * 4                       # every matrix in several blocks
    for whole, got in zip(full, blocks):
        want = quantize_rows(whole, "int8")
        assert torch.equal(got.q, want.q) and torch.equal(got.scale, want.scale)


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_a_converted_folder_keeps_them_as_stored(src, tmp_path, fmt):
    dst = tmp_path / fmt
    assert main(["convert", str(src), str(dst), "--weights", "bf16", "--resident-weights", fmt]) == 0
    assert json.loads((dst / "strata.json").read_text())["resident_weights"] == fmt
    kept = LLM(str(dst), device="cpu")                                   # auto: as stored
    assert all(isinstance(m, QuantWeight) and m.fmt == fmt for m in _matrices(kept))
    widened = LLM(str(dst), device="cpu", resident_weights="bf16")       # the same values in float32
    assert not any(isinstance(m, QuantWeight) for m in _matrices(widened))
    torch.testing.assert_close(kept.score(PROMPT), widened.score(PROMPT), atol=1e-4, rtol=1e-4)


def test_info_plans_with_the_8bit_bytes(src, capsys):
    assert main(["info", "--model", str(src)]) == 0
    full = capsys.readouterr().out
    assert main(["info", "--model", str(src), "--resident-weights", "int8"]) == 0
    small = capsys.readouterr().out
    assert "resident matrices in int8" in small and "resident matrices in float32" not in small
    assert full != small


def test_eval_names_the_format_and_loads_the_reference_as_stored(src, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 8)
    assert main(["eval", "--model", str(src), "--reference", str(src), "--text", str(text), "--device", "cpu",
                 "--resident-weights", "fp8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["resident_format"] == "fp8" and 0.5 < r["top1_agreement"] <= 1.0
    assert r["perplexity"] != r["reference_perplexity"]      # the reference ran unquantised


def test_eval_names_the_dtype_the_resident_matrices_ran_in(src, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 8)
    assert main(["eval", "--model", str(src), "--text", str(text), "--device", "cpu", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["resident_format"] == "fp32"                      # a CPU run's dtype, not "bf16"


def test_eval_notes_a_perplexity_from_few_tokens(src, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox")
    assert main(["eval", "--model", str(src), "--text", str(text), "--device", "cpu"]) == 0
    assert re.search(r"note: only \d+ tokens? scored; a perplexity from so few says little", capsys.readouterr().err)
    text.write_text("the quick brown fox jumps over the lazy dog " * 40)
    assert main(["eval", "--model", str(src), "--text", str(text), "--device", "cpu"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_an_unknown_format_is_one_line_naming_the_choices(src, capsys):
    with pytest.raises(ConfigError, match="fp8, int8"):
        EngineConfig(model=str(src), resident_weights="int4")
    assert main(["convert", str(src), str(src) + "-x", "--resident-weights", "int4"]) == 2
    assert "choose bf16, fp8 or int8" in capsys.readouterr().err


def test_eval_runs_the_reference_with_its_own_kv_cache_and_dtype(src, tmp_path, capsys):
    # --kv-cache-dtype and --dtype measure the model under test: the reference keeps the cache and dtype it loads with
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 8)
    args = ["eval", "--model", str(src), "--reference", str(src), "--text", str(text), "--device", "cpu", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args + ["--kv-cache-dtype", "fp8", "--dtype", "bfloat16"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["reference_perplexity"] == plain["reference_perplexity"] and r["perplexity"] != plain["perplexity"]


CUDA = torch.device("cuda")


@pytest.mark.parametrize("weight_format,storage,device,dtype,capability,want", [
    ("int4", "dense", CUDA, torch.bfloat16, (9, 0), "fp8"),        # experts quantised at load on Hopper
    ("mxfp4", "dense", CUDA, torch.float16, (8, 9), "fp8"),        # Ada
    ("fp8", "dense", CUDA, torch.bfloat16, (10, 0), "fp8"),
    ("int4", "dense", CUDA, torch.bfloat16, (8, 6), "bf16"),       # Ampere: no fp8 in its kernels
    ("int4", "dense", CUDA, torch.float32, (9, 0), "bf16"),        # float32 activations keep the dtype
    ("auto", "dense", CUDA, torch.bfloat16, (9, 0), "bf16"),       # the experts as stored: nothing lossy asked
    ("bf16", "dense", CUDA, torch.bfloat16, (9, 0), "bf16"),
    ("mxfp4", "mxfp4", CUDA, torch.bfloat16, (9, 0), "bf16"),      # shipped as MXFP4: kept as shipped
    ("int4", "dense", torch.device("cpu"), torch.bfloat16, None, "bf16"),
])
def test_auto_takes_fp8_only_beside_experts_quantised_at_load_on_a_card_that_runs_it(
        weight_format, storage, device, dtype, capability, want):
    from engine.placement import auto_resident
    got, note = auto_resident(weight_format, storage, device, dtype, capability)
    assert got == want
    assert (note is not None) == (want == "fp8")
    if note:
        assert weight_format in note and "--resident-weights bf16" in note


def test_auto_on_the_cpu_keeps_the_dtype_and_says_nothing(src):
    with LLM(str(src), device="cpu", dtype="float32", weight_format="int4", group_size=32) as llm:
        info = llm.engine.model_info
        assert info.resident_format == "bf16" and not any("fp8" in n for n in info.notes)
