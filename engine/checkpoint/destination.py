"""Where ``convert`` reads and writes: the paths a user gives, checked before any work starts, and the swap
that puts a finished conversion in place.

``--force`` replaces only a folder that is itself an earlier Strata conversion holding nothing convert did
not write, and never a folder that holds the source. Every temporary folder carries a marker file naming its
process, and only a marked folder of a process that is gone is ever removed by a later run.

A destination that does not exist is written as a temporary folder beside it, renamed into place. An empty
folder the user made (a mount point, a folder with its own owner, mode or setgid bit) is kept: the conversion
is written into a hidden folder inside it, on its filesystem, and its files are renamed up into it, the
manifest last; the marker lists them first, so a run cut short is recognised and cleared by the next one. An
earlier conversion (``--force``) is renamed aside and removed file by file only once the new folder is in
place, and renamed back if that fails.
"""
from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint.converted import MANIFEST, is_converted, manifest_source, read_manifest
from engine.checkpoint.integrity import RECORD
from engine.checkpoint.reader import cannot_list, check_folder_readable
from engine.config import format_size
from engine.errors import ConfigError, ModelLoadError

PARTIAL_MARKER = ".strata-partial"
STAGING = ".strata-converting"          # the temporary folder inside an empty destination folder
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
    inside: bool = False               # in the destination folder (kept), not beside it (renamed into place)


def check_source(src: Path) -> Path:
    """The resolved source folder; refused unless it is a folder that is not itself a conversion."""
    real = _resolve(src, "source")
    check_folder_readable(real)
    if not real.exists():
        raise ModelLoadError(f"the source folder {src} does not exist; give the Hugging Face model folder to "
                             "convert (it holds config.json and *.safetensors)")
    if not real.is_dir():
        raise ModelLoadError(f"the source {src} is a file, not a folder; give the Hugging Face model folder "
                             "that holds config.json and *.safetensors")
    if is_converted(real):
        origin = _converted_from(real)
        raise ModelLoadError(f"{src} is already a Strata conversion; convert the original Hugging Face folder"
                             + (f" ({origin})" if origin else "") + " instead")
    try:
        os.listdir(real)                 # its config, tokenizer and other small files are copied across
    except OSError as e:
        raise cannot_list(real, e) from None
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
    previous = _inspect(real, given, src, force)
    if previous and os.path.ismount(real):
        raise ConfigError(f"{given} is a mount point, which --force cannot replace (it renames the earlier conversion "
                          "aside); delete the earlier conversion's files from it and convert into it without --force")
    _check_writable(real if previous == () else anchor)     # an empty folder is written inside, the rest beside
    return Destination(real, given, force)


def _check_writable(folder: Path) -> None:
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise ConfigError(_read_only(folder))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write in {folder} (permission denied); choose a destination in a folder you can "
                          "write to")


def _read_only(folder: Path) -> str:
    return (f"cannot write in {folder}: it is on a read-only filesystem; choose a destination on a writable "
            "filesystem (or remount this one read-write)")


def _cannot_write(folder: Path, e: OSError) -> str:
    if e.errno == errno.EROFS:
        return _read_only(folder)
    if e.errno == errno.ENOSPC:
        return (f"cannot write in {folder}: its disk is full{_free(folder)}; free disk space or choose a "
                "destination on another disk")
    if e.errno == errno.EDQUOT:
        return (f"cannot write in {folder}: your disk quota there is used up; free space within your quota or "
                "choose a destination on another disk")
    return f"cannot write in {folder} ({e.strerror or e}); choose a destination in a folder you can write to"


def _free(folder: Path) -> str:
    """ " (N free)" for the disk holding ``folder``, or "" where the OS does not say."""
    try:
        return f" ({format_size(shutil.disk_usage(folder).free)} free)"
    except OSError:
        return ""


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
    """What is at the destination, refused unless it is nothing, an empty folder, or (with --force) a conversion.
    What an interrupted convert into the folder left there counts as nothing (``make_staging`` clears it)."""
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
        entries = tuple(sorted(set(os.listdir(path)) - _leftover(path)))
    except OSError as e:
        raise ConfigError(f"cannot list {given} ({e.strerror}); choose a destination you can read and write") from None
    if not entries:
        return entries
    if STAGING in entries and (path / STAGING).is_dir():
        raise ConfigError(f"another convert is writing into {given} (its temporary folder {STAGING} is there); wait "
                          f"for it to finish, or delete {path / STAGING} if no convert is running")
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


