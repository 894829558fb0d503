#!/usr/bin/env bash
# Everything that needs a GPU, in one command: the GPU-only tests, the MoE kernel benchmark (with a
# tuned launch table for kernels/configs/), end to end against transformers, and the expert-residency
# sweep. Result files go to OUT (default benchmarks/results/gpu-DATE); the last lines printed are a
# short summary of each part.
#
#   STRATA_COMMIT=$(git rev-parse --short HEAD) OUT=/tmp/out benchmarks/gpu_suite.sh [tests|kernels|e2e|residency ...]
#
# With no arguments every part runs (about 15 minutes on an H200: tests and kernels 1-2, e2e 2,
# residency about 12 (an estimate at 64 timed tokens), model builds included); where one command may
# run 10 minutes at most, run `tests kernels e2e`, `ROUTINGS=uniform ... residency` and
# `ROUTINGS=trained-like ... residency` as three commands. Each part writes its log and JSON as soon as it ends, so a cut-short run keeps
# what finished. STRATA_COMMIT names the commit where the tree has no .git.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu-$(date +%Y-%m-%d)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}                      # the interpreter with torch (PYTHON=.venv/bin/python here)
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests kernels e2e residency)
summary=()

for part in "${parts[@]}"; do
  case $part in
    tests)
      # one line per test as it ends (a run cut short still names what failed), and, where pytest-xdist
      # is installed, four workers: a fresh machine spends most of the suite compiling kernels
      workers=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 4" || echo "")
      "$PY" -m pytest tests/engine/test_gpu_decode.py tests/engine/test_gpu_moe_int4.py tests/engine/test_gpu_gpt_oss.py \
        tests/engine/test_gpu_cold.py tests/engine/test_gpu_passes.py tests/engine/test_gpu_memory.py -p no:cacheprovider \
        -vv -rf $workers 2>&1 | tee "$OUT/tests.log" | grep -v -e " PASSED" -e "^$" | tail -8
      summary+=("tests: $(tail -1 "$OUT/tests.log")");;
    kernels)
      # the tuned table is named after the card (kernels/configs/NVIDIA_H200.json on an H200)
      table=$("$PY" -c "import torch; from kernels.moe_config import config_file_name as n
print(n(torch.cuda.get_device_name()))")
      "$PY" benchmarks/kernels/bench_moe.py --out "$OUT/kernels_moe.json" --configs-out "$OUT/$table" \
        --commit "${STRATA_COMMIT:-unknown}" > "$OUT/kernels.log" 2>&1
      summary+=("kernels:" "$(tail -13 "$OUT/kernels.log")");;
    e2e)
      "$PY" benchmarks/bench_e2e.py --formats int4,fp8 --batches 1,8 --tokens 64 --out "$OUT/e2e.json" \
        > "$OUT/e2e.log" 2>&1
      summary+=("e2e:" "$(grep -E '^(transformers|strata)' "$OUT/e2e.log")");;
    residency)
      # one process per routing (ROUTINGS picks: each takes about 6 minutes, so where one command may
      # run 10 minutes at most, run them as two commands); the merged file once both exist. 64 tokens
      # after 16 warm-up: the prefetch gate learns over the first steps, and a short run measures that
      for r in ${ROUTINGS:-uniform trained-like}; do
        "$PY" benchmarks/bench_e2e.py --formats "" --offload bf16 --pools 0,0.25,0.5,1.0 --depths 0,1,2 \
          --batches 1,8 --routing "$r" --tokens 64 --warmup 16 --budget 64G --out "$OUT/residency_$r.json" \
          > "$OUT/residency_$r.log" 2>&1
      done
      if [ -f "$OUT/residency_uniform.json" ] && [ -f "$OUT/residency_trained-like.json" ]; then
        "$PY" benchmarks/merge_residency.py "$OUT/residency.json" "$OUT/residency_uniform.json" \
          "$OUT/residency_trained-like.json"
      fi
      summary+=("residency:" "$(grep -hE '^(uniform|trained-like) batch' "$OUT"/residency_*.log)");;
    *)
      echo "unknown part '$part': choose tests, kernels, e2e or residency" >&2
      exit 2;;
  esac
done

printf '\n== summary (%s) ==\n' "$OUT"
printf '%s\n' "${summary[@]}"
