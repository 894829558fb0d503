"""Where ``convert`` reads and writes: the paths a user gives, checked before any work starts, and the swap
that puts a finished conversion in place.

``--force`` replaces only a folder that is itself an earlier Strata conversion holding nothing convert did
not write, and never a folder that holds the source. The new conversion is written into a temporary folder
beside the destination that carries a marker file (only a marked folder of a process that is gone is ever
removed); an earlier conversion is renamed aside and removed file by file only once the new folder is in
place, and renamed back if that fails.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint.converted import MANIFEST, manifest_source, read_manifest
from engine.checkpoint.integrity import RECORD
from engine.errors import ConfigError, ModelLoadError

PARTIAL_MARKER = ".strata-partial"
_RECORD_TMP = re.compile(r"\." + re.escape(RECORD) + r"\.\d+\.tmp")   # a record write cut short
_FORCE = "--force replaces only an earlier Strata conversion"


@dataclass(frozen=True)
class Destination:
    path: Path                         # resolved: symbolic links followed
    given: str                         # as the user wrote it, for messages
    force: bool                        # an earlier conversion may be replaced


@dataclass(frozen=True)
class Staging:
    folder: Path                       # the temporary folder the conversion is written into
    created: tuple[Path, ...]          # parent folders made for it, outermost first


def check_source(src: Path) -> Path:
    """The resolved source folder; refused unless it is a folder that is not itself a conversion."""
    real = _resolve(src, "source")
    if not real.exists():
        raise ModelLoadError(f"the source folder {src} does not exist; give the Hugging Face model folder to "
                             "convert (it holds config.json and *.safetensors)")
    if not real.is_dir():
        raise ModelLoadError(f"the source {src} is a file, not a folder; give the Hugging Face model folder "
                             "that holds config.json and *.safetensors")
    if (real / MANIFEST).is_file():
        origin = _converted_from(real)
        raise ModelLoadError(f"{src} is already a Strata conversion; convert the original Hugging Face folder"
                             + (f" ({origin})" if origin else "") + " instead")
    return real


def _converted_from(folder: Path) -> str:
    try:
        return manifest_source(read_manifest(folder))
    except ModelLoadError:
        return ""


def plan_destination(src: Path, dst: Path, force: bool) -> Destination:
    """Check ``dst`` against the resolved source ``src`` and what is there now; creates and deletes nothing."""
    given, real = str(dst), _resolve(dst, "destination")
    if _same(real, src):
        raise ConfigError(f"the destination {given} is the source folder; choose another folder for the converted model")
    if _within(src, real):
        raise ConfigError(f"the destination {given} contains the source folder {src}; choose a destination outside it")
    if _within(real, src):
        raise ConfigError(f"the destination {given} is inside the source folder {src}; choose a destination outside it")
    anchor = _existing_ancestor(real.parent)
    if not anchor.is_dir():
        raise ConfigError(f"{anchor} is a file, so {given} cannot be created inside it; choose a folder path "
                          "for the converted model")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write in {anchor} (permission denied); choose a destination in a folder you can "
                          "write to")
    _inspect(real, given, src, force)
    return Destination(real, given, force)


def _resolve(p: Path, what: str) -> Path:
    try:
        return p.expanduser().resolve()
    except (OSError, RuntimeError) as e:        # a loop of symbolic links
        raise ConfigError(f"the {what} {p} cannot be resolved ({e}); fix the symbolic link or give another path")


def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same(a: Path, b: Path) -> bool:
    ia = _identity(a)
    return a == b or (ia is not None and ia == _identity(b))


def _within(inner: Path, outer: Path) -> bool:
    """``inner`` lies strictly inside ``outer``: by path, and by folder identity (bind mounts, case-folding)."""
    if outer in inner.parents:
        return True
    target = _identity(outer)
    return target is not None and any(_identity(p) == target for p in inner.parents)


def _existing_ancestor(p: Path) -> Path:
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


def _inspect(path: Path, given: str, src: Path, force: bool) -> tuple[str, ...] | None:
    """What is at the destination, refused unless it is nothing, an empty folder, or (with --force) a conversion."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot look at {given} ({e.strerror}); choose a destination you can read and write") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{given} is a file, not a folder; choose a folder path for the converted model "
                          f"({_FORCE}, never a file)")
    try:
        entries = tuple(sorted(os.listdir(path)))
    except OSError as e:
        raise ConfigError(f"cannot list {given} ({e.strerror}); choose a destination you can read and write") from None
    if not entries:
        return entries
    if not (path / MANIFEST).is_file():
        raise ConfigError(f"{given} already exists and holds other files ({_some(entries)}); choose a new or empty "
                          f"folder ({_FORCE})")
    try:
        doc = read_manifest(path)
    except ModelLoadError:
        raise ConfigError(f"{given} holds a {MANIFEST} that is not a Strata manifest, so it is not an earlier "
                          f"conversion; choose a new or empty folder ({_FORCE})") from None
    if not force:
        raise ConfigError(f"{given} holds an earlier Strata conversion; pass --force to replace it, or choose another "
                          "folder")
    foreign = [e for e in entries if not _written_by_convert(path / e, doc, src)]
    if foreign:
        raise ConfigError(f"{given} is an earlier conversion but also holds {_some(foreign)}, which convert did not "
                          "write; move that out of it, or choose another folder")
    return entries


