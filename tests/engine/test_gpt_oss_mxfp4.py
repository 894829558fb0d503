"""gpt-oss experts shipped as MXFP4: loaded as shipped, compared with transformers, converted, evaluated.

The checkpoint is a tiny gpt-oss written by transformers' save_pretrained (fp32), whose experts are then
replaced by MXFP4 as gpt-oss ships them: each expert quantised with ``quantize_mxfp4`` in Hugging Face's
[N, K] orientation (gate_up rows = the interleaved outputs), written as ``*_blocks [E, N, K/32, 16]`` /
``*_scales [E, N, K/32]`` beside the dense biases, with ``quantization_config`` in config.json.

The transformers reference loads that same folder with ``Mxfp4Config(dequantize=True)``: on a CPU it
dequantises the blocks into its dense fp32 experts (it would do so by itself, but asks for the
``accelerate`` package first unless dequantisation is requested).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.checkpoint import mxfp4 as mx
from engine.checkpoint.reader import SafetensorsReader
from engine.checkpoint.spec import read_spec
from engine.errors import ModelLoadError
from kernels.expert_layout import ExpertAct, ExpertLayout
from kernels.quant.mxfp4 import quantize_mxfp4
from main import main
from tiny_models import build_tiny_model

# longer than the tiny model's sliding window of 8, so window layers drop keys
PROMPT = [1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 19, 200, 111, 64, 3, 250, 17, 90, 45, 6]
QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}


def ship_as_mxfp4(folder: Path) -> Path:
    """Replace the dense experts of a saved gpt-oss folder by MXFP4 blocks and scales, in place."""
    f = folder / "model.safetensors"
    state = load_file(f)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = state.pop(name)                                            # [E, K, N] (x @ W)
        q = [quantize_mxfp4(w[e].t().contiguous()) for e in range(w.shape[0])]   # [N, K/2], [N, K/32]
        blocks = torch.stack([b for b, _ in q])
        state[name + "_blocks"] = blocks.view(*blocks.shape[:2], -1, 16).contiguous()
        state[name + "_scales"] = torch.stack([s for _, s in q])
    save_file(state, f, metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": QUANT}, indent=2))
    return folder


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("oss") / "dense", "gpt_oss")


@pytest.fixture(scope="module")
def shipped(dense, tmp_path_factory) -> Path:
    return ship_as_mxfp4(shutil.copytree(dense, tmp_path_factory.mktemp("oss") / "mxfp4"))


@pytest.fixture(scope="module")
def hf_logits(shipped) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, Mxfp4Config
    model = AutoModelForCausalLM.from_pretrained(shipped, dtype=torch.float32,
                                                 quantization_config=Mxfp4Config(dequantize=True))
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0]                 # [T, V]


def _layout(folder: Path, fmt: str = "mxfp4", group: int = 128) -> ExpertLayout:
    spec = read_spec(folder)
    return ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, group, bias=True,
                             act=ExpertAct("swiglu_oai", spec.swiglu_alpha, spec.swiglu_limit))


def _host_rows(llm: LLM) -> torch.Tensor:
    return llm.engine.loaded.experts.pool.buffer                       # uint8 [L * E, nbytes], all resident on the CPU


def _same_experts(a: LLM, b: LLM) -> bool:
    """Every tensor of every expert equal (the alignment padding between them is never read)."""
    va, vb = (x.engine.loaded.layout.views(_host_rows(x)) for x in (a, b))
    return va.keys() == vb.keys() and all(torch.equal(va[k], vb[k]) for k in va)


def test_host_rows_hold_the_shipped_bytes_with_gate_and_up_rows_de_interleaved(shipped):
    llm = LLM(str(shipped), device="cpu")
    layout = llm.engine.loaded.layout
    assert (layout.fmt, layout.bias, layout.act.kind) == ("mxfp4", True, "swiglu_oai")
    assert llm.engine.model_info.expert_bytes == _layout(shipped).nbytes
    views = layout.views(_host_rows(llm))
    state, F, E = load_file(shipped / "model.safetensors"), 32, 4
    for moe, i in enumerate(range(3)):
        p = f"model.layers.{i}.mlp.experts"
        blocks, scales = state[f"{p}.gate_up_proj_blocks"], state[f"{p}.gate_up_proj_scales"]
        for e in range(E):
            row = moe * E + e
            assert torch.equal(views["w13"][row][:F], blocks[e, 0::2].reshape(F, -1))       # gate: even rows
            assert torch.equal(views["w13"][row][F:], blocks[e, 1::2].reshape(F, -1))       # up: odd rows
            assert torch.equal(views["w13_scale"][row], torch.cat([scales[e, 0::2], scales[e, 1::2]]))
            assert torch.equal(views["w2"][row], state[f"{p}.down_proj_blocks"][e].reshape(64, -1))
            assert torch.equal(views["w2_scale"][row], state[f"{p}.down_proj_scales"][e])
            bias = state[f"{p}.gate_up_proj_bias"][e]
            assert torch.equal(views["w13_bias"][row], torch.cat([bias[0::2], bias[1::2]]))
            assert torch.equal(views["w2_bias"][row], state[f"{p}.down_proj_bias"][e])


def test_logits_match_transformers_loading_the_same_folder_dequantised(shipped, hf_logits):
    llm = LLM(str(shipped), device="cpu", prefill_chunk=5)             # chunked prefill across the window
    ours = llm.score(PROMPT)
    assert (ours - hf_logits).abs().max() <= 1e-4
    assert torch.equal(ours.argmax(-1), hf_logits.argmax(-1))


def test_packing_reads_one_expert_at_a_time(shipped, monkeypatch):
    """No whole-layer read of blocks or scales, and a re-quantising pack holds one expert's floats."""
    spec, seen = read_spec(shipped), []
    real_get, real_dequantize = SafetensorsReader.get, mx.dequantize_mxfp4

    def get(self, name):
        assert not name.endswith(("_blocks", "_scales")), f"{name} was read whole"
        return real_get(self, name)

    def dequantize(blocks, scales, dtype=torch.float32):
        seen.append(tuple(blocks.shape))
        return real_dequantize(blocks, scales, dtype)

    monkeypatch.setattr(SafetensorsReader, "get", get)
    monkeypatch.setattr(mx, "dequantize_mxfp4", dequantize)
    reader = SafetensorsReader(shipped)
    for fmt, group in (("mxfp4", 128), ("int4", 32)):
        layout = _layout(shipped, fmt, group)
        out = torch.zeros(spec.num_experts, layout.nbytes, dtype=torch.uint8)
        mx.pack_mxfp4_layer(reader, spec, 0, layout, out)
        assert out.any(dim=1).all()                                    # every expert's row was written
    # the shipped layout dequantises nothing; int4 dequantises w13 [2F, D/2] and w2 [D, F/2] of one expert at a time
    assert seen == [(64, 32), (64, 16)] * spec.num_experts


