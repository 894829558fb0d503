#!/usr/bin/env bash
# Installs Strata and everything it needs into ./.venv, then runs one of:
#   packaging/bootstrap.sh gui  [main.py options]   the workbench on the bundled demo model
#   packaging/bootstrap.sh test [pytest options]    the test suite
#   packaging/bootstrap.sh run  COMMAND...          any command inside the environment
# A machine with an NVIDIA GPU gets a CUDA build of PyTorch; one without gets a CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "NVIDIA GPU found: installing a CUDA build of PyTorch" >&2
    "${pip[@]}" install "torch>=2.4"
  else
    echo "No NVIDIA GPU found: installing a CPU build of PyTorch" >&2
    # A local CPU wheel when the machine has one, else the CPU index, else the default build.
    "${pip[@]}" install --only-binary=:all: "torch==2.13.0+cpu" 2>/dev/null \
      || "${pip[@]}" install "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
      || "${pip[@]}" install "torch>=2.4"
  fi
fi
stamp="$venv/.strata-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "${pip[@]}" install -e ".[test]"
  touch "$stamp"
fi

cmd=${1:-gui}
shift || true
case "$cmd" in
  gui)  exec "$venv/bin/python" main.py "$@" ;;
  test) exec "$venv/bin/python" -m pytest "$@" ;;
  run)  export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"; exec "$@" ;;
  *) echo "usage: packaging/bootstrap.sh gui|test|run ..." >&2; exit 2 ;;
esac