def _written_by_convert(f: Path, doc: dict, src: Path) -> bool:
    if f.is_symlink() or not f.is_file():
        return False                    # convert writes plain files only
    if f.name in (MANIFEST, RECORD, PARTIAL_MARKER) or _RECORD_TMP.fullmatch(f.name) or f.name in doc["files"]:
        return True
    if "copied" in doc:
        return f.name in doc["copied"]
    return (src / f.name).is_file()     # a manifest that predates the list: a file the source also holds


def _some(names) -> str:
    names = list(names)
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def make_staging(dest: Destination) -> Staging:
    """Create the marked temporary folder beside the destination (and any missing parent folders)."""
    parent, created = dest.path.parent, []
    try:
        for p in reversed([p for p in (parent, *parent.parents) if not os.path.lexists(p)]):
            p.mkdir()
            created.append(p)
        folder = _claim(parent / f"{dest.path.name}.partial")
        (folder / PARTIAL_MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                         "destination": str(dest.path)}) + "\n")
    except OSError as e:
        _remove_empty(created)
        where = Path(e.filename).parent if e.filename else parent    # the existing folder that refused the write
        raise ConfigError(f"cannot write in {where} ({e.strerror or e}); choose a destination in a folder you can "
                          "write to") from None
    return Staging(folder, tuple(created))


def _claim(tmp: Path) -> Path:
    """``tmp`` made fresh (an abandoned one of ours removed first), else a new unique name beside it."""
    if _abandoned(tmp):
        shutil.rmtree(tmp)
    for name in (tmp.name, *(f"{tmp.name}-{secrets.token_hex(4)}" for _ in range(100))):
        try:
            (tmp.parent / name).mkdir()
            return tmp.parent / name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {tmp}")


def _abandoned(tmp: Path) -> bool:
    """A temporary folder written by a convert on this machine whose process is gone."""
    marker = tmp / PARTIAL_MARKER
    if tmp.is_symlink() or not tmp.is_dir() or marker.is_symlink() or not marker.is_file():
        return False
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
        pid, host = int(doc["pid"]), doc["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if host != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def discard(staging: Staging) -> None:
    """Remove the temporary folder (only while it carries our marker) and the parents made for it."""
    if (staging.folder / PARTIAL_MARKER).is_file() and not staging.folder.is_symlink():
        shutil.rmtree(staging.folder, ignore_errors=True)
    _remove_empty(list(staging.created))


def _remove_empty(folders: list[Path]) -> None:
    for p in reversed(folders):
        try:
            p.rmdir()               # only ever succeeds on an empty folder
        except OSError:
            return


def install(staging: Staging, dest: Destination, src: Path) -> tuple[str, ...]:
    """Move the finished conversion into place; returns notes for the user (an earlier folder left behind)."""
    previous = _inspect(dest.path, dest.given, src, dest.force)   # again: what is there now
    if previous is None:
        os.rename(staging.folder, dest.path)
        (dest.path / PARTIAL_MARKER).unlink()
        return ()
    aside = _free_name(dest.path, "old")
    os.rename(dest.path, aside)
    try:
        os.rename(staging.folder, dest.path)
    except OSError:
        try:
            os.rename(aside, dest.path)
        except OSError as e:
            raise ConfigError(f"the new conversion could not be moved into place and the earlier one could not be "
                              f"put back ({e.strerror}); it is in {aside} — rename it to {dest.given}") from None
        raise
    (dest.path / PARTIAL_MARKER).unlink()
    return _remove_previous(aside, previous, dest.given)


def _free_name(path: Path, tag: str) -> Path:
    while True:
        p = path.with_name(f"{path.name}.{tag}-{secrets.token_hex(4)}")
        if not os.path.lexists(p):
            return p


def _remove_previous(aside: Path, names: tuple[str, ...], given: str) -> tuple[str, ...]:
    """Delete exactly the files found in the earlier conversion, then its folder; anything new stays."""
    try:
        for name in names:
            (aside / name).unlink(missing_ok=True)
        aside.rmdir()
    except OSError as e:
        return (f"the earlier conversion of {given} was moved to {aside} but not removed ({e.strerror}); "
                "look inside it and delete it when done",)
    return ()