def _damaged(shipped: Path, tmp: Path, name: str, change) -> Path:
    bad = shutil.copytree(shipped, tmp / "bad")
    state = load_file(bad / "model.safetensors")
    state[name] = change(state[name])
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    return bad


def test_a_nan_scale_is_refused_naming_tensor_and_file(shipped, tmp_path):
    def nan_scale(s):
        s = s.clone()
        s[2, 5, 0] = 255
        return s
    name = "model.layers.1.mlp.experts.gate_up_proj_scales"
    bad = _damaged(shipped, tmp_path, name, nan_scale)
    with pytest.raises(ModelLoadError) as e:
        LLM(str(bad), device="cpu")
    assert str(e.value) == (f"{bad / 'model.safetensors'}: tensor '{name}' holds the scale byte 255 (NaN in e8m0) for "
                            "expert 2; the weights are damaged — fetch the checkpoint again")


def test_mis_shaped_blocks_are_refused_before_loading(shipped, tmp_path):
    name = "model.layers.2.mlp.experts.down_proj_blocks"
    bad = _damaged(shipped, tmp_path, name, lambda b: b[:, :32].contiguous())
    with pytest.raises(ModelLoadError) as e:
        LLM(str(bad), device="cpu")
    assert str(e.value) == (f"{bad / 'model.safetensors'}: tensor '{name}' has shape [4, 32, 1, 16] but config.json "
                            "implies [4, 64, 1, 16]; the weights do not match the config")


def _convert(capsys, src: Path, dst: Path, *flags: str) -> tuple[dict, str]:
    assert main(["convert", str(src), str(dst), *flags]) == 0
    return json.loads((dst / "strata.json").read_text()), capsys.readouterr().out


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())


