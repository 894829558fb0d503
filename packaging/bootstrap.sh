#!/usr/bin/env bash
# Installs Strata and what it needs into ./.venv, then runs one of:
#   packaging/bootstrap.sh gui  [main.py options]   the workbench on the bundled demo model (runtime only)
#   packaging/bootstrap.sh test [pytest options]    the test suite (runtime and the test extras), a worker
#                                                   process a core (at most 4; STRATA_TEST_WORKERS=N)
#   packaging/bootstrap.sh run  COMMAND...          any command inside the environment (runtime only)
# A machine with an NVIDIA GPU gets a CUDA build of PyTorch; one without gets a CPU build. What would fail
# later is one line naming the fix, and exit code 2 (packaging/system_check.py): an old Python or no venv
# module before anything is installed; a system library Qt's window needs, or no display, once PySide6 is
# installed (the check reads its plugin), before anything is started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
stamp="$venv/.strata-installed"   # "extras=a,b": what the last install put in, newer than pyproject.toml
check="$root/packaging/system_check.py"
py=${PYTHON:-python3}

fail() { echo "error: $*" >&2; exit 2; }

mode=${1:-gui}
shift || true
case "$mode" in
  gui|run) extras="" ;;
  test) extras="test" ;;
  *) fail "unknown mode '$mode': use packaging/bootstrap.sh gui|test|run ..." ;;
esac
if [ "$mode" = test ]; then
  case "${STRATA_TEST_WORKERS:-0}" in
    *[!0-9]*) fail "STRATA_TEST_WORKERS must be a whole number of worker processes (0: none), not '$STRATA_TEST_WORKERS'" ;;
  esac
fi
if [ "$mode" = run ] && [ $# -eq 0 ]; then
  fail "run needs a command: packaging/bootstrap.sh run python main.py info"
fi

make_venv() {
  command -v "$py" >/dev/null 2>&1 \
    || fail "$py not found: install Python 3.10 or newer (Debian/Ubuntu: sudo apt-get install python3 python3-venv;" \
            "Fedora: sudo dnf install python3; Arch: sudo pacman -S python), or name one: PYTHON=/path/to/python3 $0 $mode"
  local version
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 10))') \
    || fail "Strata needs Python 3.10 or newer and $py is ${version:-too old}: install a newer one (your distribution's" \
            "python3.12 package, pyenv or \`uv python install 3.12\`) and name it: PYTHON=python3.12 $0 $mode"
  "$py" "$check" python || exit 2
  local fresh=0
  [ -e "$venv" ] || fresh=1
  if ! "$py" -m venv "$venv"; then
    [ "$fresh" = 1 ] && rm -rf "$venv"    # only what this run made: a half-made one would be taken as ready
    fail "$py could not make $venv (the lines above say why)"
  fi
}

# "<build's CUDA> but the driver supports CUDA <x.y> only" where the driver is older than the build needs
driver_check='
import torch
need = torch.version.cuda
have = torch._C._cuda_getDriverVersion() if need else 0      # e.g. 12040; 0: no driver seen
if need and have and (have // 1000, have % 1000 // 10) < tuple(int(x) for x in need.split(".")[:2]):
    print(f"{need} but the driver supports CUDA {have // 1000}.{have % 1000 // 10} only")
'

# One of: a torch wheel pip has on disk (its find-links: no download, no version named here), the CPU
# index, the default build. The default build on Linux is a CUDA build, which also runs on a CPU.
install_torch() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "NVIDIA GPU found: installing a CUDA build of PyTorch" >&2
    "${pip[@]}" install "torch>=2.5"
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null \
      || echo "note: pip installed a CPU build of PyTorch on a machine with an NVIDIA GPU; for the GPU, install" \
              "the CUDA build that https://pytorch.org/get-started/locally/ names, with $0 run pip install ..." >&2
    # a CUDA build newer than the driver runs on the CPU only: say so now, not at the first load ("" when it fits)
    old_driver=$("$venv/bin/python" -c "$driver_check" 2>/dev/null || true)
    [ -z "$old_driver" ] || echo "note: this PyTorch is built for CUDA $old_driver; update the" \
      "NVIDIA driver, or install a PyTorch built for the driver's CUDA version with $0 run pip install ..." >&2
  else
    echo "No NVIDIA GPU found: installing a CPU build of PyTorch" >&2
    "${pip[@]}" install --no-index --no-deps "torch>=2.5" 2>/dev/null \
      || "${pip[@]}" install "torch>=2.5" --index-url https://download.pytorch.org/whl/cpu --retries 1 --timeout 30 \
      || "${pip[@]}" install "torch>=2.5"
  fi
}

stamp_extras() { sed -n 's/^extras=//p' "$stamp" 2>/dev/null | head -n 1; }

# Whether the environment lacks something mode needs: no stamp, an older one than pyproject.toml, or
# one that does not list mode's extras.
needs_install() {
  [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && grep -q '^extras=' "$stamp" || return 0
  [ -z "$extras" ] && return 1
  case ",$(stamp_extras)," in *",$extras,"*) return 1 ;; *) return 0 ;; esac
}

[ -x "$venv/bin/python" ] || make_venv
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if needs_install; then
  "${pip[@]}" --version >/dev/null 2>&1 \
    || fail "$venv has no pip (an earlier set-up stopped half-way): remove it (rm -rf .venv) and run $0 $mode again"
  "$venv/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' \
    || install_torch
  # keep the extras an earlier install put in: a gui install after a test install leaves the tests working
  want=$( (stamp_extras | tr ',' '\n'; echo "$extras") | grep -v '^$' | sort -u | paste -sd, - || true)
  "${pip[@]}" install -e ".${want:+[$want]}"
  # an environment made by an earlier install may hold the Hub package `kernels` (transformers 5.25 pulls
  # it in), whose import name is this project's kernels/: it would hide them
  if "$venv/bin/python" -c 'import importlib.metadata as m; m.distribution("kernels")' 2>/dev/null; then
    "${pip[@]}" uninstall -y kernels
  fi
  echo "extras=$want" > "$stamp.new" && mv "$stamp.new" "$stamp"
fi

case "$mode" in
  gui)
    "$venv/bin/python" "$check" gui "$@" || { rc=$?; [ "$rc" -ne 2 ] || exit 2; }
    exec "$venv/bin/python" main.py "$@" ;;
  test)
    "$venv/bin/python" "$check" tests || { rc=$?; [ "$rc" -ne 2 ] || exit 2; }
    # one worker process a core this process may use, at most 4 (STRATA_TEST_WORKERS=N chooses; 0 or 1:
    # everything in this process); a worker's torch keeps to one thread, so that the workers' thread
    # pools do not take turns on the same cores
    workers=${STRATA_TEST_WORKERS:-}
    if [ -z "$workers" ]; then
      workers=$("$venv/bin/python" -c 'import os
print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)')
      case "$workers" in ''|*[!0-9]*) workers=1 ;; esac
      [ "$workers" -le 4 ] || workers=4
    fi
    if [ "$workers" -gt 1 ]; then
      export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
      exec "$venv/bin/python" -m pytest -n "$workers" "$@"
    fi
    exec "$venv/bin/python" -m pytest "$@" ;;
  run)
    export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
    exec "$@" ;;
esac
