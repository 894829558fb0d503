"""What is loaded is what was written: dtypes, finite values, index paths and converted-folder checksums."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, EngineConfig, LLMEngine
from engine.checkpoint import integrity
from engine.checkpoint.converted import ConvertedSource, convert_command
from engine.errors import ModelLoadError, UnsupportedModelError
from main import main
from tests.engine.conftest import run_cli

ATTN = "model.layers.0.self_attn.o_proj.weight"        # a resident matrix
NORM = "model.layers.1.post_attention_layernorm.weight"  # a resident vector
EXPERT = "model.layers.2.mlp.experts.5.down_proj.weight"  # a routed expert


def _edit(folder, **tensors):
    f = folder / "model.safetensors"
    state = load_file(f)
    state.update(tensors)
    save_file(state, f)
    return f


def _one_error_line(err: str) -> str:
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


# ---- dtypes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,dtype", [(ATTN, torch.int32), (NORM, torch.bool), (EXPERT, torch.int8)])
def test_a_non_float_tensor_is_refused_at_load_and_at_convert(capsys, model, tmp_path, name, dtype):
    shape = load_file(model / "model.safetensors")[name].shape
    f = _edit(model, **{name: torch.zeros(shape, dtype=dtype)})
    kind = str(dtype).removeprefix("torch.")
    expected = (f"error: {f}: tensor '{name}' is {kind} but Qwen3MoeForCausalLM weights are floating point "
                "(bfloat16, float16, float32); the file is damaged or holds other data — fetch it again")
    assert run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi") == (2, expected)
    assert run_cli(capsys, "convert", str(model), str(tmp_path / "out"), "--weights", "fp8") == (2, expected)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_an_fp8_tensor_without_a_block_scale_is_refused_as_unsupported(model):
    shape = load_file(model / "model.safetensors")[ATTN].shape
    _edit(model, **{ATTN: torch.zeros(shape).to(torch.float8_e4m3fn)})
    with pytest.raises(UnsupportedModelError, match=r"is stored as float8_e4m3fn without a block scale"):
        LLM(str(model), device="cpu")


def test_half_and_mixed_precision_checkpoints_load(model):
    """Floating dtypes other than the config's are fine: a norm kept in float32 beside bfloat16 matrices."""
    state = load_file(model / "model.safetensors")
    ref = LLM(str(model), device="cpu", dtype="bfloat16").score([1, 2, 3])
    save_file({k: v if "norm" in k else v.to(torch.bfloat16) for k, v in state.items()}, model / "model.safetensors")
    mixed = LLM(str(model), device="cpu", dtype="bfloat16").score([1, 2, 3])
    assert torch.allclose(mixed, ref, atol=0.2)
    save_file({k: v.to(torch.float16) for k, v in state.items()}, model / "model.safetensors")
    assert LLM(str(model), device="cpu").score([1, 2, 3]).isfinite().all()


# ---- non-finite weights ------------------------------------------------------------------------

@pytest.mark.parametrize("name,value", [(ATTN, float("nan")), (NORM, float("inf")), (EXPERT, float("-inf"))])
def test_non_finite_weights_are_refused_at_load_naming_the_tensor(capsys, model, name, value):
    t = load_file(model / "model.safetensors")[name]
    t.view(-1)[3] = value
    f = _edit(model, **{name: t})
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2
    assert _one_error_line(err) == (f"error: {f}: tensor '{name}' holds 1 NaN or infinite value; the weights are "
                                    "damaged — fetch the checkpoint again (Strata refuses to load them)")


@pytest.mark.parametrize("weights", ["int4", "fp8", "bf16"])
@pytest.mark.parametrize("name", [NORM, EXPERT])
def test_convert_refuses_non_finite_weights_and_never_says_verified(capsys, model, tmp_path, weights, name):
    t = load_file(model / "model.safetensors")[name]
    t.view(-1)[:2] = float("nan")
    _edit(model, **{name: t})
    code = main(["convert", str(model), str(tmp_path / "out"), "--weights", weights, "--group-size", "32"])
    out, err = capsys.readouterr()
    assert code == 2 and "verified" not in out
    assert f"tensor '{name}' holds 2 NaN or infinite values" in _one_error_line(err.strip())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]     # nothing written, nothing left behind


def test_finite_weights_that_overflow_float16_are_refused(model):
    t = load_file(model / "model.safetensors")[NORM]
    t[0] = 1e6                                     # finite in float32, beyond float16's 65504
    _edit(model, **{NORM: t})
    with pytest.raises(ModelLoadError, match=rf"tensor '{NORM}' holds values up to 1e\+06, beyond what float16 can "
                                             r"hold; load it with dtype bfloat16 or float32 \(--dtype\)"):
        LLM(str(model), device="cpu", dtype="float16")
    assert LLM(str(model), device="cpu", dtype="float32").score([1, 2, 3]).isfinite().all()


