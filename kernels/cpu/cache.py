"""numba's disk cache of the CPU expert kernels, kept in step with their sources.

numba checks only the file of the function it loads from its cache, not the files whose code was
compiled into it: the passes in ``driver`` and ``packed`` inline code from ``bits``, ``dots`` and
``idot``, so a change to one of those alone (an update, an edit) would keep running the old kernel.
:func:`sync` compares a digest of every source file of this package with the one stored beside the
cache and, when they differ, removes this package's cache files there (numba writes them for these
modules only) and stores the new digest; the kernels then compile once more.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_STAMP = "strata-cpu-kernels.digest"


def digest() -> str:
    """SHA-256 of this package's Python sources, by name."""
    h = hashlib.sha256()
    for path in sorted(_HERE.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir(example) -> Path | None:
    """The folder numba caches this package's functions in (the same rule numba applies: the first
    of its locators that accepts the file), or None where it cannot tell."""
    try:
        from numba.core.caching import CacheImpl
        for cls in CacheImpl._locator_classes:
            loc = cls.from_function(example.py_func, example.py_func.__code__.co_filename)
            if loc is not None:
                return Path(loc.get_cache_path())
    except (AttributeError, ImportError, OSError, TypeError):
        pass
    return None


def sync(example) -> bool:
    """Remove this package's cached kernels when its sources changed since they were cached.
    ``example``: one of its compiled functions (numba's locator needs one). Returns whether it
    removed any. Never raises: a cache it cannot reach is numba's to recompile."""
    folder = cache_dir(example)
    if folder is None or not folder.is_dir():
        return False
    stamp = folder / _STAMP
    now = digest()
    try:
        if stamp.read_text() == now:
            return False
    except OSError:
        pass
    modules = {p.stem for p in _HERE.glob("*.py")}
    removed = False
    for path in folder.iterdir():
        if path.suffix in (".nbi", ".nbc") and path.name.split(".", 1)[0] in modules:
            try:
                path.unlink()
                removed = True
            except OSError:
                pass
    try:
        tmp = folder / f"{_STAMP}.{os.getpid()}"
        tmp.write_text(now)
        os.replace(tmp, stamp)
    except OSError:
        pass
    return removed
