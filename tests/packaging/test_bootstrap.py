"""packaging/bootstrap.sh as a user runs it, in a copy of the script with stand-in interpreters.

The stand-ins (small shell scripts) log every call and act like python3, the environment's python and
nvidia-smi, so each run shows what the bootstrap would install and start, in milliseconds and offline.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SYSTEM_PYTHON = r"""#!/usr/bin/env bash
echo "python3 $*" >> "$FAKE_LOG"
case "$1" in
  -c) echo "${FAKE_VERSION:-3.11}"; [ "${FAKE_OLD:-0}" = 0 ] ;;            # the version probe
  -m) [ "$2" = venv ] || exit 1
      mkdir -p "$3/bin"; [ "${FAKE_VENV_FAIL:-0}" = 0 ] || exit 1
      cp "$FAKE_VENV_PYTHON" "$3/bin/python" ;;
  *system_check.py) exit "${FAKE_PY_CHECK:-0}" ;;
esac
"""
VENV_PYTHON = r"""#!/usr/bin/env bash
echo "venv $*" >> "$FAKE_LOG"
venv=$(dirname "$0")/..
case "$*" in
  *find_spec*torch*) [ -f "$venv/torch" ] ;;
  *"_cuda_getDriverVersion"*) [ "${FAKE_OLD_DRIVER:-0}" = 0 ] || echo "13.0 but the driver supports CUDA 12.4 only" ;;
  *"import sys, torch"*) [ "${FAKE_CPU_BUILD:-0}" = 0 ] ;;
  *"-q --version") [ "${FAKE_NO_PIP:-0}" = 0 ] ;;
  *"install --no-index"*) [ "${FAKE_LOCAL_TORCH:-1}" = 1 ] && touch "$venv/torch" ;;
  *"install torch"*) touch "$venv/torch" ;;
  *system_check.py*) exit "${FAKE_QT_CHECK:-0}" ;;
  *sched_getaffinity*) echo "${FAKE_CORES:-1}" ;;                          # the cores it may use
  *"-m pytest"*) echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}" >&2 ;;
  *) exit 0 ;;
esac
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


class Checkout:
    """A copy of the bootstrap in tmp_path with stand-ins on PATH; ``run`` returns (rc, stderr, log lines)."""

    def __init__(self, tmp_path: Path, gpu: bool = False) -> None:
        self.root = tmp_path / "strata"
        (self.root / "packaging").mkdir(parents=True)
        for name in ("bootstrap.sh", "system_check.py"):
            shutil.copy2(ROOT / "packaging" / name, self.root / "packaging" / name)
        (self.root / "pyproject.toml").write_text("[project]\nname = 'strata'\n")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.python3 = _script(bin_dir / "python3", SYSTEM_PYTHON)
        _script(bin_dir / "nvidia-smi", f"#!/bin/sh\nexit {0 if gpu else 1}\n")
        self.log = tmp_path / "calls.log"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "PYTHON", "OMP_NUM_THREADS", "STRATA_TEST_WORKERS"))},
                    "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(self.log),
                    "FAKE_VENV_PYTHON": str(_script(tmp_path / "venv_python", VENV_PYTHON))}

    @property
    def venv(self) -> Path:
        return self.root / ".venv"

    @property
    def stamp(self) -> str:
        return (self.venv / ".strata-installed").read_text()

    def run(self, *args: str, **env: str) -> tuple[int, str, list[str]]:
        self.log.write_text("")
        done = subprocess.run(["bash", str(self.root / "packaging" / "bootstrap.sh"), *args], capture_output=True,
                              text=True, env={**self.env, **env}, timeout=60)
        return done.returncode, done.stderr, self.log.read_text().splitlines()


def installs(log: list[str]) -> list[str]:
    """The pip install commands a run made, without the interpreter and pip's fixed flags."""
    prefix = "venv -m pip --disable-pip-version-check -q install "
    return [line[len(prefix):] for line in log if line.startswith(prefix)]


@pytest.fixture
def checkout(tmp_path):
    return Checkout(tmp_path)