def _fuse_experts(folder, layers=3, experts=8):
    """Rewrite the checkpoint with each layer's experts fused ([E, 2F, D] and [E, D, F]), as newer exports do."""
    state = load_file(folder / "model.safetensors")
    for i in range(layers):
        p = f"model.layers.{i}.mlp.experts"
        parts = [[state.pop(f"{p}.{e}.{n}_proj.weight") for n in ("gate", "up", "down")] for e in range(experts)]
        state[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u], 0) for g, u, _ in parts])
        state[f"{p}.down_proj"] = torch.stack([d for _, _, d in parts])
    save_file(state, folder / "model.safetensors")
    return state


def test_fused_experts_load_and_are_checked(model):
    ref = LLM(str(model), device="cpu").score([1, 2, 3, 4])
    state = _fuse_experts(model)
    assert torch.allclose(LLM(str(model), device="cpu").score([1, 2, 3, 4]), ref, atol=1e-5)
    name = "model.layers.1.mlp.experts.down_proj"
    state[name][2, 0, 0] = float("nan")
    save_file(state, model / "model.safetensors")
    with pytest.raises(ModelLoadError, match=rf"tensor '{name}' holds 1 NaN or infinite value"):
        LLM(str(model), device="cpu")
    state[name] = state[name][:, :, :7].contiguous()
    save_file(state, model / "model.safetensors")
    with pytest.raises(ModelLoadError, match=rf"tensor '{name}' has shape \[8, 64, 7\] but config.json implies \[8, 64, 32\]"):
        LLM(str(model), device="cpu")


# ---- the shard index ---------------------------------------------------------------------------

