"""A model folder or file the user may not read, a full disk and a broken manifest are each one line that names
the real cause and a fix that works where it is shown: permissions are fixed by permissions (never by fetching
or converting again), and the command to convert again is the one the user ran, usable from where they are.

File modes bind root only without its capabilities to override them: the permission cases run the command line
in a child process that drops those (as ``setpriv --bounding-set=-dac_override,-dac_read_search`` does), so they
run as a user and as root alike; causes no test can make for real (a full disk, an I/O error) are injected."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engine import LLM
from engine.checkpoint import converted, destination, integrity
from engine.checkpoint.converted import ConvertedSource, convert_command
from engine.errors import ModelLoadError
from tests.engine.conftest import run_cli_one_line
from tiny_models import ROOT

DENIED_FOLDER = "cannot be read (permission denied); check its permissions: you need read and execute access to it"
DENIED_FILE = "cannot be read (permission denied); check its permissions: you need read access to it"
NOT_LISTED = "cannot be listed (permission denied), so its weight files cannot be found; check its permissions"


# ---- a folder or file this user may not read (file modes, in a child process) -------------------

# Runs each command line in one process and prints [exit code, stderr] for each; "unguarded" where a file mode
# did not stop the probe read (the modes do not bind here), "traceback" for an exception main() let out.
_DRIVER = """
import contextlib, io, json, sys, traceback
sys.path.insert(0, sys.argv[1])
try:
    open(sys.argv[3], "rb").close()
    print(json.dumps("unguarded"))
    sys.exit(0)
except PermissionError:
    pass
