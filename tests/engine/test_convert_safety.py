"""``convert`` never loses what a user owns: ``--force`` replaces only an earlier conversion, never the source
or anything else, every path is checked before work starts, and a failure leaves the destination as it was.
Also the paths and numbers ``eval`` takes."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.checkpoint import destination
from engine.checkpoint.destination import PARTIAL_MARKER
from main import main
from tests.engine.conftest import run_cli_one_line
from tiny_models import ROOT

FORCE_HINT = "(--force replaces only an earlier Strata conversion)"


def _convert(capsys, src, dst, *extra) -> tuple[int, str]:
    return run_cli_one_line(capsys, "convert", str(src), str(dst), "--weights", "fp8", *extra)


def _tree(folder) -> dict:
    """Every path under ``folder`` with its bytes (None for a folder): what must survive a refusal."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def _siblings(folder) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir())


# ---- --force replaces an earlier conversion, and only that ------------------------------------

def test_force_replaces_an_earlier_conversion_and_leaves_nothing_beside_it(capsys, src, tmp_path):
    dst = tmp_path / "out"
    assert _convert(capsys, src, dst) == (0, "")
    LLM(str(dst), device="cpu")                          # the first load leaves its checksum record inside
    assert run_cli_one_line(capsys, "convert", str(src), str(dst), "--weights", "bf16", "--force") == (0, "")
    assert json.loads((dst / "strata.json").read_text())["weights"] == "bf16"
    assert _siblings(dst) == ["models", "out"]           # no .partial, no moved-aside copy
    assert LLM(str(dst), device="cpu").engine.model_info.expert_format == "bf16"


def test_an_earlier_conversion_is_not_replaced_without_force(capsys, src, tmp_path):
    dst = tmp_path / "out"
    _convert(capsys, src, dst)
    before = _tree(dst)
    assert _convert(capsys, src, dst) == (2, f"error: {dst} holds an earlier Strata conversion; pass --force to "
                                             "replace it, or choose another folder")
    assert _tree(dst) == before


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("contents", [
    {"notes.txt": "mine"},
    {"photos/cat.jpg": "meow"},                                     # only a subfolder
    {"strata.json": "{}", "notes.txt": "mine"},                      # a strata.json that is not a manifest
    {"strata.json": "not json at all", "keep.bin": "x"},
])
def test_a_folder_that_is_not_a_conversion_is_never_replaced(capsys, src, tmp_path, force, contents):
    dst = tmp_path / "out"
    for name, text in contents.items():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_text(text)
    before = _tree(dst)
    code, err = _convert(capsys, src, dst, *(["--force"] if force else []))
    assert code == 2
    if "strata.json" in contents:
        assert err == (f"error: {dst} holds a strata.json that is not a Strata manifest, so it is not an earlier "
                       f"conversion; choose a new or empty folder {FORCE_HINT}")
    else:
        assert err == f"error: {dst} already exists and holds other files ({sorted(contents)[0].split('/')[0]}); " \
                      f"choose a new or empty folder {FORCE_HINT}"
    assert _tree(dst) == before and _siblings(dst) == ["models", "out"]


def test_a_conversion_holding_files_convert_did_not_write_is_not_replaced(capsys, src, tmp_path):
    dst = tmp_path / "out"
    _convert(capsys, src, dst)
    (dst / "my-notes.txt").write_text("results of a week")
    (dst / "evals").mkdir()
    before = _tree(dst)
    assert _convert(capsys, src, dst, "--force") == (
        2, f"error: {dst} is an earlier conversion but also holds evals, my-notes.txt, which convert did not write; "
           "move that out of it, or choose another folder")
    assert _tree(dst) == before


