"""Checkpoint folders for the tests of loading, checking and converting: a tiny qwen3_moe checkpoint and its fp8
conversion, each built once per test module, and a fresh copy of either for a test to change; and the command
line run in-process.

A module that needs a checkpoint of its own defines a fixture of the same name, which takes precedence."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from main import main
from tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def good_model(tmp_path_factory) -> Path:
    """A tiny qwen3_moe checkpoint, shared by the tests of a module: they change copies of it, never it."""
    return build_tiny_model(tmp_path_factory.mktemp("checkpoint") / "m", "qwen3_moe")


@pytest.fixture(scope="module")
def good_conversion(good_model, tmp_path_factory) -> Path:
    """``good_model`` converted to fp8, shared by the tests of a module like ``good_model``."""
    dst = tmp_path_factory.mktemp("conversion") / "c"
    assert main(["convert", str(good_model), str(dst), "--weights", "fp8"]) == 0
    return dst


@pytest.fixture
def model(good_model, tmp_path) -> Path:
    """A copy of ``good_model`` in ``tmp_path / "m"``, for one test to change."""
    return shutil.copytree(good_model, tmp_path / "m")


@pytest.fixture
def conversion(good_conversion, tmp_path) -> Path:
    """A copy of ``good_conversion`` in ``tmp_path / "c"``, for one test to change."""
    return shutil.copytree(good_conversion, tmp_path / "c")


@pytest.fixture
def src(good_model, tmp_path) -> Path:
    """A copy of ``good_model`` in ``tmp_path / "models" / "src"``, a source to convert beside other folders."""
    return shutil.copytree(good_model, tmp_path / "models" / "src")


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """Run the command line in-process: its exit code and what it wrote to stderr, stripped."""
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def run_cli_one_line(capsys, *argv: str) -> tuple[int, str]:
    """``run_cli``, checking that stderr is at most one line and holds no traceback."""
    code, err = run_cli(capsys, *argv)
    assert "\n" not in err and "Traceback" not in err, err
    return code, err