def _shard(folder, files: dict[str, list[str]] | None = None):
    """Split model.safetensors into two shards; returns the weight map (tensor -> shard file)."""
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for part, keys in enumerate((names[:half], names[half:]), 1):
        shard = f"model-0000{part}-of-00002.safetensors"
        save_file({k: state[k] for k in keys}, folder / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    return weight_map


def _index(folder, weight_map):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder / "model.safetensors.index.json"


@pytest.mark.parametrize("bad,found", [
    (lambda wm: sorted(wm.items()), "a 'weight_map' that is a list"),
    (lambda wm: list(wm.values()), "a 'weight_map' that is a list"),
    (lambda wm: "model-00001-of-00002.safetensors", "a 'weight_map' that is a str"),
    (lambda wm: None, "no 'weight_map'"),
])
def test_an_index_whose_weight_map_is_not_an_object_is_refused(capsys, model, tmp_path, bad, found):
    index = _index(model, bad(_shard(model)))
    expected = (f"error: {index} has {found}, expected an object mapping tensor names to shard files; restore it "
                "from the original checkpoint")
    assert run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi") == (2, expected)
    assert run_cli(capsys, "convert", str(model), str(tmp_path / "out"), "--weights", "fp8") == (2, expected)


def test_an_index_with_a_shard_that_is_not_a_name_is_refused(capsys, model):
    wm = _shard(model)
    wm[ATTN] = 7
    index = _index(model, wm)
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert (code, err) == (2, f"error: {index}: tensor '{ATTN}' maps to 7, expected a shard file name; restore it "
                              "from the original checkpoint")


@pytest.mark.parametrize("where", ["absolute", "parent", "linked folder"])
def test_an_index_naming_a_file_outside_the_model_folder_is_refused(capsys, model, tmp_path, where):
    wm = _shard(model)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(model / "model-00002-of-00002.safetensors", outside / "model-00002-of-00002.safetensors")
    name = {"absolute": str(outside / "model-00002-of-00002.safetensors"),
            "parent": "../elsewhere/model-00002-of-00002.safetensors",
            "linked folder": "link/model-00002-of-00002.safetensors"}[where]
    (model / "link").symlink_to(outside, target_is_directory=True)
    index = _index(model, {k: name if v.startswith("model-00002") else v for k, v in wm.items()})
    code, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2
    reason = "whose folder links outside the model folder" if where == "linked folder" else "which is outside the model folder"
    assert _one_error_line(err) == (f"error: {index} names shard '{name}', {reason}; shards must be files inside "
                                    f"{model} — restore the index from the original checkpoint")


def test_shards_that_are_symbolic_links_load_as_in_the_hugging_face_cache(model, tmp_path):
    """The cache keeps each shard as a link into a blobs folder beside the snapshot: that is not an escape."""
    ref = LLM(str(model), device="cpu").score([1, 2, 3])
    wm = _shard(model)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for shard in set(wm.values()):
        shutil.move(model / shard, blobs / shard)
        (model / shard).symlink_to(os.path.relpath(blobs / shard, model))
    _index(model, wm)
    assert torch.equal(LLM(str(model), device="cpu").score([1, 2, 3]), ref)


def test_an_index_that_is_not_an_object_or_lists_nothing_is_refused(model):
    _shard(model)
    (model / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="has no 'weight_map'"):
        LLM(str(model), device="cpu")
    _index(model, {})
    with pytest.raises(ModelLoadError, match="'weight_map' lists no tensors"):
        LLM(str(model), device="cpu")


# ---- converted-folder checksums ----------------------------------------------------------------

@pytest.fixture
def hashes(monkeypatch):
    """Names of the files hashed by load-time verification, in order."""
    seen: list[str] = []
    real = integrity.file_sha256

    def counting(path, *a, **k):
        seen.append(path.name)
        return real(path, *a, **k)
    monkeypatch.setattr(integrity, "file_sha256", counting)
    return seen


def _flip_byte(f, at: int = -100, keep_mtime: bool = False):
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[at] ^= 0x5A
    f.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


LISTED = ["resident.safetensors", "experts-0000.safetensors", "experts-0001.safetensors", "experts-0002.safetensors"]


def test_first_load_hashes_every_listed_file_and_later_loads_none(conversion, hashes):
    LLM(str(conversion), device="cpu")
    assert sorted(hashes) == sorted(LISTED)
    hashes.clear()
    ref = LLM(str(conversion), device="cpu").score([1, 2, 3])
    assert hashes == []
    assert LLM(str(conversion), device="cpu", verify=True).score([1, 2, 3]).equal(ref)   # --verify: all again
    assert sorted(hashes) == sorted(LISTED)


def test_a_corrupted_expert_byte_fails_the_first_load(capsys, conversion, good_model):
    _flip_byte(conversion / "experts-0001.safetensors")
    code, err = run_cli(capsys, "generate", "--model", str(conversion), "--prompt", "hi")
    assert code == 2
    assert _one_error_line(err) == (
        f"error: {conversion / 'experts-0001.safetensors'} does not match its SHA-256 in strata.json: the file was "
        f"changed or damaged on disk; restore the folder from a copy or convert again: {convert_command()} "
        f"{good_model.resolve()} {conversion} --weights fp8 --force")
    remembered = json.loads((conversion / integrity.RECORD).read_text())["files"]
    assert "experts-0001.safetensors" not in remembered and "experts-0000.safetensors" in remembered


def test_a_change_after_a_good_load_is_found_even_with_the_old_mtime_restored(conversion, hashes):
    LLM(str(conversion), device="cpu")
    hashes.clear()
    _flip_byte(conversion / "experts-0002.safetensors", keep_mtime=True)
    with pytest.raises(ModelLoadError, match="experts-0002.safetensors does not match its SHA-256"):
        LLM(str(conversion), device="cpu")
    assert hashes == ["experts-0002.safetensors"]           # only the changed file was read again
    with pytest.raises(ModelLoadError, match="experts-0002.safetensors does not match"):   # and it stays refused
        LLM(str(conversion), device="cpu")


def test_a_touched_but_intact_file_is_hashed_again_and_remembered(conversion, hashes):
    LLM(str(conversion), device="cpu")
    os.utime(conversion / "resident.safetensors")
    hashes.clear()
    LLM(str(conversion), device="cpu")
    assert hashes == ["resident.safetensors"]
    hashes.clear()
    LLM(str(conversion), device="cpu")
    assert hashes == []


def test_a_copied_folder_is_verified_again(conversion, tmp_path, hashes):
    LLM(str(conversion), device="cpu")
    copy = shutil.copytree(conversion, tmp_path / "copy")      # same sizes and mtimes, new files
    hashes.clear()
    LLM(str(copy), device="cpu")
    assert sorted(hashes) == sorted(LISTED)


@pytest.mark.parametrize("record", ["not json", "[]", '{"version": 1, "files": []}', '{"version": 99, "files": {}}'])
def test_an_unusable_record_is_ignored(conversion, hashes, record):
    (conversion / integrity.RECORD).write_text(record)
    LLM(str(conversion), device="cpu")
    assert sorted(hashes) == sorted(LISTED)
    assert json.loads((conversion / integrity.RECORD).read_text())["version"] == integrity.RECORD_VERSION


def test_a_record_with_the_wrong_digest_is_not_trusted(conversion, hashes):
    """The record vouches for a file only under the digest the manifest holds now."""
    LLM(str(conversion), device="cpu")
    manifest = json.loads((conversion / "strata.json").read_text())
    manifest["files"]["experts-0000.safetensors"] = "0" * 64
    (conversion / "strata.json").write_text(json.dumps(manifest))
    hashes.clear()
    with pytest.raises(ModelLoadError, match="experts-0000.safetensors does not match its SHA-256"):
        LLM(str(conversion), device="cpu")
    assert hashes == ["experts-0000.safetensors"]


def _make_read_only(folder) -> bool:
    folder.chmod(0o555)
    probe = folder / ".probe"
    try:
        probe.touch()
    except OSError:
        return True
    probe.unlink()
    folder.chmod(0o755)
    return subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0


def test_a_read_only_folder_loads_and_is_verified_every_time(conversion, hashes):
    if not _make_read_only(conversion):
        pytest.skip("cannot make a folder read-only here")
    try:
        src = ConvertedSource(conversion)
        assert not src.checksums.saved and sorted(src.checksums.hashed) == sorted(LISTED)
        notes = LLM(str(conversion), device="cpu").engine.model_info.notes
        assert sorted(hashes) == sorted(LISTED * 2)      # nothing could be remembered
        assert any("cannot be written, so the good checksums were not remembered" in n for n in notes)
    finally:
        subprocess.run(["chattr", "-i", str(conversion)], capture_output=True)
        conversion.chmod(0o755)
    assert not (conversion / integrity.RECORD).exists()


def test_a_missing_listed_file_is_named(conversion):
    (conversion / "experts-0002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"experts-0002.safetensors is missing; the converted folder is "
                                             r"incomplete; restore the folder from a copy or convert again"):
        LLM(str(conversion), device="cpu")


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["files"].pop("experts-0001.safetensors"), "lists no SHA-256 for experts-0001.safetensors"),
    (lambda m: m["files"].update({"../x.safetensors": "0" * 64}), "is not a file name inside the folder"),
    (lambda m: m["files"].update({"resident.safetensors": "abc"}), "is not a file name inside the folder with a SHA-256"),
    (lambda m: m.update(files=["resident.safetensors"]), "'files' must map each written file to its SHA-256"),
    (lambda m: m.update(group_size="128"), "field 'group_size' is '128', expected a whole number"),
    (lambda m: m.pop("num_experts"), "field 'num_experts' is None, expected a whole number"),
    (lambda m: m.update(weights="int3"), "field 'weights' is 'int3', expected one of"),
    (lambda m: m.update(format_version="1"), "is not a Strata manifest"),
])
def test_a_manifest_field_that_is_wrong_gives_one_line(capsys, conversion, edit, message):
    manifest = json.loads((conversion / "strata.json").read_text())
    edit(manifest)
    (conversion / "strata.json").write_text(json.dumps(manifest))
    code, err = run_cli(capsys, "generate", "--model", str(conversion), "--prompt", "hi")
    assert code == 2 and message in _one_error_line(err)


