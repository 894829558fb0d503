"""Python's cyclic collector in a process that runs a model for a long time (the workbench, the server,
the command line's chat).

A full collection walks every object the collector tracks. Once torch, the engine (and Qt) are
imported that is about 275,000 objects, and a full collection takes 0.3 s on a 2-core machine. It is
paid by whichever thread allocates when the collector decides to run (the window's: a stalled chat;
the engine loop's: a gap between tokens) and by every model's close, which collects so that the
model's memory goes back at once rather than whenever the collector next runs.

What the imports made lives as long as the process. :func:`freeze_imports` moves it out of the
collector's generations (``gc.freeze``) once, before the first model loads, so that later collections
walk only what came after. A model's objects are never frozen: they are made after the call, and a
closed model's reference cycles are collected as before. The workbench calls it as its first model
loads (``app.bridge_api.build_engine``), the command line as it opens a model (``generate``, ``chat``,
``serve``, ``bench``), the test suite once its modules are imported.
"""
from __future__ import annotations

import atexit
import gc
import importlib

_frozen = False


def freeze_imports() -> int:
    """Collect once, then keep every object alive now out of later collections; at exit the
    interpreter's last collection reaches them again. Call it before any model loads (a model loaded
    before it would never be collected). Once per process; returns how many objects it froze (0 on
    later calls)."""
    global _frozen
    if _frozen:
        return 0
    for name in ("torch", "engine.engine"):      # most of the objects: imported here if not yet
        importlib.import_module(name)
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    _frozen = True
    return gc.get_freeze_count()
