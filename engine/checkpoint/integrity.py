"""SHA-256 checks of a converted folder against its manifest, remembered so that later loads are instant.

The first load of a converted folder hashes every file ``strata.json`` lists. A good result is kept in
``strata-verified.json`` inside the folder, one entry per file keyed by its size, inode, modification and
change times: the record travels with the folder, goes when it goes, and a copied, edited or restored
file (new inode or a new change time, which no tool can set back) is hashed again. ``force`` hashes
everything. A folder that cannot be written is verified on every load.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

RECORD = "strata-verified.json"
RECORD_VERSION = 1
CHUNK = 16 << 20            # bytes per read while hashing
MAX_THREADS = 4             # hashlib releases the GIL: files hash in parallel, up to the disk's speed
Progress = Callable[[int, int, str], None]   # (bytes done, bytes in all, file name)


def file_sha256(path: Path, chunk: int = CHUNK) -> str:
    """SHA-256 of a file, read ``chunk`` bytes at a time into one reused buffer."""
    import hashlib
    h, buf = hashlib.sha256(), bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


@dataclass(frozen=True)
class Mismatch:
    name: str
    reason: str             # "missing" | "denied" (no permission to read it) | "unreadable" | "changed"
    error: str = ""         # why the OS would not read it ("denied", "unreadable")


@dataclass(frozen=True)
class ChecksumReport:
    """What one check did: files hashed now, files trusted from the record, and files that failed."""

    hashed: tuple[str, ...]
    remembered: tuple[str, ...]
    bad: tuple[Mismatch, ...]
    saved: bool             # the good result was written for later loads
    save_errno: int | None = None   # why it was not (a full disk, a read-only folder ...), where the OS said


def _stamp(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def _read_record(folder: Path) -> dict:
    """The remembered entries, or {} when there is no usable record (it is only ever a cache)."""
    try:
        doc = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION or not isinstance(doc.get("files"), dict):
        return {}
    return {k: v for k, v in doc["files"].items() if isinstance(v, dict)}


def _write_record(folder: Path, entries: dict) -> OSError | None:
    """Atomically replace the record (write, fsync, rename); the error when the folder cannot be written."""
    tmp = folder / f".{RECORD}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": RECORD_VERSION, "files": entries}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / RECORD)
        return None
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return e


def verify_checksums(folder: Path, files: dict[str, str], force: bool = False,
                     progress: Progress | None = None) -> ChecksumReport:
    """Check every file of ``files`` (name -> SHA-256 hex) in ``folder``; never raises for a bad file."""
    record = {} if force else _read_record(folder)
    stamps, bad, todo, remembered = {}, [], [], []
    for name, digest in files.items():
        try:
            stamps[name] = _stamp((folder / name).stat())
        except (FileNotFoundError, NotADirectoryError):
            bad.append(Mismatch(name, "missing"))
            continue
        except OSError as e:
            bad.append(_unread(name, e))
            continue
        known = record.get(name)
        if known is not None and known.get("sha256") == digest and {k: known.get(k) for k in stamps[name]} == stamps[name]:
            remembered.append(name)
        else:
            todo.append(name)
    hashed = _hash_all(folder, todo, stamps, progress)
    bad += [h for h in hashed.values() if isinstance(h, Mismatch)]          # not read: not a mismatch
    bad += [Mismatch(n, "changed") for n in todo if isinstance(hashed[n], str) and hashed[n] != files[n]]
    good = {n: {**stamps[n], "sha256": files[n]} for n in remembered + todo if hashed.get(n, files[n]) == files[n]}
    error = None if good == record else _write_record(folder, good)
    return ChecksumReport(tuple(todo), tuple(remembered), tuple(bad), error is None,
                          error.errno if error is not None else None)


def _unread(name: str, e: OSError) -> Mismatch:
    """A listed file the OS would not read: for want of permission (the file may be fine), or another cause."""
    return Mismatch(name, "denied" if isinstance(e, PermissionError) else "unreadable", e.strerror or str(e))


def _hash_all(folder: Path, names: list[str], stamps: dict,
              progress: Progress | None) -> dict[str, str | Mismatch]:
    """Each file's SHA-256, or why it could not be read."""
    total, done, out = sum(stamps[n]["size"] for n in names), 0, {}
    if not names:
        return out
    with ThreadPoolExecutor(min(MAX_THREADS, os.cpu_count() or 1, len(names))) as pool:
        futures = {pool.submit(file_sha256, folder / n): n for n in names}
        for fut, name in futures.items():
            try:
                out[name] = fut.result()
            except OSError as e:
                out[name] = _unread(name, e)
            done += stamps[name]["size"]
            if progress:
                progress(done, total, name)
    return out