def test_gui_installs_the_runtime_only_and_starts_the_workbench(checkout):
    rc, _, log = checkout.run("gui", "--model", "m")
    assert rc == 0
    assert installs(log)[-1] == "-e ."
    assert log[-1] == "venv main.py --model m"
    assert checkout.stamp == "extras=\n"


def test_test_after_gui_adds_the_test_extras_and_a_later_gui_installs_nothing(checkout):
    checkout.run("gui")
    rc, _, log = checkout.run("test", "-q", "-x")
    assert rc == 0 and installs(log) == ["-e .[test]"] and log[-1] == "venv -m pytest -q -x"
    assert checkout.stamp == "extras=test\n"
    rc, _, log = checkout.run("gui")
    assert rc == 0 and installs(log) == [] and checkout.stamp == "extras=test\n"


@pytest.mark.parametrize("cores, workers", [("1", None), ("2", "2"), ("16", "4")])
def test_the_suite_runs_in_a_worker_process_a_core_with_one_torch_thread_each(checkout, cores, workers):
    rc, err, log = checkout.run("test", "-x", FAKE_CORES=cores)
    assert rc == 0
    if workers is None:
        assert log[-1] == "venv -m pytest -x" and "OMP_NUM_THREADS=unset" in err
    else:
        assert log[-1] == f"venv -m pytest -n {workers} -x" and "OMP_NUM_THREADS=1" in err


@pytest.mark.parametrize("value, command", [("0", "venv -m pytest -x"), ("3", "venv -m pytest -n 3 -x")])
def test_the_number_of_test_workers_can_be_chosen(checkout, value, command):
    rc, _, log = checkout.run("test", "-x", FAKE_CORES="8", STRATA_TEST_WORKERS=value)
    assert rc == 0 and log[-1] == command


def test_a_number_of_test_workers_that_is_not_one_is_refused_in_one_line(checkout):
    rc, err, log = checkout.run("test", STRATA_TEST_WORKERS="two")
    assert rc == 2 and err.strip().splitlines() == [
        "error: STRATA_TEST_WORKERS must be a whole number of worker processes (0: none), not 'two'"]
    assert not any("-m pytest" in line for line in log)


def test_an_edited_pyproject_reinstalls_with_the_extras_already_there(checkout):
    checkout.run("test")
    later = os.stat(checkout.venv / ".strata-installed").st_mtime + 10
    os.utime(checkout.root / "pyproject.toml", (later, later))
    rc, _, log = checkout.run("run", "true")
    assert rc == 0 and installs(log) == ["-e .[test]"] and checkout.stamp == "extras=test\n"


def test_a_stamp_from_before_extras_were_tracked_is_brought_up_to_date(checkout):
    checkout.run("gui")
    (checkout.venv / ".strata-installed").write_text("")
    rc, _, log = checkout.run("test")
    assert rc == 0 and installs(log) == ["-e .[test]"]


def test_without_a_gpu_a_local_torch_wheel_comes_first_and_nothing_names_a_version(checkout):
    _, _, log = checkout.run("gui")
    assert installs(log) == ["--no-index --no-deps torch>=2.5", "-e ."]


def test_without_a_gpu_or_a_local_wheel_the_cpu_index_is_next(checkout):
    _, err, log = checkout.run("gui", FAKE_LOCAL_TORCH="0")
    assert installs(log)[:2] == ["--no-index --no-deps torch>=2.5",
                                 "torch>=2.5 --index-url https://download.pytorch.org/whl/cpu --retries 1 --timeout 30"]
    assert "installing a CPU build of PyTorch" in err


def test_with_an_nvidia_gpu_the_default_cuda_build_is_installed(tmp_path):
    checkout = Checkout(tmp_path, gpu=True)
    rc, err, log = checkout.run("gui")
    assert rc == 0 and installs(log) == ["torch>=2.5", "-e ."]
    assert "installing a CUDA build of PyTorch" in err and "note:" not in err