def test_convert_keeps_mxfp4_as_shipped_by_default(shipped, tmp_path, capsys):
    manifest, out = _convert(capsys, shipped, tmp_path / "keep")
    assert manifest["weights"] == "mxfp4" and manifest["source_experts"] == "mxfp4" and manifest["expert_bias"]
    assert manifest["expert_act"] == {"kind": "swiglu_oai", "alpha": 1.702, "limit": 7.0}
    assert "mxfp4 experts, as shipped" in out
    converted, source = LLM(str(tmp_path / "keep"), device="cpu"), LLM(str(shipped), device="cpu")
    assert _same_experts(converted, source)                            # the same bytes, untouched
    # resident weights are stored in bf16: the same logits as the source run in bf16
    a = LLM(str(tmp_path / "keep"), device="cpu", dtype="bfloat16").score(PROMPT)
    assert torch.equal(a, LLM(str(shipped), device="cpu", dtype="bfloat16").score(PROMPT))
    reply = converted.generate([PROMPT], _greedy())[0]
    assert reply.token_ids == source.generate([PROMPT], _greedy())[0].token_ids


def _greedy():
    from engine.sampling import SamplingParams
    return SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("weights,flags,min_cos", [
    ("int4", ("--group-size", "32"), 0.97),
    ("fp8", (), 0.99),
    ("bf16", (), 0.9999),      # MXFP4 values are exact in bf16: only the resident weights' rounding is left
])
def test_convert_requantises_mxfp4(shipped, hf_logits, tmp_path, capsys, weights, flags, min_cos):
    manifest, _ = _convert(capsys, shipped, tmp_path / weights, "--weights", weights, *flags)
    assert manifest["weights"] == weights and manifest["source_experts"] == "mxfp4"
    assert "dequantised MXFP4" in manifest["quantisation"]
    llm = LLM(str(tmp_path / weights), device="cpu")
    assert llm.engine.model_info.expert_format == weights
    assert _cosine(llm.score(PROMPT), hf_logits) >= min_cos
    assert len(llm.generate([PROMPT], _greedy())[0].token_ids) == 6


def test_converted_int4_equals_quantising_at_load(shipped, tmp_path, capsys):
    _convert(capsys, shipped, tmp_path / "int4", "--weights", "int4", "--group-size", "32")
    a = LLM(str(tmp_path / "int4"), device="cpu")
    b = LLM(str(shipped), device="cpu", weight_format="int4", group_size=32)
    assert _same_experts(a, b)


def test_int4_groups_that_cannot_divide_name_the_ones_that_do(shipped, tmp_path, capsys):
    assert main(["convert", str(shipped), str(tmp_path / "g"), "--weights", "int4", "--group-size", "128"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: int4 group size 128 does not divide the reduction dim 64 of this model's experts (hidden 64, "
        "expert FFN 32); choose --group-size 32")


def test_a_dense_checkpoint_quantised_to_mxfp4_matches_the_shipped_bytes(dense, shipped, tmp_path, capsys):
    """Quantising bf16/fp32 experts to MXFP4 (at load or by convert) gives the bytes gpt-oss-style shipping does."""
    manifest, _ = _convert(capsys, dense, tmp_path / "mx", "--weights", "mxfp4")
    assert manifest["source_experts"] == "dense" and manifest["weights"] == "mxfp4"
    source = LLM(str(shipped), device="cpu")
    assert _same_experts(LLM(str(tmp_path / "mx"), device="cpu"), source)
    assert _same_experts(LLM(str(dense), device="cpu", weight_format="mxfp4"), source)


def _eval(capsys, model: Path, reference: Path, text: Path) -> dict:
    assert main(["eval", "--model", str(model), "--reference", str(reference), "--text", str(text), "--device", "cpu",
                 "--window", "32", "--max-tokens", "64", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_compares_mxfp4_and_its_int4_conversion_with_the_dequantised_weights(shipped, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8, encoding="utf-8")
    itself = _eval(capsys, shipped, shipped, text)
    assert (itself["expert_format"], itself["reference_format"]) == ("mxfp4", "bf16")
    assert itself["top1_agreement"] == 1.0 and itself["mean_cosine"] > 0.99999
    assert abs(itself["perplexity"] / itself["reference_perplexity"] - 1) < 1e-4
    _convert(capsys, shipped, tmp_path / "int4", "--weights", "int4", "--group-size", "32")
    int4 = _eval(capsys, tmp_path / "int4", shipped, text)
    assert (int4["expert_format"], int4["reference_format"]) == ("int4", "bf16")
    assert 0.9 < int4["mean_cosine"] < 1.0 and int4["reference_perplexity"] == pytest.approx(itself["reference_perplexity"])