def test_an_empty_folder_is_filled(capsys, src, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    assert _convert(capsys, src, dst) == (0, "")
    assert (dst / "strata.json").is_file() and _siblings(dst) == ["models", "out"]


# ---- never the source -------------------------------------------------------------------------

@pytest.mark.parametrize("where,message", [
    ("src", "the destination {dst} is the source folder; choose another folder for the converted model"),
    ("parent", "the destination {dst} contains the source folder {src}; choose a destination outside it"),
    ("grandparent", "the destination {dst} contains the source folder {src}; choose a destination outside it"),
    ("inside", "the destination {dst} is inside the source folder {src}; choose a destination outside it"),
    ("link to src", "the destination {dst} is the source folder; choose another folder for the converted model"),
    ("link to parent", "the destination {dst} contains the source folder {src}; choose a destination outside it"),
    ("through a link", "the destination {dst} is inside the source folder {src}; choose a destination outside it"),
    ("dotdot", "the destination {dst} contains the source folder {src}; choose a destination outside it"),
])
def test_force_never_touches_a_folder_that_holds_the_source(capsys, src, tmp_path, where, message):
    (tmp_path / "link-src").symlink_to(src, target_is_directory=True)
    (tmp_path / "link-parent").symlink_to(src.parent, target_is_directory=True)
    dst = {"src": src, "parent": src.parent, "grandparent": tmp_path, "inside": src / "converted",
           "link to src": tmp_path / "link-src", "link to parent": tmp_path / "link-parent",
           "through a link": tmp_path / "link-src" / "out", "dotdot": src / ".." / ".."}[where]
    before = _tree(tmp_path / "models")
    code, err = _convert(capsys, src, dst, "--force")
    assert (code, err) == (2, "error: " + message.format(dst=dst, src=src.resolve()))
    assert _tree(tmp_path / "models") == before


def test_the_source_survives_a_real_process_asked_to_overwrite_its_parent(src):
    """The case that once deleted a model: DST = the parent of SRC with --force, as a user types it."""
    before = _tree(src.parent)
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "convert", str(src), str(src.parent), "--force"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: the destination {src.parent} contains the source folder "
                                        f"{src.resolve()}; choose a destination outside it"]
    assert _tree(src.parent) == before


# ---- the paths themselves ---------------------------------------------------------------------

@pytest.mark.parametrize("force", [False, True])
def test_a_destination_that_is_a_file_is_refused(capsys, src, tmp_path, force):
    dst = tmp_path / "out.txt"
    dst.write_text("a file of mine")
    assert _convert(capsys, src, dst, *(["--force"] if force else [])) == (
        2, f"error: {dst} is a file, not a folder; choose a folder path for the converted model (--force replaces "
           "only an earlier Strata conversion, never a file)")
    assert dst.read_text() == "a file of mine" and _siblings(dst) == ["models", "out.txt"]


@pytest.mark.parametrize("depth", [1, 3])
def test_a_destination_under_a_file_is_refused(capsys, src, tmp_path, depth):
    f = tmp_path / "a-file"
    f.write_text("x")
    dst = f.joinpath(*["sub"] * depth)
    assert _convert(capsys, src, dst) == (2, f"error: {f} is a file, so {dst} cannot be created inside it; choose "
                                             "a folder path for the converted model")
    assert f.read_text() == "x" and _siblings(f) == ["a-file", "models"]


def _unwritable(folder) -> bool:
    """Make ``folder`` unwritable, even for root (immutable attribute) where chmod does not bind."""
    folder.chmod(0o555)
    try:
        (folder / ".probe").mkdir()
    except OSError:
        return True
    (folder / ".probe").rmdir()
    folder.chmod(0o755)
    return subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0


@pytest.mark.parametrize("nested", [False, True])
def test_a_destination_that_cannot_be_written_is_refused_before_any_work(capsys, src, tmp_path, nested):
    locked = tmp_path / "locked"
    locked.mkdir()
    if not _unwritable(locked):
        pytest.skip("cannot make a folder unwritable here")
    try:
        dst = locked / "a" / "b" if nested else locked / "out"
        code, err = _convert(capsys, src, dst)
        assert code == 2
        # os.access refuses it for a user; for root only the attempt to create the temporary folder does
        assert err in (f"error: cannot write in {locked} (permission denied); choose a destination in a folder you "
                       "can write to",
                       f"error: cannot write in {locked} (Operation not permitted); choose a destination in a "
                       "folder you can write to")
        assert list(locked.iterdir()) == []
    finally:
        subprocess.run(["chattr", "-i", str(locked)], capture_output=True)
        locked.chmod(0o755)