def test_a_cpu_build_on_a_gpu_machine_is_pointed_out(tmp_path):
    _, err, _ = Checkout(tmp_path, gpu=True).run("gui", FAKE_CPU_BUILD="1")
    assert "note: pip installed a CPU build of PyTorch on a machine with an NVIDIA GPU" in err


def test_a_cuda_build_the_driver_is_too_old_for_is_pointed_out(tmp_path):
    rc, err, _ = Checkout(tmp_path, gpu=True).run("gui", FAKE_OLD_DRIVER="1")
    assert rc == 0 and "note: this PyTorch is built for CUDA 13.0 but the driver supports CUDA 12.4 only" in err
    assert "update the NVIDIA driver" in err


def test_torch_already_there_is_left_alone(checkout):
    checkout.run("gui")
    (checkout.venv / ".strata-installed").unlink()
    _, _, log = checkout.run("gui")
    assert installs(log) == ["-e ."]


def _one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


@pytest.mark.parametrize("args, says", [(("frobnicate",), "unknown mode 'frobnicate'"),
                                        (("run",), "run needs a command")])
def test_a_wrong_mode_is_one_line_before_anything_is_installed(checkout, args, says):
    rc, err, log = checkout.run(*args)
    assert rc == 2 and says in _one_error_line(err)
    assert log == [] and not checkout.venv.exists()


def test_an_old_python_is_one_line_and_no_environment(checkout):
    rc, err, _ = checkout.run("gui", FAKE_OLD="1", FAKE_VERSION="3.8")
    assert rc == 2 and not checkout.venv.exists()
    assert _one_error_line(err).startswith("error: Strata needs Python 3.10 or newer and python3 is 3.8: ")
    assert "PYTHON=python3.12" in err


def test_a_missing_python_is_named_with_install_commands(checkout):
    rc, err, log = checkout.run("test", PYTHON="python3.99-nowhere")
    assert rc == 2 and "python3.99-nowhere not found" in _one_error_line(err) and "apt-get install" in err


def test_a_python_without_venv_stops_before_making_one(checkout):
    rc, _, log = checkout.run("gui", FAKE_PY_CHECK="2")
    assert rc == 2 and not checkout.venv.exists()
    assert not any(line.startswith("python3 -m venv") for line in log)


def test_a_failed_venv_is_removed_only_when_this_run_made_it(checkout):
    rc, err, _ = checkout.run("gui", FAKE_VENV_FAIL="1")
    assert rc == 2 and "could not make" in err and not checkout.venv.exists()
    checkout.venv.mkdir()
    (checkout.venv / "notes.txt").write_text("mine")
    rc, _, _ = checkout.run("gui", FAKE_VENV_FAIL="1")
    assert rc == 2 and (checkout.venv / "notes.txt").read_text() == "mine"


def test_an_environment_without_pip_says_how_to_start_over(checkout):
    checkout.run("gui")
    (checkout.venv / ".strata-installed").unlink()
    rc, err, _ = checkout.run("gui", FAKE_NO_PIP="1")
    assert rc == 2 and "has no pip" in _one_error_line(err) and "rm -rf .venv" in err


def test_gui_stops_with_exit_2_when_the_qt_check_fails_and_never_starts_qt(checkout):
    rc, _, log = checkout.run("gui", FAKE_QT_CHECK="2")
    assert rc == 2 and not any(line.startswith("venv main.py") for line in log)
    assert any(line.endswith("system_check.py gui") for line in log)


def test_the_test_mode_checks_qt_before_pytest(checkout):
    rc, _, log = checkout.run("test", FAKE_QT_CHECK="2")
    assert rc == 2 and not any("-m pytest" in line for line in log)


def test_a_check_that_cannot_run_does_not_block_the_workbench(checkout):
    rc, _, log = checkout.run("gui", FAKE_QT_CHECK="1")
    assert rc == 0 and log[-1] == "venv main.py"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "packaging/bootstrap.sh test" in ci
    assert "packaging/bootstrap.sh test" in (ROOT / "README.md").read_text()