def test_the_advice_to_convert_again_repeats_the_original_settings(tmp_path):
    from engine.checkpoint.converted import Manifest
    m = Manifest("int4", 32, 3, 8, 1024, [], {}, source=str(tmp_path / "my model"), resident="fp8")
    assert m.reconvert(tmp_path / "out") == (f"{convert_command()} '{tmp_path / 'my model'}' {tmp_path / 'out'} "
                                             "--weights int4 --group-size 32 --resident-weights fp8 --force")


def test_a_first_load_reports_its_checksum_progress_and_later_loads_none(conversion):
    seen: list[tuple[int, int, str]] = []
    LLMEngine(EngineConfig(model=str(conversion), device="cpu"), progress=lambda *a: seen.append(a))
    assert seen and seen[-1][0] == seen[-1][1] == sum((conversion / n).stat().st_size for n in LISTED)
    assert {name for _, _, name in seen} == set(LISTED)
    again: list[tuple[int, int, str]] = []
    engine = LLMEngine(EngineConfig(model=str(conversion), device="cpu"), progress=lambda *a: again.append(a))
    assert again == [] and engine.model_info.notes == ()


def test_verify_on_a_hugging_face_folder_is_noted_as_meaning_nothing(model):
    notes = LLMEngine(EngineConfig(model=str(model), device="cpu", verify=True)).model_info.notes
    assert any(f"verify checks the checksums of a folder written by {convert_command()}" in n for n in notes)