def test_missing_parent_folders_are_made_and_removed_again_if_the_conversion_fails(capsys, src, tmp_path):
    ok = tmp_path / "new" / "deeper" / "out"
    assert _convert(capsys, src, ok) == (0, "")
    assert (ok / "strata.json").is_file()
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    state = load_file(src / "model.safetensors")
    state[name][0, 0] = float("nan")
    save_file(state, src / "model.safetensors")
    code, err = _convert(capsys, src, tmp_path / "other" / "deeper" / "out")
    assert code == 2 and f"tensor '{name}' holds 1 NaN" in err
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("make,message", [
    (lambda p: None, "error: the source folder {src} does not exist; give the Hugging Face model folder to convert "
                     "(it holds config.json and *.safetensors)"),
    (lambda p: p.write_text("x"), "error: the source {src} is a file, not a folder; give the Hugging Face model "
                                  "folder that holds config.json and *.safetensors"),
])
def test_a_source_that_is_not_a_folder_is_refused(capsys, tmp_path, make, message):
    src = tmp_path / "model"
    make(src)
    assert _convert(capsys, src, tmp_path / "out") == (2, message.format(src=src))
    assert not (tmp_path / "out").exists()


def test_a_conversion_as_source_points_to_the_original(capsys, src, tmp_path):
    first = tmp_path / "first"
    _convert(capsys, src, first)
    assert _convert(capsys, first, tmp_path / "second") == (
        2, f"error: {first} is already a Strata conversion; convert the original Hugging Face folder "
           f"({src.resolve()}) instead")


# ---- a failure leaves the destination as it was -----------------------------------------------

def test_a_failed_conversion_keeps_the_earlier_one(capsys, src, tmp_path):
    dst = tmp_path / "out"
    _convert(capsys, src, dst)
    before = _tree(dst)
    state = load_file(src / "model.safetensors")
    state["model.norm.weight"][1] = float("inf")
    save_file(state, src / "model.safetensors")
    code, err = _convert(capsys, src, dst, "--force")
    assert code == 2 and "tensor 'model.norm.weight' holds 1 NaN or infinite value" in err
    assert _tree(dst) == before and _siblings(dst) == ["models", "out"]