def _leftover(folder: Path) -> set[str]:
    """Names in ``folder`` that an interrupted convert into it left: its temporary folder (empty, or marked by a
    process that is gone) and the files its marker lists as moved up, each still the file it moved (same inode)."""
    tmp = folder / STAGING
    try:
        if tmp.is_symlink() or not tmp.is_dir():
            return set()
        if not any(tmp.iterdir()):
            return {STAGING}
    except OSError:
        return set()
    doc = _marker(tmp)
    if doc is None or not _abandoned(tmp):
        return set()
    moved = doc.get("moved")
    if not isinstance(moved, dict):
        return {STAGING}
    if MANIFEST in moved and _file_inode(folder / MANIFEST) == moved[MANIFEST]:
        return {STAGING}              # the manifest moves last: the conversion was whole, only the folder is left
    return {STAGING} | {n for n, ino in moved.items()
                        if isinstance(n, str) and _plain_name(n) and _file_inode(folder / n) == ino}


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..", STAGING) and "/" not in name and "\0" not in name


def _file_inode(p: Path) -> int | None:
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return st.st_ino if stat.S_ISREG(st.st_mode) else None


def _clear_leftover(folder: Path) -> None:
    for name in sorted(_leftover(folder)):
        if name == STAGING:
            shutil.rmtree(folder / name)
        else:
            (folder / name).unlink()


def make_staging(dest: Destination) -> Staging:
    """Create the marked temporary folder: inside the destination where that is an empty folder (kept as it is,
    and the files stay on its filesystem), else beside it, with any missing parent folders."""
    parent, created, folder = dest.path.parent, [], None
    try:
        if dest.path.is_dir():
            _clear_leftover(dest.path)
        inside = dest.path.is_dir() and not os.listdir(dest.path)
        if inside:
            (dest.path / STAGING).mkdir()
            folder = dest.path / STAGING
        else:
            for p in reversed([p for p in (parent, *parent.parents) if not os.path.lexists(p)]):
                p.mkdir()
                created.append(p)
            folder = _claim(parent / f"{dest.path.name}.partial")
        _write_marker(folder, {"pid": os.getpid(), "host": socket.gethostname(), "destination": str(dest.path)})
    except OSError as e:
        _undo(folder, created)
        where = Path(e.filename).parent if e.filename else parent    # the existing folder that refused the write
        raise ConfigError(_cannot_write(where, e)) from None
    except BaseException:                   # Ctrl-C: nothing made here stays
        _undo(folder, created)
        raise
    return Staging(folder, tuple(created), inside)


def _undo(folder: Path | None, created: list[Path]) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)      # made by this call: ours, marked or not yet
    _remove_empty(created)


def _write_marker(folder: Path, doc: dict) -> None:
    tmp = folder / (PARTIAL_MARKER + ".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, folder / PARTIAL_MARKER)


def _marker(folder: Path) -> dict | None:
    marker = folder / PARTIAL_MARKER
    if folder.is_symlink() or not folder.is_dir() or marker.is_symlink() or not marker.is_file():
        return None
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


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
    doc = _marker(tmp)
    try:
        pid, host = int(doc["pid"]), doc["host"]
    except (ValueError, KeyError, TypeError):
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
    """Remove the temporary folder (only while it carries this process's marker) and the parents made for it."""
    doc = _marker(staging.folder)
    if doc is not None and doc.get("pid") == os.getpid() and doc.get("host") == socket.gethostname():
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
    if staging.inside:
        _fill(staging.folder, dest)
        return ()
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


def _fill(tmp: Path, dest: Destination) -> None:
    """Rename the files of ``tmp`` (inside the destination) up into the destination, the manifest last, so the
    folder itself stays; the marker lists them first. A failure moves back what was moved."""
    others = sorted(set(os.listdir(dest.path)) - {STAGING})
    if others:
        raise ConfigError(f"{dest.given} now holds other files ({_some(others)}), so the conversion was not moved "
                          "into it; move them out and convert again, or choose another folder")
    names = sorted((n for n in os.listdir(tmp) if n != PARTIAL_MARKER), key=lambda n: (n == MANIFEST, n))
    _write_marker(tmp, {**(_marker(tmp) or {}), "moved": {n: os.lstat(tmp / n).st_ino for n in names}})
    moved: list[str] = []
    try:
        for name in names:
            os.rename(tmp / name, dest.path / name)
            moved.append(name)
    except BaseException:
        for name in reversed(moved):
            try:
                os.rename(dest.path / name, tmp / name)
            except OSError:
                (dest.path / name).unlink(missing_ok=True)
        raise
    try:
        (tmp / PARTIAL_MARKER).unlink()
        tmp.rmdir()
    except OSError:
        pass                        # the conversion is in place; the next run clears what is left of ``tmp``


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
