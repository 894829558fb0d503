"""``convert`` into a folder the user made keeps that folder (its inode, mode and filesystem: a mount point
works), a run cut short is cleared by the next one without touching anything else, each write failure names
its real cause and a fix, a folder that cannot load is noted, and Ctrl-C says what the destination holds."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from safetensors import SafetensorError

from engine import LLM
from engine.checkpoint import convert as convert_module
from engine.checkpoint import destination
from engine.checkpoint.destination import PARTIAL_MARKER, STAGING
from test_convert_safety import _convert, _siblings, _tree
from tiny_models import ROOT


def _identity(folder) -> tuple[int, int, int]:
    st = os.stat(folder)
    return st.st_dev, st.st_ino, st.st_mode


def _written(dst) -> set[str]:
    """The names a finished conversion in ``dst`` consists of: its manifest, the files it lists, those it copied."""
    doc = json.loads((dst / "strata.json").read_text())
    return {"strata.json", *doc["files"], *doc["copied"]}


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _leftover(dst, moved: dict[str, int] | None = None, pid: int | None = None) -> None:
    """What a convert into ``dst`` killed mid-way leaves: its marked temporary folder, holding a half-written file."""
    (dst / STAGING).mkdir()
    (dst / STAGING / "resident.safetensors").write_text("half written")
    doc = {"pid": pid or _dead_pid(), "host": os.uname().nodename, "destination": str(dst)}
    (dst / STAGING / PARTIAL_MARKER).write_text(json.dumps(doc | ({"moved": moved} if moved else {})))


# ---- a folder the user made is kept ------------------------------------------------------------

@pytest.mark.parametrize("through_a_link", [False, True])
def test_an_empty_folder_is_kept_and_the_conversion_is_staged_inside_it(capsys, src, tmp_path, monkeypatch,
                                                                       through_a_link):
    # a mount point cannot be renamed over, and its filesystem is not its parent's: staging inside the folder
    # and keeping the folder itself (inode, setgid mode) is what makes one work
    folder = tmp_path / "out"
    folder.mkdir()
    folder.chmod(0o2750)
    before = _identity(folder)
    dst = tmp_path / "link" if through_a_link else folder
    if through_a_link:
        dst.symlink_to(folder, target_is_directory=True)
    staged = []
    real_verify = convert_module.verify_files

    def verify(where, files):
        staged.append((where, os.stat(where).st_dev))
        return real_verify(where, files)
    monkeypatch.setattr(convert_module, "verify_files", verify)
    assert _convert(capsys, src, dst) == (0, "")
    assert staged == [(folder / STAGING, before[0])]           # inside the folder, on its filesystem
    assert _identity(folder) == before                          # the same folder, mode and setgid bit kept
    assert dst.is_symlink() == through_a_link
    assert set(os.listdir(folder)) == _written(folder)          # no temporary folder left in it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "models", "out"][0 if through_a_link else 1:]
    assert LLM(str(dst), device="cpu").engine.model_info.expert_format == "fp8"


def test_a_missing_destination_is_still_staged_beside_it_and_renamed_into_place(capsys, src, tmp_path, monkeypatch):
    staged = []
    real_verify = convert_module.verify_files
    monkeypatch.setattr(convert_module, "verify_files", lambda where, files: (staged.append(where),
                                                                              real_verify(where, files)))
    dst = tmp_path / "out"
    assert _convert(capsys, src, dst) == (0, "")
    assert staged == [tmp_path / "out.partial"] and set(os.listdir(dst)) == _written(dst)
    assert _siblings(dst) == ["models", "out"]


def test_a_failed_move_into_an_empty_folder_leaves_it_empty(capsys, src, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    dst.mkdir()
    before = _identity(dst)
    real_rename = os.rename

    def rename(a, b):
        if os.path.basename(b) == "experts-0001.safetensors":     # after some files were moved up already
            raise OSError(errno.EIO, "Input/output error", str(a))
        real_rename(a, b)
    monkeypatch.setattr(destination.os, "rename", rename)
    code, err = _convert(capsys, src, dst)
    assert code == 2 and err.startswith(f"error: writing the conversion for {dst} failed: Input/output error")
    assert err.endswith(f"choose another destination — {dst} was left as it was")
    assert os.listdir(dst) == [] and _identity(dst) == before


def test_a_folder_filled_meanwhile_is_not_written_into(capsys, src, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    dst.mkdir()
    real_verify = convert_module.verify_files

    def verify(where, files):
        (dst / "notes.txt").write_text("mine")                  # the user saves a file there during the run
        return real_verify(where, files)
    monkeypatch.setattr(convert_module, "verify_files", verify)
    assert _convert(capsys, src, dst) == (2, f"error: {dst} now holds other files (notes.txt), so the conversion was "
                                             "not moved into it; move them out and convert again, or choose another "
                                             "folder")
    assert os.listdir(dst) == ["notes.txt"] and (dst / "notes.txt").read_text() == "mine"


# ---- a run cut short inside the folder ---------------------------------------------------------

def test_what_a_killed_run_left_inside_the_folder_is_cleared_by_the_next(capsys, src, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    before = _identity(dst)
    (dst / "experts-0000.safetensors").write_text("moved up before the kill")
    _leftover(dst, moved={"experts-0000.safetensors": os.stat(dst / "experts-0000.safetensors").st_ino,
                          "strata.json": 1})                     # listed but never moved: nothing there to remove
    assert _convert(capsys, src, dst) == (0, "")
    assert set(os.listdir(dst)) == _written(dst) and _identity(dst) == before
    assert (dst / "experts-0000.safetensors").stat().st_size > 100


def test_a_run_killed_after_its_manifest_moved_left_a_whole_conversion_that_is_kept(capsys, src, tmp_path):
    # every file was moved up, the manifest last, and the kill came before the marker went: the folder holds
    # a whole conversion, which a convert without --force must not take for leftovers and replace
    dst = tmp_path / "out"
    dst.mkdir()
    assert _convert(capsys, src, dst) == (0, "")
    names = _written(dst)
    moved = {n: os.stat(dst / n).st_ino for n in names}
    _leftover(dst, moved=moved)
    before = {n: (dst / n).read_bytes() for n in names}
    code, err = _convert(capsys, src, dst)
    assert code == 2 and "--force" in err
    assert {n: (dst / n).read_bytes() for n in names} == before


def test_an_empty_temporary_folder_left_inside_is_cleared(capsys, src, tmp_path):
    # killed after its marker was removed, before the folder was: an empty folder holds nothing of anyone's
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / STAGING).mkdir()
    assert _convert(capsys, src, dst) == (0, "")
    assert set(os.listdir(dst)) == _written(dst)


def test_force_clears_what_a_killed_run_left_in_an_earlier_conversion(capsys, src, tmp_path):
    dst = tmp_path / "out"
    _convert(capsys, src, dst)
    (dst / STAGING).mkdir()
    assert _convert(capsys, src, dst, "--force") == (0, "")
    assert set(os.listdir(dst)) == _written(dst) and _siblings(dst) == ["models", "out"]


def test_a_file_of_the_users_is_never_taken_for_a_leftover(capsys, src, tmp_path):
    # the marker lists tokenizer.json as moved, but the file there now is another one (another inode): the
    # user's, so it is kept, and the folder is refused as holding it
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "tokenizer.json").write_text("the user's own")
    _leftover(dst, moved={"tokenizer.json": os.stat(dst / "tokenizer.json").st_ino + 1})
    before = _tree(dst)
    assert _convert(capsys, src, dst) == (2, f"error: {dst} already exists and holds other files (tokenizer.json); "
                                             "choose a new or empty folder (--force replaces only an earlier Strata "
                                             "conversion)")
    assert _tree(dst) == before


def test_a_convert_still_writing_into_the_folder_is_left_alone(capsys, src, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    _leftover(dst, pid=os.getpid())                             # a live process
    before = _tree(dst)
    assert _convert(capsys, src, dst) == (2, f"error: another convert is writing into {dst} (its temporary folder "
                                             f"{STAGING} is there); wait for it to finish, or delete {dst / STAGING} "
                                             "if no convert is running")
    assert _tree(dst) == before


# ---- each failure names its cause --------------------------------------------------------------

READ_ONLY = "it is on a read-only filesystem; choose a destination on a writable filesystem (or remount this one " \
            "read-write)"


@pytest.mark.parametrize("exists", [False, True])
def test_a_read_only_destination_is_refused_before_any_work_naming_the_cause(capsys, src, tmp_path, monkeypatch,
                                                                            exists):
    dst = tmp_path / "out"
    if exists:
        dst.mkdir()
    monkeypatch.setattr(destination.os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY))
    where = dst if exists else tmp_path                         # an empty folder is written inside, else beside
    assert _convert(capsys, src, dst) == (2, f"error: cannot write in {where}: {READ_ONLY}")
    assert _siblings(dst) == sorted(["models"] + (["out"] if exists else []))


@pytest.mark.parametrize("error,fix", [
    (OSError(errno.EROFS, "Read-only file system"),
     "choose a destination on a writable filesystem (or remount this one read-write)"),
    (OSError(errno.EACCES, "Permission denied"), "choose a destination in a folder you can write to"),
    (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "free disk space or choose another destination"),
    (SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30)"),
     "choose a destination on a writable filesystem (or remount this one read-write)"),
])
def test_a_write_that_fails_names_a_fix_for_its_cause(capsys, src, tmp_path, monkeypatch, error, fix):
    monkeypatch.setattr(convert_module, "save_file", lambda tensors, path: (_ for _ in ()).throw(error))
    dst = tmp_path / "out"
    code, err = _convert(capsys, src, dst)
    assert code == 2 and err.startswith(f"error: writing the conversion for {dst} failed: ")
    assert err.endswith(f"; {fix} — {dst} was left as it was")
    assert _siblings(dst) == ["models"]


def test_force_on_a_mount_point_is_refused_before_any_work(capsys, src, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    _convert(capsys, src, dst)
    before = _tree(dst)
    monkeypatch.setattr(destination.os.path, "ismount", lambda p: str(p) == str(dst))
    assert _convert(capsys, src, dst, "--force") == (
        2, f"error: {dst} is a mount point, which --force cannot replace (it renames the earlier conversion aside); "
           "delete the earlier conversion's files from it and convert into it without --force")
    assert _tree(dst) == before and _siblings(dst) == ["models", "out"]


# ---- a folder that cannot load is noted ---------------------------------------------------------

def test_a_source_without_a_tokenizer_gives_a_note_that_the_folder_will_not_load(capsys, src, tmp_path):
    (src / "tokenizer.json").rename(tmp_path / "kept-tokenizer.json")
    dst = tmp_path / "out"
    assert _convert(capsys, src, dst) == (0, f"note: loading {dst} would fail: {dst / 'tokenizer.json'} is missing; "
                                             "copy tokenizer.json from the original checkpoint into the model folder")
    shutil.copy(tmp_path / "kept-tokenizer.json", dst / "tokenizer.json")     # the fix the note names
    assert LLM(str(dst), device="cpu").engine.model_info.expert_format == "fp8"


def test_a_tokenizer_file_that_cannot_be_read_is_a_note_not_a_traceback(capsys, src, tmp_path):
    # the conversion is in place when its tokenizer is tried: what stops a load is said, and nothing else
    (src / "chat_template.jinja").write_bytes(b"\xff\xfe not UTF-8")
    dst = tmp_path / "out"
    code, err = _convert(capsys, src, dst)
    assert code == 0 and err == (f"note: loading {dst} would fail: its tokenizer files cannot be read ('utf-8' codec "
                                 "can't decode byte 0xff in position 0: invalid start byte); copy them again from the "
                                 "original checkpoint")
    assert (dst / "strata.json").is_file()


# ---- Ctrl-C ------------------------------------------------------------------------------------

def _interrupt_while_writing(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("what", ["nothing", "an empty folder", "an earlier conversion"])
def test_ctrl_c_while_writing_says_what_the_destination_holds_and_leaves_it(capsys, src, tmp_path, monkeypatch, what):
    dst = tmp_path / "out"
    if what == "an empty folder":
        dst.mkdir()
    if what == "an earlier conversion":
        _convert(capsys, src, dst)
    before = _tree(dst) if dst.exists() else None
    identity = _identity(dst) if dst.exists() else None
    monkeypatch.setattr(convert_module, "pack_layer_experts", _interrupt_while_writing)
    said = (f"note: interrupted; the earlier conversion in {dst} was left as it was" if what == "an earlier conversion"
            else f"note: interrupted; nothing was written to {dst}")
    assert _convert(capsys, src, dst, "--force") == (130, said)
    assert (_tree(dst) if dst.exists() else None) == before
    assert (_identity(dst) if dst.exists() else None) == identity
    assert _siblings(dst) == sorted(["models"] + (["out"] if before is not None else []))


@pytest.mark.parametrize("empty_folder", [False, True])
def test_ctrl_c_while_moving_into_place_is_held_back_until_the_move_is_whole(capsys, src, tmp_path, monkeypatch,
                                                                            empty_folder):
    dst = tmp_path / "out"
    if empty_folder:
        dst.mkdir()
    real_rename = os.rename

    def rename(a, b):
        if STAGING in str(a) or str(a).endswith(".partial"):    # the move into place, not another rename
            os.kill(os.getpid(), signal.SIGINT)                 # a real Ctrl-C, in the middle of the move
        real_rename(a, b)
    monkeypatch.setattr(destination.os, "rename", rename)
    assert _convert(capsys, src, dst) == (130, f"note: interrupted after the conversion was moved into place; {dst} "
                                               "is complete")
    monkeypatch.undo()
    assert set(os.listdir(dst)) == _written(dst) and _siblings(dst) == ["models", "out"]
    assert LLM(str(dst), device="cpu").engine.model_info.expert_format == "fp8"


def test_ctrl_c_in_a_real_process_prints_one_line_and_exits_130(src, tmp_path):
    dst = tmp_path / "out"
    script = ("import os, signal, sys\n"
              f"sys.path.insert(0, {str(ROOT)!r})\n"
              "from engine.checkpoint import convert\n"
              "convert.pack_layer_experts = lambda *a, **k: os.kill(os.getpid(), signal.SIGINT)\n"
              "from main import main\n"
              f"sys.exit(main(['convert', {str(src)!r}, {str(dst)!r}, '--weights', 'fp8']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 130 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"note: interrupted; nothing was written to {dst}"]
    assert _siblings(dst) == ["models"]