from main import main
out = []
for argv in json.loads(sys.argv[2]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except BaseException:
        code = "traceback"
        err.write(traceback.format_exc())
    out.append([code, err.getvalue().strip()])
print(json.dumps(out))
"""


def _as_a_user() -> None:
    """In the child: drop root's override of file modes from the bounding set, so the program it starts has none."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):                   # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, cap, 0, 0, 0)     # PR_CAPBSET_DROP


def _run_denied(tmp_path: Path, *calls: list[str]) -> list[tuple[int, str]]:
    """Each command line's exit code and stderr, from a process whose file modes bind (skips where none can)."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        proc = subprocess.run([sys.executable, "-c", _DRIVER, str(ROOT), json.dumps([list(c) for c in calls]),
                               str(probe)], capture_output=True, text=True, timeout=240, preexec_fn=_as_a_user,
                              stdin=subprocess.DEVNULL, cwd=tmp_path)
    finally:
        probe.chmod(0o644)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    if result == "unguarded":
        pytest.skip("file modes do not bind here (root that cannot drop its capabilities)")
    return [(code, err) for code, err in result]


@pytest.fixture
def locked():
    """Set a path's mode for the test; every mode set is put back after it, so the folders can be removed."""
    modes: list[tuple[Path, int]] = []

    def lock(path: Path, mode: int) -> Path:
        modes.append((path, stat.S_IMODE(path.stat().st_mode)))
        path.chmod(mode)
        return path
    yield lock
    for path, mode in reversed(modes):
        path.chmod(mode)


def test_a_model_folder_that_cannot_be_read_is_one_line_in_every_command(model, conversion, tmp_path, locked):
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.")
    locked(model, 0)
    locked(conversion, 0)
    out = tmp_path / "out"
    results = _run_denied(tmp_path, ["info", "--model", str(model)],
                          ["generate", "--model", str(model), "--prompt", "hi"],
                          ["chat", "--model", str(model)],
                          ["eval", "--model", str(model), "--text", str(text)],
                          ["convert", str(model), str(out)],
                          ["generate", "--model", str(conversion), "--prompt", "hi"],
                          ["info", "--model", str(conversion)])
    for folder, (code, err) in zip([model] * 5 + [conversion] * 2, results):
        assert (code, err) == (2, f"error: the model folder {folder} {DENIED_FOLDER}")
    assert not out.exists()


def test_a_folder_that_can_be_entered_but_not_listed_says_so(model, tmp_path, locked):
    locked(model, 0o100)
    (gen_code, gen), (info_code, info), (conv_code, conv) = _run_denied(
        tmp_path, ["generate", "--model", str(model), "--prompt", "hi"], ["info", "--model", str(model)],
        ["convert", str(model), str(tmp_path / "out")])
    assert gen_code == conv_code == 2 and info_code == 0       # info plans from config.json and notes the rest
    assert gen.startswith(f"error: the model folder {model} {NOT_LISTED}")
    assert conv.startswith(f"error: the model folder {model.resolve()} {NOT_LISTED}")
    assert f"loading this folder would fail: the model folder {model} {NOT_LISTED}" in info
    assert "safetensors weights in" not in gen + info + conv          # the cause is the mode, not missing weights


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_file_of_the_checkpoint_that_cannot_be_read_is_named_with_its_permission(model, tmp_path, locked, name):
    locked(model / name, 0)
    (code, err), (conv_code, conv) = _run_denied(tmp_path, ["generate", "--model", str(model), "--prompt", "hi"],
                                                 ["convert", str(model), str(tmp_path / "out")])
    assert (code, err) == (2, f"error: {model / name} {DENIED_FILE}")
    assert (conv_code, conv) == (2, f"error: {model.resolve() / name} {DENIED_FILE}")
    assert not (tmp_path / "out").exists()


def test_a_converted_file_that_cannot_be_read_is_not_called_damaged(conversion, tmp_path, locked):
    locked(conversion / "experts-0001.safetensors", 0)
    [(code, err)] = _run_denied(tmp_path, ["generate", "--model", str(conversion), "--prompt", "hi"])
    assert (code, err) == (2, f"error: {conversion / 'experts-0001.safetensors'} {DENIED_FILE}")


@pytest.mark.parametrize("error,cause,fix", [
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied", "check its permissions"),
    (OSError(errno.EIO, "Input/output error"), "Input/output error",
     "check the disk it is on, then restore the folder from a copy or convert again: "),
])
def test_a_converted_file_the_check_cannot_read_names_the_cause_not_a_mismatch(conversion, monkeypatch, error, cause,
                                                                               fix):
    real = integrity.file_sha256

    def sha256(path, *args):
        if path.name == "experts-0001.safetensors":
            raise error
        return real(path, *args)
    monkeypatch.setattr(integrity, "file_sha256", sha256)
    with pytest.raises(ModelLoadError) as e:
        ConvertedSource(conversion)
    assert str(e.value).startswith(f"{conversion / 'experts-0001.safetensors'} cannot be read ({cause}); {fix}")
    assert "SHA-256" not in str(e.value) and "damaged" not in str(e.value)
    remembered = json.loads((conversion / integrity.RECORD).read_text())["files"]
    assert "experts-0001.safetensors" not in remembered and "experts-0000.safetensors" in remembered


# ---- a manifest that cannot be read: the advice works ------------------------------------------

def test_a_broken_manifest_is_converted_again_into_a_new_folder_and_the_broken_one_is_kept(capsys, model, conversion,
                                                                                          tmp_path):
    (conversion / "strata.json").write_text("{\n")
    before = {p.name: p.read_bytes() for p in conversion.iterdir()}
    code, err = run_cli_one_line(capsys, "generate", "--model", str(conversion), "--prompt", "hi")
    fix = f"convert the source model again into a new folder: {convert_command()} SRC NEW_FOLDER"
    assert code == 2 and err.startswith(f"error: {conversion / 'strata.json'} is not valid JSON (")
    assert err.endswith(fix)
    # --force replaces only a folder whose manifest says what convert wrote there: this one is left as it is
    code, err = run_cli_one_line(capsys, "convert", str(model), str(conversion), "--force")
    assert code == 2 and "choose a new or empty folder" in err
    assert {p.name: p.read_bytes() for p in conversion.iterdir()} == before
    new = tmp_path / "new"
    assert run_cli_one_line(capsys, "convert", str(model), str(new), "--weights", "fp8") == (0, "")
    LLM(str(new), device="cpu")


def test_a_manifest_with_a_wrong_field_names_a_command_that_replaces_it(capsys, good_model, conversion):
    manifest = json.loads((conversion / "strata.json").read_text())
    manifest["group_size"] = "128"
    (conversion / "strata.json").write_text(json.dumps(manifest))
    code, err = run_cli_one_line(capsys, "generate", "--model", str(conversion), "--prompt", "hi")
    command = f"{convert_command()} {good_model.resolve()} {conversion} --weights fp8 --force"
    assert code == 2 and err.endswith(f"; convert again: {command}")
    assert run_cli_one_line(capsys, *command.split()[command.split().index("convert"):]) == (0, "")
    LLM(str(conversion), device="cpu")


def test_a_manifest_that_cannot_be_read_says_so(conversion, tmp_path, locked):
    locked(conversion / "strata.json", 0)
    [(code, err)] = _run_denied(tmp_path, ["generate", "--model", str(conversion), "--prompt", "hi"])
    assert (code, err) == (2, f"error: {conversion / 'strata.json'} {DENIED_FILE}")


# ---- the command to convert again is the one the user ran ---------------------------------------

@pytest.mark.parametrize("ran,command", [
    (ROOT / "main.py", f"python {ROOT / 'main.py'} convert"),               # python /path/to/main.py
    (ROOT / "engine" / "__main__.py", "python -m engine convert"),          # python -m engine
    (ROOT / "strata" / "__main__.py", "python -m strata convert"),          # python -m strata
    (Path("/opt/venv/bin/strata"), "strata convert"),                        # the installed command
    (Path("/home/me/my_script.py"), "strata convert"),                       # a program calling the engine
    (Path("/home/me/main.py"), "strata convert"),                            # ... that happens to be a main.py
])
def test_the_convert_command_is_named_as_the_program_was_run(ran, command, monkeypatch):
    # an activated environment: "python" and "strata" on the PATH are this interpreter's
    monkeypatch.setattr(converted.shutil, "which", lambda name: str(Path(sys.executable).parent / name))
    assert convert_command(str(ran)) == command


def test_main_py_run_from_its_folder_is_named_as_typed(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(converted.shutil, "which", lambda name: str(Path(sys.executable).parent / name))
    assert convert_command("main.py") == "python main.py convert"


def test_an_interpreter_that_is_not_the_paths_python_is_named_by_its_path(monkeypatch, tmp_path):
    # .venv/bin/python run without activating the environment: a bare "python" would be another one
    monkeypatch.setattr(converted.shutil, "which", lambda name: "/usr/bin/python" if name == "python" else None)
    monkeypatch.setattr(converted.sys, "executable", "/opt/my env/bin/python")
    assert convert_command(str(ROOT / "main.py")) == f"'/opt/my env/bin/python' {ROOT / 'main.py'} convert"
    assert convert_command(str(ROOT / "engine" / "__main__.py")) == "'/opt/my env/bin/python' -m engine convert"
    assert convert_command("/home/me/my_script.py") == "'/opt/my env/bin/python' -m strata convert"
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "strata").write_text("#!/bin/sh\n")
    monkeypatch.setattr(converted.sys, "executable", str(venv / "python"))
    assert convert_command("/home/me/my_script.py") == f"{venv / 'strata'} convert"     # strata, not on the PATH


@pytest.mark.parametrize("how,command", [
    (["-m", "engine"], "python -m engine convert"),
    ([str(ROOT / "main.py")], f"python {ROOT / 'main.py'} convert"),
])
def test_a_real_process_advises_the_command_it_was_run_as(conversion, tmp_path, how, command):
    command = command.replace("python", converted.python_command(), 1)      # this interpreter, as the PATH names it
    (conversion / "strata.json").write_text("{\n")
    proc = subprocess.run([sys.executable, *how, "generate", "--model", str(conversion), "--prompt", "hi"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT if how[0] == "-m" else tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(f"into a new folder: {command} SRC NEW_FOLDER")


# ---- a full disk -------------------------------------------------------------------------------

def test_a_full_disk_at_the_start_of_convert_says_so_and_how_much_is_free(capsys, model, tmp_path, monkeypatch):
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name.endswith(".partial"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(destination.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 3 << 19))
    code, err = run_cli_one_line(capsys, "convert", str(model), str(tmp_path / "out"))
    assert (code, err) == (2, f"error: cannot write in {tmp_path}: its disk is full (1.50 MiB free); free disk space "
                              "or choose a destination on another disk")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("code,note", [
    (errno.ENOSPC, "the disk holding {c} is full, so the good checksums were not remembered and every load checks "
                   "them again; free space on it to load it faster"),
    (errno.EACCES, "{c} cannot be written, so the good checksums were not remembered and every load checks them "
                   "again; make the folder writable to load it faster"),
])
def test_checksums_that_cannot_be_remembered_say_why(conversion, monkeypatch, code, note):
    def fsync(fd):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(integrity.os, "fsync", fsync)
    assert LLM(str(conversion), device="cpu").engine.model_info.notes == (note.format(c=conversion),)
    assert not (conversion / integrity.RECORD).exists()


def test_a_source_file_that_cannot_be_read_is_blamed_on_the_source_not_the_destination(model, tmp_path, locked):
    # a tokenizer file this user may not read: it was "writing the conversion failed ... choose a destination
    # in a folder you can write to", which sent the user to the wrong folder
    side = model / "notes.txt"                     # a file of the source that nothing but the copy reads
    side.write_text("the model's own notes")
    locked(side, 0)
    dst = tmp_path / "out"
    [(code, err)] = _run_denied(tmp_path, ["convert", str(model), str(dst), "--weights", "fp8"])
    assert code == 2 and err == (f"error: {side} cannot be read (permission denied); check its permissions (you "
                                 "need read access to every file of the source folder), or move it out of the folder")
    assert not dst.exists()


def test_a_generation_config_that_cannot_be_read_is_named_as_such(model, tmp_path, locked):
    gen = model / "generation_config.json"
    if not gen.is_file():
        gen.write_text("{}")
    locked(gen, 0)
    [(code, err)] = _run_denied(tmp_path, ["generate", "--model", str(model), "--prompt", "hi"])
    assert code == 2 and err == f"error: {gen} {DENIED_FILE}"


def test_a_conversion_that_did_not_finish_is_named_as_one(capsys, tmp_path):
    left = tmp_path / "out.partial"          # what a convert killed before its end leaves
    left.mkdir()
    (left / destination.PARTIAL_MARKER).write_text('{"pid": 1, "destination": "out"}\n')
    (left / "experts-0001.safetensors").write_bytes(b"\0" * 64)
    code, err = run_cli_one_line(capsys, "info", "--model", str(left))
    assert (code, err) == (2, f"error: {left} is a conversion that did not finish (convert was stopped before its "
                              "end); run the same convert command again, which replaces it, or delete the folder")