def test_a_failed_swap_puts_the_earlier_conversion_back(capsys, src, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    _convert(capsys, src, dst)
    before = _tree(dst)
    real_rename = os.rename

    def rename(a, b):
        if str(a).endswith(".partial"):
            raise OSError(5, "Input/output error", str(a))
        real_rename(a, b)
    monkeypatch.setattr(destination.os, "rename", rename)
    code, err = _convert(capsys, src, dst, "--force")
    assert code == 2 and err.startswith(f"error: writing the conversion for {dst} failed: Input/output error")
    assert _tree(dst) == before and _siblings(dst) == ["models", "out"]


def test_a_full_disk_leaves_nothing_behind(src, tmp_path):
    """A real process whose writes fail (a file-size limit stands in for a full disk): one line, nothing left."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    dst = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "convert", str(src), str(dst), "--weights", "fp8"],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: writing the conversion for {dst} failed: ")
    assert lines[0].endswith(f"free disk space or choose another destination — {dst} was left as it was")
    assert _siblings(dst) == ["models"]


def test_an_abandoned_temporary_folder_of_ours_is_reused_and_anything_else_is_kept(capsys, src, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ours = tmp_path / "a.partial"
    ours.mkdir()
    (ours / PARTIAL_MARKER).write_text(json.dumps({"pid": gone.pid, "host": os.uname().nodename}))
    (ours / "resident.safetensors").write_text("half written")
    assert _convert(capsys, src, tmp_path / "a") == (0, "")
    assert _siblings(ours) == ["a", "models"]
    theirs = tmp_path / "b.partial"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("do not delete")
    assert _convert(capsys, src, tmp_path / "b") == (0, "")
    assert (theirs / "thesis.tex").read_text() == "do not delete"
    assert _siblings(ours) == ["a", "b", "b.partial", "models"]


# ---- eval -------------------------------------------------------------------------------------

@pytest.fixture
def text(tmp_path):
    f = tmp_path / "text.txt"
    f.write_text("the quick brown fox jumps over the lazy dog " * 150)
    return f


@pytest.mark.parametrize("flags,message", [
    (["--window", "0"], "--window 0 is too small; a window scores its tokens after the first, so give at least 2 "
                        "(default 256)"),
    (["--window", "-5"], "--window -5 is too small"),
    (["--window", "1"], "--window 1 is too small"),
    (["--max-tokens", "0"], "--max-tokens 0 is too small; give at least 2, or leave it out to score the whole text"),
    (["--max-tokens", "-3"], "--max-tokens -3 is too small"),
    (["--reference", "/nonexistent/ref"], "--reference /nonexistent/ref does not exist; give the folder of the model "
                                          "to compare with (e.g. the unquantised source)"),
])
def test_eval_refuses_numbers_and_paths_that_cannot_work(capsys, good_model, text, flags, message):
    code, err = run_cli_one_line(capsys, "eval", "--model", str(good_model), "--text", str(text), "--device", "cpu",
                                 *flags)
    assert code == 2 and err.startswith("error: " + message)


def test_eval_text_must_be_a_readable_utf8_file(capsys, good_model, tmp_path):
    def err_for(path):
        return run_cli_one_line(capsys, "eval", "--model", str(good_model), "--text", str(path), "--device", "cpu")
    assert err_for(tmp_path / "nope.txt") == (2, f"error: --text {tmp_path / 'nope.txt'} does not exist; give a UTF-8 "
                                                 "text file")
    assert err_for(tmp_path) == (2, f"error: --text {tmp_path} is a folder; give a UTF-8 text file")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ol\xe9".encode("latin-1"))
    assert err_for(tmp_path / "latin1.txt") == (2, f"error: --text {tmp_path / 'latin1.txt'} is not UTF-8 text (byte "
                                                   "3 cannot be decoded); save it as UTF-8")


def test_eval_window_longer_than_the_context_is_refused(capsys, good_model, text):
    code, err = run_cli_one_line(capsys, "eval", "--model", str(good_model), "--text", str(text), "--device", "cpu",
                                 "--window", "5000")
    assert code == 2 and "does not fit the context of m (512 tokens); choose a window (--window) of at most 512" in err
    assert "a window of 5000 tokens" in err                 # the window asked for, whatever the text's length


def test_eval_with_a_reference_of_another_vocabulary_is_refused(capsys, good_model, text, tmp_path):
    other = shutil.copytree(good_model, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 256
    (other / "config.json").write_text(json.dumps(cfg))
    state = load_file(other / "model.safetensors")
    save_file({k: v[:256].contiguous() if k in ("model.embed_tokens.weight", "lm_head.weight") else v
               for k, v in state.items()}, other / "model.safetensors")
    code, err = run_cli_one_line(capsys, "eval", "--model", str(good_model), "--text", str(text), "--device", "cpu",
                                 "--reference", str(other))
    assert code == 2 and "has a vocabulary of 256 tokens but m has 512" in err


def test_eval_scores_a_text(capsys, good_model, text):
    assert main(["eval", "--model", str(good_model), "--text", str(text), "--device", "cpu", "--window", "64",
                 "--max-tokens", "100", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] > 0 and r["perplexity"] > 1
    # 100 tokens in windows of 64: the first of each is context only, and the line says so
    assert r["text_tokens"] == 100 and r["tokens"] == 98
    assert main(["eval", "--model", str(good_model), "--text", str(text), "--device", "cpu", "--window", "64",
                 "--max-tokens", "100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tokens 98 scored of 100 (each window's first is its context)  perplexity ")


def test_eval_of_a_conversion_against_another_model_than_its_source_says_so(capsys, good_model, good_conversion,
                                                                         text, tmp_path):
    other = shutil.copytree(good_model, tmp_path / "other")           # same shape, not the source
    args = ["eval", "--model", str(good_conversion), "--text", str(text), "--device", "cpu", "--max-tokens", "40",
            "--json"]
    assert main(args + ["--reference", str(other)]) == 0
    err = capsys.readouterr().err
    assert f"note: {good_conversion} was converted from {good_model}, not from the reference {other}" in err
    assert main(args + ["--reference", str(good_model)]) == 0
    assert "was converted from" not in capsys.readouterr().err
