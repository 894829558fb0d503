"""Shared fixtures: tiny Hugging Face MoE checkpoints of every supported family, built in the test."""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Without a GPU, Triton kernels run in the interpreter; set before any test module imports triton.
if not os.path.exists("/dev/nvidia0") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreter_without_overflow_checks() -> None:
    """Triton's interpreter checks every 32-bit integer add, subtract and multiply for overflow: six more
    array operations and an assert each, a third of a kernel test's time. A compiled kernel runs without
    them (they come with ``debug``), and at the tests' shapes no offset comes near 2**31; the results
    are still checked against the references. STRATA_TEST_OVERFLOW_CHECKS=1 keeps them."""
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("STRATA_TEST_OVERFLOW_CHECKS") == "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    if builder is not None and hasattr(getattr(builder, "options", None), "sanitize_overflow"):
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


_interpreter_without_overflow_checks()


def pytest_collection_finish(session) -> None:
    """Every object the imports made (torch, Qt, the test modules) leaves the cyclic collector's
    generations: each test's gc.collect() (a closed engine's, a window's) then walks only what the
    tests made since, not the ~300k objects of the imports (about 0.3 s a collection)."""
    if os.environ.get("STRATA_TEST_NO_FREEZE") != "1":
        from engine.collector import freeze_imports
        freeze_imports()   # what the workbench and the command line do before their first model
