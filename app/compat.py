"""Work-arounds for defects in the libraries the workbench runs on.

PySide6 6.12 wheels running on Python 3.11 hand back the interpreter's shared singletons (``None``
from every void Qt method, ``True``/``False`` from Python overrides of virtual methods) without
taking a reference to them; Python 3.12+ makes these objects immortal, 3.11 does not. Each call drops
one reference, a GUI makes millions of such calls, and once a count reaches zero the interpreter
aborts ("deallocating None"). Giving every such singleton a reference count it can never exhaust
makes them as immortal as on 3.12.
"""
from __future__ import annotations

import ctypes
import sys

_PINNED = 1 << 40


def _singletons() -> list[object]:
    """The objects Python 3.12 made immortal that C extensions commonly return."""
    objs: list[object] = [None, True, False, Ellipsis, NotImplemented, (), "", b""]
    objs += [int(i) for i in range(-5, 257)]          # the small-int cache
    objs += [chr(i) for i in range(256)]               # one-character latin-1 strings
    return objs


def protect_singleton_refcounts() -> None:
    """On Python < 3.12, raise the singletons' reference counts out of reach (idempotent, harmless)."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return
    for obj in _singletons():
        refcnt = ctypes.c_ssize_t.from_address(id(obj))   # ob_refcnt is PyObject's first field
        if refcnt.value < _PINNED:
            refcnt.value += _PINNED
