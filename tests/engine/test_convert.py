"""main.py convert: int4 / fp8 / bf16 converted folders load, stay close to the source, and bad input is refused."""
from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from engine import LLM
from main import main
from tiny_models import build_tiny_model

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7], [1, 99, 4, 18]]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    # hidden and expert FFN of 128 so that every int4 group size (32/64/128) divides K
    return build_tiny_model(tmp_path_factory.mktemp("conv") / "src", "qwen3_moe", wide=True)


@pytest.fixture(scope="module")
def reference(src):
    return LLM(str(src), device="cpu").engine.score_batch(PROMPTS)


def _cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Mean over positions of the cosine similarity of the logit vectors.

    The mean, not the minimum: a quantised router score can flip a near-tie in the top-k choice of one
    token of a random model, which moves that one position a lot and says little about the format.
    """
    x, y = torch.cat(a), torch.cat(b)
    return float(torch.nn.functional.cosine_similarity(x, y, dim=-1).mean())


@pytest.mark.parametrize("weights,group,min_cos", [
    ("fp8", 128, 0.99),      # target of the quantisation issue
    ("int4", 128, 0.98),     # target of the quantisation issue
    ("int4", 32, 0.98),      # smaller groups must be at least as good
    ("bf16", 128, 0.9999),   # lossless up to bf16 rounding
])
def test_converted_logits_stay_close(src, reference, tmp_path, weights, group, min_cos):
    dst = tmp_path / f"{weights}-{group}"
    assert main(["convert", str(src), str(dst), "--weights", weights, "--group-size", str(group)]) == 0
    manifest = json.loads((dst / "strata.json").read_text())
    assert manifest["weights"] == weights and manifest["format_version"] == 1
    assert set(manifest["files"]) == {"resident.safetensors"} | {f"experts-{i:04d}.safetensors" for i in range(3)}
    llm = LLM(str(dst), device="cpu")
    assert llm.engine.model_info.expert_format == weights
    assert _cosine(llm.engine.score_batch(PROMPTS), reference) >= min_cos


def test_quantising_at_load_equals_the_converted_folder(src, tmp_path):
    """--weight-format int4 at load and a converted int4 folder give the same logits."""
    dst = tmp_path / "int4"
    assert main(["convert", str(src), str(dst), "--weights", "int4"]) == 0
    # bf16 compute: the converted folder stores resident weights in bf16
    a = LLM(str(dst), device="cpu", dtype="bfloat16").score(PROMPTS[0])
    b = LLM(str(src), device="cpu", dtype="bfloat16", weight_format="int4").score(PROMPTS[0])
    assert torch.equal(a, b)


def test_fp8_resident_weights(src, reference, tmp_path):
    dst = tmp_path / "fp8res"
    assert main(["convert", str(src), str(dst), "--weights", "int4", "--resident-weights", "fp8"]) == 0
    assert _cosine(LLM(str(dst), device="cpu").engine.score_batch(PROMPTS), reference) >= 0.97


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_converted_files_get_the_permissions_of_any_new_file(src, tmp_path, mask):
    # Under umask 022 a converted model is readable by every user like the checkpoint it came from;
    # under 077 by its owner only: every file follows the umask, the weight files included.
    dst = tmp_path / "shared"
    old = os.umask(mask)
    try:
        assert main(["convert", str(src), str(dst), "--weights", "int4"]) == 0
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in dst.iterdir()}
    assert modes["resident.safetensors"] == modes["experts-0000.safetensors"] == 0o666 & ~mask, modes
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_convert_refuses_bad_input(src, tmp_path, capsys):
    def err(*argv):
        assert main(list(argv)) == 2
        return capsys.readouterr().err.strip()

    assert err("convert", str(src), str(tmp_path / "a"), "--weights", "int3") == \
        ("error: --weights 'int3' is not a known format; choose auto (MXFP4 experts stay as shipped, others "
         "become int4), int4, fp8, bf16 or mxfp4")
    small = build_tiny_model(tmp_path / "narrow", "qwen3_moe")          # expert FFN 32: group 128 cannot divide it
    assert "group size 128 does not divide the reduction dim" in err("convert", str(small), str(tmp_path / "b"),
                                                                     "--group-size", "128")
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    expected = (f"error: {out} already exists and holds other files (keep.txt); choose a new or empty folder "
                "(--force replaces only an earlier Strata conversion)")
    assert err("convert", str(src), str(out)) == expected
    assert err("convert", str(src), str(out), "--force") == expected     # the advice holds with --force too
    assert (out / "keep.txt").read_text() == "user data"


def test_the_default_int4_group_is_the_largest_that_fits_the_model(tmp_path, capsys):
    # expert FFN 32: groups of 128 and 64 cannot divide it, so the default takes 32 and says why
    small = build_tiny_model(tmp_path / "narrow", "qwen3_moe")
    assert main(["convert", str(small), str(tmp_path / "c")]) == 0
    captured = capsys.readouterr()
    assert "note: int4 groups of 32: 128 does not divide this model's expert widths" in captured.err
    assert "int4 experts (group 32)" in captured.out
    assert main(["generate", "--model", str(tmp_path / "c"), "--prompt", "hi", "--max-tokens", "2"]) == 0


def test_converted_folder_rejects_a_different_weight_format(src, tmp_path, capsys):
    dst = tmp_path / "fp8"
    assert main(["convert", str(src), str(dst), "--weights", "fp8"]) == 0
    assert main(["generate", "--model", str(dst), "--prompt", "hi", "--weight-format", "int4"]) == 2
    assert "holds fp8 experts" in capsys.readouterr().err


def test_a_group_size_for_experts_without_groups_is_noted_and_not_recorded(src, tmp_path, capsys):
    from main import main
    dst = tmp_path / "fp8"
    assert main(["convert", str(src), str(dst), "--weights", "fp8", "--group-size", "64"]) == 0
    err = capsys.readouterr().err
    assert "note: --group-size 64 applies to int4 experts only; fp8 experts have no groups, so it was ignored" in err
    assert json.loads((dst / "strata.json").read_text())["group_size"] == 128


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_routing_profile_gets_the_permissions_of_any_new_file(tmp_path, mask):
    from engine.experts.profile import read_routing_profile, write_routing_profile
    path = tmp_path / "profile.json"
    old = os.umask(mask)
    try:
        write_routing_profile(path, [[3, 1], [0, 2]])
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert read_routing_profile(path, 2, 2) == [[3, 1], [0, 2]]
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]        # no temporary file left
