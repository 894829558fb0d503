#!/usr/bin/env bash
# The GPU evidence of one device session, in calls of at most 10 minutes each, one after the other on
# the same warm machine (each phase returns within PHASE_S seconds; a background job runs on between
# them). Nothing that measures runs beside anything else: the GPU tests first and alone, then the
# llama.cpp comparison kit alone, then the gpt-oss cells, each from a fresh process.
#
#   on this machine, once per commit to be measured:  bash ../shared/anchors/llamacpp/prepare.sh .bench
#   device call 1:  bash benchmarks/h200_session.sh tests-and-kit     (carry .bench)
#   device call 2:  bash benchmarks/h200_session.sh kit-then-gpt-oss  (carry .bench)
#   device call 3:  bash benchmarks/h200_session.sh gpt-oss           (repeat until it says done)
#   or:              bash benchmarks/h200_session.sh tests-ab-kit      (carry .bench: the GPU tests, the resident
#                    step with and without programmatic dependent launches, then the kit in the background;
#                    follow it with kit-then-gpt-oss)
#   or:              bash benchmarks/h200_session.sh validate          (carry .bench: the GPU tests; the
#                    resident step; where the card's memory goes at no pool and what a closed engine still
#                    holds, with and without expandable segments; then the kit in the background: follow
#                    it with kit-then-gpt-oss, or poll it with bash .bench/kit/poll.sh 540; NO_KIT=1: no kit)
#   or:              bash benchmarks/h200_session.sh gather-kit        (carry .bench: the GPU tests, the gather's
#                    read rate from host memory by variant, then the kit in the background; poll it after)
#   or:              bash benchmarks/h200_session.sh cold-kit          (carry .bench: the GPU tests, gpt-oss-120b
#                    at 24G with the defaults against fill_share=1, then the random-routing kit in the
#                    background; poll it after)
#   or:              bash benchmarks/h200_session.sh kit               (carry .bench: the kit alone, in the
#                    background; follow it with kit-then-gpt-oss)
#   or:              bash benchmarks/h200_session.sh checks            (the GPU tests; decode steps launched ahead
#                    against one at a time; the CPU kernels' phases at 15 and 16 threads; no pool at int4,
#                    depth 0 and 2, batch 1 and 8, cold experts auto / bus / cpu; the resident step without
#                    programmatic dependent launches, kernel by kernel. Then, alone: tests-and-kit's kit
#                    with `kit`, followed by kit-then-gpt-oss)
#   or:              bash benchmarks/h200_session.sh tests-profile-kit (carry .bench: the GPU tests, the resident step
#                    and a prefill kernel by kernel, then the kit in the background; poll it after)
#   or:              bash benchmarks/h200_session.sh prefill-ab        (the GPU tests; a 512-token prefill kernel by kernel
#                    with the int4 tiles of joined nibbles and the parallel alignment, each on and off)
#   or:              bash benchmarks/h200_session.sh tests-table-kit   (carry .bench: the GPU tests, the MoE kernels'
#                    sweep with the card's tuned table, then the kit in the background, trained-like unless
#                    KIT_TRAINED=0; poll it after, then after-kit)
#   or:              bash benchmarks/h200_session.sh ab-kit    (carry .bench: the GPU tests, the resident step and
#                    prefill with +gemv16 and +alignwN, then the kit (trained-like) in the background on this
#                    commit with gemv16 on where it won; poll it, then finish: gpt-oss-20b resident, predict_ab)
#   or:              bash benchmarks/h200_session.sh gemv-on   (the GPU tests with kernels/qlinear.GEMV16 turned on in
#                    the device's copy; gpt-oss-20b resident and the resident bf16 step with it off and on in turn)
#   or:              bash benchmarks/h200_session.sh gemv-order (carry .bench: as gemv-on, then the kit's int4 offload
#                    rows at 50% and 25% with depth 0 loaded first against depth 2 first, on the trained-like model)
#   or:              bash benchmarks/h200_session.sh one-call  (carry .bench: the GPU tests with gemv16 on, gpt-oss-20b
#                    with it off and on, then warm-ab's int4 rows)
#   or:              bash benchmarks/h200_session.sh warm-ab   (carry .bench: the kit's offload rows with and without a
#                    prompt's chunks ranking the experts they admit, on the trained-like model)
#   or:              bash benchmarks/h200_session.sh after-kit         (once the kit is done: the 512-token prefill
#                    on the kit's own checkpoint, int4 and bf16 (PROFILE_CELLS), median of five with the host's
#                    Python profiled; gpt-oss-20b every expert resident)
#   or:              bash benchmarks/h200_session.sh turns             (the GPU tests; the CPU kernel in one parallel
#                    region or two; the card's memory over the kit's engines loaded in turn; predict_ab at AB_SHARES)
#   or:              bash benchmarks/h200_session.sh tuner             (the GPU tests; replays predicting or not
#                    by measured step time against depth 0 and always predicting, trained-like routing;
#                    the CPU kernel's OpenMP workers spinning longer between calls)
#   or:              bash benchmarks/h200_session.sh cold-ab   (the GPU tests; gpt-oss-120b at 24G with residency
#                    tunings A/B (AB_VARIANTS), batch-1 steps profiled)
#   or:              bash benchmarks/h200_session.sh share-ab  (carry .bench: no pool on the kit's random model,
#                    replays with a CPU share tuner per recording against one for both, in both orders; then
#                    the GPU tests; with time left, a 512-token prefill kernel by kernel, int4 and bf16)
#   or:              bash benchmarks/h200_session.sh pages     (the host store's pages: copy engine, the gather's
#                    kernel and the CPU kernel on pinned, registered and huge-page rows; no pool, bf16 and int4,
#                    the engine's store on huge pages against 4 KiB ones; then the GPU tests)
#   or:              bash benchmarks/h200_session.sh prefill-py (carry .bench: the GPU tests; the kit's random model's
#                    512-token prefill, int4 and bf16, kernels, torch's host operators and the host's Python)
#   or:              bash benchmarks/h200_session.sh memory    (the GPU tests; the card's memory phase by phase at no
#                    pool on the kit's trained-like checkpoint, int4 and bf16 in turn, and int4 with expandable segments)
#   or:              bash benchmarks/h200_session.sh table     (the card's MoE launch table: the sweep, merged; gpt-oss-20b
#                    and the resident int4 step before and after it is put in place)
#   or, alone:       bash benchmarks/h200_session.sh probes            (the gather's A/B and copy rates)
#   or, alone:       bash benchmarks/h200_session.sh no-pool           (GPU tests, the resident step with
#                    and without programmatic dependent launches, then what a no-pool step could move:
#                    the CPU kernels' phases, the copy kernel's rate, gather-all and copies against
#                    direct reads)
#
# KIT_ARGS picks the kit's options (default: shares 50,25,0, no Q4_0); KIT_TRAINED=1 has the kit
# measure the benchmarks' trained-like model (written first by trained_like_checkpoint.py, then
# given as --hf) instead of its random one; GO_ARGS those of
# bench_gpt_oss.py (default: cells b then c, both routings). Results go to $OUT (the device tool's),
# else to /tmp/h200-out. STRATA_COMMIT names the commit where the tree has no .git (default: the one
# prepare.sh packed).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200-out}
PHASE_S=${PHASE_S:-560}
KIT_ARGS=${KIT_ARGS:---shares 50,25,0 --no-q4-0}
GO_ARGS=${GO_ARGS:---cells b,c --deadline 900}
GO=$HOME/h200-gpt-oss
TRAINED=/dev/shm/strata-trained-like-L12     # this script's own folder (KIT_TRAINED=1)
export PYTHONUNBUFFERED=1
export STRATA_COMMIT=${STRATA_COMMIT:-$(sed -n 's/^strata_commit=//p' .bench/versions.txt 2>/dev/null)}
mkdir -p "$OUT"
left() { echo $((PHASE_S - SECONDS)); }

kit_done() { grep -q ' run-done$' "$(readlink -f "$HOME/llamacpp-anchor/latest")/marks.txt" 2>/dev/null; }

gpu_tests() {
  # the card's name, then the GPU tests within $1 seconds; nothing of them may run beside what follows;
  # with "gate", a failure ends the phase (no kit on a build the tests refuse)
  nvidia-smi --query-gpu=name --format=csv,noheader
  mkdir -p "$OUT/suite"
  OUT="$OUT/suite" PYTHON=python3 timeout -k 10 "$1" bash benchmarks/gpu_suite.sh tests
  pkill -f "pytest tests/engine/test_gpu" 2>/dev/null
  if [ "${2:-}" = gate ] && tail -n 1 "$OUT/suite/tests.log" | grep -q -e failed -e error; then
    echo "GPU tests failed: no kit"; exit 1
  fi
}

start_kit() {
  # the kit in the background (trained-like model where KIT_TRAINED is 1; $1 is its default), followed here
  if [ "${KIT_TRAINED:-${1:-0}}" = 1 ]; then
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 4
    KIT_ARGS="$KIT_ARGS --hf $TRAINED"
  fi
  bash .bench/kit/run.sh --background $KIT_ARGS || exit 1
  bash .bench/kit/poll.sh "$(left)" | tail -n 12
}

start_gpt_oss() {
  # The kit's model files are its own, made by this session's run: remove them for the host memory
  # the 120b store needs (57 GiB pinned).
  kit_done && rm -rf /dev/shm/llamacpp-anchor "$TRAINED"
  mkdir -p "$GO" && rm -rf "$GO/src" && cp -r . "$GO/src"
  (cd "$GO/src" && setsid nohup python3 benchmarks/bench_gpt_oss.py $GO_ARGS --out "$GO/gpt_oss.json" \
     > "$GO/log" 2>&1 < /dev/null & echo $! > "$GO/pid")
  echo "gpt-oss cells started (log $GO/log)"
}

follow_gpt_oss() {
  local pid; pid=$(cat "$GO/pid" 2>/dev/null) || { echo "no gpt-oss run started"; return 1; }
  while kill -0 "$pid" 2>/dev/null && [ "$(left)" -gt 5 ]; do sleep 5; done
  cp "$GO/gpt_oss.json" "$GO/log" "$OUT/" 2>/dev/null
  if kill -0 "$pid" 2>/dev/null; then echo "gpt-oss: still running"; else echo "gpt-oss: done"; fi
  tail -n 25 "$GO/log"
}

case ${1:-} in
  tests-and-kit)
    gpu_tests 330
    start_kit;;
  tests-ab-kit)
    gpu_tests 300
    timeout 100 python3 benchmarks/step_profile.py --cells int4/bf16,int4/bf16+nopdl,int4/fp8 --out "$OUT/step_profile.json" 2>&1 \
      | grep -e "tok/s" -e Error
    start_kit;;
  validate)
    nvidia-smi --query-gpu=name --format=csv,noheader
    # no pool, cold experts auto, bus and cpu: where the CPU's share goes at prefetch depth 2 against 0
    timeout 150 python3 benchmarks/cold_experts.py --formats int4 --pools 0 --depths 2,0 --batches 1,8 --modes auto,bus,cpu \
      --tokens 48 --out "$OUT/cold_depth.json" 2>&1 | grep -v -e "^  [^ ]" -e "^[^ ]*Warn"
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 2
    # where the card's memory goes at no pool, and what a closed engine still holds; then the same with
    # the allocator's expandable segments (less memory reserved beyond what is allocated)
    timeout 90 python3 benchmarks/memory_gap.py --hf "$TRAINED" --format int4 --pool 0% --out "$OUT/memory_gap.json" \
      2>&1 | grep -v -e Warn -e "^ *$" -e "_kernel " | tail -n 16
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 90 python3 benchmarks/memory_gap.py --hf "$TRAINED" \
      --format int4 --pool 0% --out "$OUT/memory_gap_expandable.json" 2>&1 | grep -v -e Warn -e "^ *$" -e "_kernel " \
      | tail -n 8
    mkdir -p "$OUT/suite"
    OUT="$OUT/suite" PYTHON=python3 timeout -k 10 $(( $(left) > 320 ? 300 : $(left) - 20 )) bash benchmarks/gpu_suite.sh tests
    pkill -f "pytest tests/engine/test_gpu" 2>/dev/null
    [ "$(left)" -gt 60 ] && timeout $(( $(left) - 10 )) python3 benchmarks/step_profile.py --cells int4,int4+gemv \
      --out "$OUT/step_profile.json" 2>&1 | grep -e "tok/s" -e Error
    [ "${NO_KIT:-0}" = 1 ] && exit 0           # NO_KIT=1: the measurements only
    if [ "${KIT_TRAINED:-0}" = 1 ]; then KIT_ARGS="$KIT_ARGS --hf $TRAINED"; fi
    bash .bench/kit/run.sh --background $KIT_ARGS || exit 1
    bash .bench/kit/poll.sh "$(left)" | tail -n 12;;
  tests-profile-kit)
    # the GPU tests; the resident step and a 512-token prefill, kernel by kernel (the attention's folded
    # combine of every head at once against head after head); then the kit in the background, followed
    # here (follow it with: bash .bench/kit/poll.sh 540)
    gpu_tests 240 gate
    timeout 130 python3 benchmarks/step_profile.py --cells "${PROFILE_CELLS:-int4,int4+perhead,bf16}" --timed 48 \
      --profiled 4 --prefill 512 --out "$OUT/step_profile.json" 2>&1 | grep -e "tok/s" -e Error -e "  host" -e "^   "
    start_kit;;
  tests-table-kit)
    gpu_tests 260 gate
    OUT="$OUT/kernels" PYTHON=python3 STRATA_COMMIT=$STRATA_COMMIT timeout 180 bash benchmarks/gpu_suite.sh kernels \
      | tail -n 16
    start_kit 1;;
  ab-kit)
    # the GPU tests; the resident step and a 512-token prefill with one-token 16-bit matrices and routers
    # on the GEMV kernel (+gemv16) and the alignment's one program on 8 and 16 warps; then the kit
    # (trained-like) in the background on this commit, with gemv16 on where it won both formats' steps
    gpu_tests 250 gate
    timeout 170 python3 benchmarks/step_profile.py --timed 48 --profiled 2 --prefill 512 \
      --cells "${PROFILE_CELLS:-int4,int4+gemv16,bf16,bf16+gemv16,int4+alignw8,int4+alignw16}" \
      --out "$OUT/ab.json" 2>&1 | grep -e "tok/s" -e Error -e "_align"
    src=$HOME/strata-kit-src
    rm -rf "$src" && mkdir -p "$src" && tar -xzf .bench/strata.tgz -C "$src"
    if python3 benchmarks/h200_pick.py "$OUT/ab.json" gemv16 int4 bf16; then
      sed -i 's/^GEMV16 = False$/GEMV16 = True/' "$src/kernels/qlinear.py"
      grep -q '^GEMV16 = True$' "$src/kernels/qlinear.py" && echo "the kit measures $STRATA_COMMIT with GEMV16 on"
    fi
    KIT_ARGS="$KIT_ARGS --strata $src"
    start_kit 1;;
  finish)
    # the kit's end, then predict_ab at AB_SHARES (bf16 25%) and, with time left, gpt-oss-20b resident
    bash .bench/kit/poll.sh "$(( $(left) - 240 ))" | tail -n 70
    kit_done || { echo "the kit is still running: call this phase again"; exit 0; }
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 2
    timeout "$(( $(left) > 400 ? 200 : $(left) - 5 ))" python3 benchmarks/predict_ab.py --hf "$TRAINED" \
      --formats "${AB_FORMATS:-bf16}" --shares "${AB_SHARES:-25}" --out "$OUT/predict_ab.json" 2>&1 \
      | grep -v -e Warn -e "^ *$" | tail -n 20
    [ "$(left)" -gt 120 ] && timeout "$(( $(left) - 5 ))" python3 benchmarks/bench_gpt_oss.py --cells a \
      --out "$OUT/gpt_oss_a.json" 2>&1 | tail -n 8;;
  gemv-on)
    # gemv16 turned on in this copy; the GPU tests with it; gpt-oss-20b resident with it off and on, the
    # resident bf16 step without and with it, then gpt-oss again in turn while time is left
    sed -i 's/^GEMV16 = False$/GEMV16 = True/' kernels/qlinear.py
    grep -c '^GEMV16 = True$' kernels/qlinear.py
    gpu_tests 175
    oss() { [ "$(left)" -gt 35 ] && timeout 35 python3 benchmarks/bench_gpt_oss.py --cells a --routing uniform \
      --gemv16 "$1" --out "$OUT/gpt_oss_a_$1_$2.json" 2>&1 | grep "^a 20b"; }
    oss off 1; oss on 1
    [ "$(left)" -gt 45 ] && timeout 45 python3 benchmarks/step_profile.py --timed 64 --profiled 2 \
      --cells bf16,bf16+gemv16 --out "$OUT/gemv_ab.json" 2>&1 | grep -e "tok/s" -e Error
    oss off 2; oss on 2;;
  gemv-order)
    # the GPU tests (gemv16 on by default); gpt-oss-20b resident with gemv16 off and on, twice in turn;
    # the resident step with and without it in turn; then the kit's offload rows of int4 at 50% and 25%
    # with depth 0 loaded first against depth 2 first (the kit's order), on the trained-like checkpoint
    gpu_tests 200
    for i in 1 2; do for g in off on; do
      timeout 60 python3 benchmarks/bench_gpt_oss.py --cells a --routing uniform --gemv16 $g \
        --out "$OUT/gpt_oss_a_${g}_$i.json" 2>&1 | grep "^a 20b"
    done; done
    timeout 200 python3 benchmarks/step_profile.py --timed 64 --profiled 2 \
      --cells bf16,bf16+gemv16,int4+gemv16,int4,bf16+gemv16,bf16,int4,int4+gemv16 --out "$OUT/gemv_ab.json" 2>&1 \
      | grep -e "tok/s" -e Error
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 1
    for order in 0,2 2,0; do
      [ "$(left)" -gt 70 ] || break
      timeout "$(( $(left) - 10 ))" python3 .bench/kit/bench_strata.py --strata . --model "$TRAINED" \
        --sections offload --offload-formats int4 --shares 50,25 --depths $order --out "$OUT/order_${order/,/}.json" \
        2>&1 | grep share
    done;;
  one-call)
    # what one lease must show when machines are scarce: the GPU tests with gemv16 on in this copy,
    # gpt-oss-20b resident with it off and on, then warm-ab's int4 rows at 50% then 25% while time is left
    sed -i 's/^GEMV16 = False$/GEMV16 = True/' kernels/qlinear.py
    grep -c '^GEMV16 = True$' kernels/qlinear.py
    gpu_tests 190
    for g in off on; do
      timeout 40 python3 benchmarks/bench_gpt_oss.py --cells a --routing uniform --gemv16 $g \
        --out "$OUT/gpt_oss_a_$g.json" 2>&1 | grep "^a 20b"
    done
    PHASE_S=$(left) WARM_FORMATS=int4 bash "$0" warm-ab;;
  tests-warm)
    # the shortest lease worth having: the GPU tests, then warm-ab's int4 rows at 50%
    gpu_tests 170
    PHASE_S=$(left) WARM_FORMATS=int4 WARM_SHARES=50 bash "$0" warm-ab;;
  warm-ab)
    # the kit's offload rows (its order: depth 2 loaded, then 0) on the trained-like model, with a prompt's
    # chunks ranking the experts they admit (this tree) and without (a copy with CHUNK_TOKENS out of reach),
    # one engine after the other in turn; WARM_FORMATS (default "int4 bf16"), WARM_SHARES (default "50 25")
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 1
    rm -rf /tmp/strata-unranked && cp -r . /tmp/strata-unranked
    sed -i 's/^CHUNK_TOKENS = 32$/CHUNK_TOKENS = 10**9/' /tmp/strata-unranked/engine/experts/copy_path.py
    grep -c '^CHUNK_TOKENS = 10\*\*9$' /tmp/strata-unranked/engine/experts/copy_path.py
    for fmt in ${WARM_FORMATS:-int4 bf16}; do for share in ${WARM_SHARES:-50 25}; do
      for tree in /tmp/strata-unranked .; do
        [ "$(left)" -gt 60 ] || break 3
        name=$([ "$tree" = . ] && echo ranked || echo unranked)
        timeout "$(( $(left) - 10 ))" python3 .bench/kit/bench_strata.py --strata "$tree" --model "$TRAINED" \
          --sections offload --offload-formats "$fmt" --shares "$share" --out "$OUT/warm_${fmt}_${share}_$name.json" \
          2>&1 | grep share | sed "s/^/$name /"
      done
    done; done;;
  after-kit)
    kit_done || { echo "the kit is still running: poll it first"; exit 1; }
    # the 512-token prefill on the kit's own checkpoint (the one its llama-bench pp512 read), median of
    # five after two untimed, with the host's Python profiled: the kit times only one prefill a run
    KIT_HF=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["hf"])' \
      "$(readlink -f "$HOME/llamacpp-anchor/latest")/params.json" 2>/dev/null)
    [ -f "$KIT_HF/config.json" ] || { echo "the kit's checkpoint ($KIT_HF) is gone: no prefill on it"; exit 1; }
    timeout 150 python3 benchmarks/step_profile.py --hf "$KIT_HF" --timed 16 --profiled 2 --prefill 512 \
      --cells "${PROFILE_CELLS:-int4,bf16}" --out "$OUT/prefill_kit_model.json" 2>&1 \
      | grep -e "tok/s" -e Error -e prefill -e python
    timeout "$(( $(left) - 5 ))" python3 benchmarks/bench_gpt_oss.py --cells a --out "$OUT/gpt_oss_a.json" 2>&1 \
      | tail -n 8;;
  kit)
    start_kit;;
  gather-kit)
    # the GPU tests; how fast the gather's copy kernel reads expert rows from mapped host memory against
    # the copy engine (more programs, smaller chunks, an unmasked wide variant); what one more compiled
    # kernel costs the card outside torch; then the kit
    # (trained-like unless KIT_TRAINED=0) in the background: poll it with bash .bench/kit/poll.sh 540
    gpu_tests 250 gate
    timeout 120 python3 benchmarks/gather_rate.py --rows 8,64 --out "$OUT/gather_rate.json" 2>&1 | grep -v Warn \
      | tail -n 40
    timeout 60 python3 benchmarks/module_memory.py --out "$OUT/module_memory.json" 2>&1 | tail -n 3
    start_kit 1;;
  cold-kit)
    # the GPU tests; gpt-oss-120b at 24G (trained-like, batch 1, 4 and 16) with the defaults against every
    # free staging slot leased for fills (fill_share=1), each batch's two in turn on one engine; then,
    # once that process has ended (its store is 57 GiB of pinned memory), the kit on the random model
    # (KIT_TRAINED=1: the trained-like one) in the background: poll it with bash .bench/kit/poll.sh 540
    gpu_tests 250 gate
    rm -rf /dev/shm/llamacpp-anchor "$TRAINED"
    timeout 200 python3 benchmarks/bench_gpt_oss.py --cells b --routing trained-like --batches 1,4,16 \
      --variants defaults,fill_share=1 --out "$OUT/gpt_oss_cold_ab.json" 2>&1 | grep -v USDT | tail -n 12
    start_kit 0;;
  pages)
    # where a kernel's reads of mapped host memory lose to the copy engine's (29-33 against 48 GB/s,
    # gather_rate_2026-12-07.json): the store on 4 KiB pages against 2 MiB ones, then whole no-pool steps
    grep -m1 "model name" /proc/cpuinfo
    timeout 150 python3 benchmarks/gather_rate.py --backings pinned,registered,thp --quick --rows 8,64 \
      --out "$OUT/gather_rate_pages.json" 2>&1 | grep -v -e Warn -e "^ *$"
    timeout $(( $(left) > 500 ? 260 : $(left) / 2 )) python3 benchmarks/cold_experts.py --formats bf16,int4 --pools 0 \
      --depths 2 --batches 1,8 --modes bus,auto --host-pages huge,4k --tokens 48 --out "$OUT/cold_pages.json" 2>&1 \
      | grep -e "tok/s" -e Error -e failed
    gpu_tests $(( $(left) - 10 ));;
  prefill-py)
    # the prefill step's wall time was twice its GPU time on the kit's model (step_profile_2026-12-08.json):
    # where the host's time goes, by Python function, on the same checkpoint
    gpu_tests 250
    RAND_HF=/dev/shm/strata-random-L12
    [ -d "$RAND_HF" ] || python3 .bench/kit/make_model.py "$RAND_HF" --shape qwen3-30b-a3b --layers 12 \
      --tokenizer-from resources/models/demo 2>&1 | tail -n 1
    [ "$(left)" -gt 60 ] && timeout $(( $(left) - 10 )) python3 benchmarks/step_profile.py --hf "$RAND_HF" --cells int4,bf16 --timed 8 \
      --profiled 1 --prefill 512 --out "$OUT/step_profile_prefill_py.json" 2>&1 \
      | grep -e "tok/s" -e Error -e prefill -e "py " -e python | head -n 70;;
  share-ab)
    # the kit's random model written here (its routing: the one where depth 2 lost most at no pool),
    # then predict_ab at no pool (bf16 unless AB_FORMATS): replays with one CPU share tuner per recording
    # (tuned) against one for both (tuned1), depth 0 and always predicting; then the GPU tests
    RAND_HF=/dev/shm/strata-random-L12
    [ -d "$RAND_HF" ] || python3 .bench/kit/make_model.py "$RAND_HF" --shape qwen3-30b-a3b --layers 12 \
      --tokenizer-from resources/models/demo 2>&1 | tail -n 2
    # two engines, the order turned round (a fresh engine's first replays run slower), each step's
    # time and what it ran in the results' trajectories
    for order in tuned1,tuned,depth0 tuned,tuned1; do
      timeout 150 python3 benchmarks/predict_ab.py --hf "$RAND_HF" --formats "${AB_FORMATS:-bf16}" --shares "${AB_SHARES:-0}" \
        --variants "$order" --tokens 256 --out "$OUT/predict_ab_${order%%,*}_first.json" 2>&1 \
        | grep -v -e Warn -e "^ *$" -e "_kernel " | tail -n 9
    done
    rm -rf "$RAND_HF"
    gpu_tests $(( $(left) > 260 ? 250 : $(left) - 10 ))
    # with time left: a 512-token prefill kernel by kernel, int4 against bf16 (int4's was 0.97x Q4_K_M's
    # pp512 in llamacpp_kit_2026-12-07d, bf16's 3.04x)
    [ "$(left)" -gt 100 ] && timeout $(( $(left) - 10 )) python3 benchmarks/step_profile.py --cells int4,bf16 --timed 16 \
      --profiled 2 --prefill 512 --out "$OUT/step_profile.json" 2>&1 | grep -e "tok/s" -e Error -e "  host" -e "^   ";;
  memory)
    # the GPU tests; then where the card's memory goes at no pool on the kit's trained-like checkpoint and
    # settings (batch 1 after a 512-token prompt, 8 sequences after 128-token prompts), int4 then bf16
    # loaded in turn in one process as the kit does, and int4 again with the allocator's expandable segments
    gpu_tests 250 gate
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 2
    timeout 150 python3 benchmarks/memory_gap.py --hf "$TRAINED" --sequence "${MEM_SEQ:-int4:0%,bf16:0%}" \
      --out "$OUT/memory_gap.json" 2>&1 | grep -v -e Warn -e "^ *$" -e "_kernel " | tail -n 24
    [ "${NO_EXPANDABLE:-0}" = 1 ] || PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 90 python3 benchmarks/memory_gap.py --hf "$TRAINED" \
      --format int4 --pool 0% --out "$OUT/memory_gap_expandable.json" 2>&1 | grep -v -e Warn -e "^ *$" -e "_kernel " \
      | tail -n 8;;
  cold-ab)
    # the GPU tests; then gpt-oss-120b at 24G (trained-like, batch 1, 4 and 16) with the residency tunings
    # that may take the deferred step end and the fill steps' staging off the cold layers' path, each
    # batch's variants in turn on one engine, and four batch-1 steps profiled (traces under $OUT);
    # AB_BATCHES picks the batches, NO_TESTS=1 leaves out the GPU tests (run by the call before it)
    [ "${NO_TESTS:-0}" = 1 ] || gpu_tests 250 gate
    rm -rf /dev/shm/llamacpp-anchor "$TRAINED"
    timeout $(( $(left) > 320 ? 300 : ($(left) > 40 ? $(left) - 20 : 20) )) python3 benchmarks/bench_gpt_oss.py --cells b \
      --routing trained-like --batches "${AB_BATCHES:-1,4,16}" \
      --variants "${AB_VARIANTS:-defaults,fill_share=1,end_late=1,fill_share=1:end_late=1}" --profile 4 \
      --trace-dir "$OUT/traces" --out "$OUT/gpt_oss_cold_ab.json" 2>&1 | grep -v USDT | tail -n 24;;
  table)
    # the MoE kernels' sweep on this card (16-bit, fp8 and int4 on the Qwen3 shape, MXFP4 on gpt-oss-20b's),
    # merged into the card's table; gpt-oss-20b resident and the resident int4 step before and after it is
    # put in the device copy's kernels/configs/ (the table comes back under $OUT)
    table=$(python3 -c "import torch; from kernels.moe_config import config_file_name as n
print(n(torch.cuda.get_device_name()))")
    timeout 100 python3 benchmarks/bench_gpt_oss.py --cells a --routing trained-like --rounds-a 2 \
      --out "$OUT/gpt_oss_before.json" 2>&1 | grep "20b trained"
    timeout 80 python3 benchmarks/step_profile.py --cells int4 --timed 48 --profiled 2 \
      --out "$OUT/step_before.json" 2>&1 | grep "tok/s"
    timeout 240 python3 benchmarks/kernels/bench_moe.py --formats bf16,fp8,int4 --no-grouped-mm \
      --commit "$STRATA_COMMIT" --out "$OUT/kernels_qwen3.json" --configs-out "$OUT/table_qwen3.json" 2>&1 | tail -n 14
    timeout 150 python3 benchmarks/kernels/bench_moe.py --shape gpt-oss-20b --formats mxfp4 --tokens 1,4,16,64 \
      --no-grouped-mm --commit "$STRATA_COMMIT" --out "$OUT/kernels_mxfp4.json" \
      --configs-out "$OUT/table_mxfp4.json" 2>&1 | tail -n 8
    python3 benchmarks/kernels/merge_tables.py "$OUT/$table" "$OUT/table_qwen3.json" "$OUT/table_mxfp4.json" \
      && cp "$OUT/$table" kernels/configs/
    timeout 100 python3 benchmarks/bench_gpt_oss.py --cells a --routing trained-like --rounds-a 2 \
      --out "$OUT/gpt_oss_after.json" 2>&1 | grep "20b trained"
    timeout 80 python3 benchmarks/step_profile.py --cells int4 --timed 48 --profiled 2 \
      --out "$OUT/step_after.json" 2>&1 | grep "tok/s";;
  kit-then-gpt-oss)
    bash .bench/kit/poll.sh "$(( $(left) - 60 ))" | tail -n 70
    if kit_done; then start_gpt_oss; follow_gpt_oss; else echo "the kit is still running: call this phase again"; fi;;
  gpt-oss)
    [ -f "$GO/pid" ] || start_gpt_oss
    follow_gpt_oss;;
  checks)
    nvidia-smi --query-gpu=name --format=csv,noheader
    mkdir -p "$OUT/suite"
    OUT="$OUT/suite" PYTHON=python3 timeout -k 10 260 bash benchmarks/gpu_suite.sh tests
    pkill -f "pytest tests/engine/test_gpu" 2>/dev/null
    timeout 120 python3 benchmarks/overlap_ab.py --reps 2 --out "$OUT/overlap_ab.json" 2>&1 | grep -e batch -e Error
    timeout 50 python3 benchmarks/cpu_phases.py --threads 15,16 --calls 200 --out "$OUT/cpu_phases.json" 2>&1 | tail -n 2
    timeout 60 python3 benchmarks/step_profile.py --cells int4/fp8+nopdl --out "$OUT/step_profile.json" 2>&1 \
      | grep -e "tok/s" -e Error
    timeout "$(( $(left) - 5 ))" python3 benchmarks/cold_experts.py --formats int4 --pools 0 --depths 0,2 --batches 1,8 \
      --modes auto,bus,cpu --tokens 48 --out "$OUT/cold.json" 2>&1 | grep -v -e "^  [^ ]" -e "^[^ ]*Warn" | tail -n 14;;
  prefill-ab)
    # the GPU tests, the MoE kernels' sweep with the card's tuned table, then a 512-token prefill kernel by
    # kernel: int4 tiles of joined nibbles (the default) and of two halves (+nojoin), the alignment in
    # parallel chunks (+palign); bf16 for the kernels without dequant
    nvidia-smi --query-gpu=name --format=csv,noheader
    mkdir -p "$OUT/suite"
    OUT="$OUT/suite" PYTHON=python3 timeout -k 10 240 bash benchmarks/gpu_suite.sh tests
    pkill -f "pytest tests/engine/test_gpu" 2>/dev/null
    # the MoE kernels' sweep (prefill tiles of 8 warps and of joined nibbles among them) and the card's table
    OUT="$OUT/kernels" PYTHON=python3 STRATA_COMMIT=$STRATA_COMMIT timeout 200 bash benchmarks/gpu_suite.sh kernels \
      | tail -n 16
    timeout "$(( $(left) - 5 ))" python3 benchmarks/step_profile.py --timed 16 --profiled 2 --prefill 512 \
      --cells "${PROFILE_CELLS:-int4,int4+nojoin,int4+palign,bf16,bf16+palign}" \
      --out "$OUT/prefill_ab.json" 2>&1 | grep -e "tok/s" -e Error -e "prefill_kernel" -e "align";;
  turns)
    # the GPU tests; the CPU kernel in one parallel region against two (15 and 16 threads); the card's
    # memory over engines loaded in turn in one process, as the kit's offload rows are (trained-like
    # model, bf16 then int4, pools 50, 25, 0); then predict_ab's tuned replays at AB_SHARES (default 0)
    nvidia-smi --query-gpu=name --format=csv,noheader
    mkdir -p "$OUT/suite"
    OUT="$OUT/suite" PYTHON=python3 timeout -k 10 240 bash benchmarks/gpu_suite.sh tests
    pkill -f "pytest tests/engine/test_gpu" 2>/dev/null
    timeout 45 python3 benchmarks/cpu_phases.py --threads 15,16 --calls 200 --out "$OUT/cpu_phases.json" 2>&1 | tail -n 4
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 2
    timeout 150 python3 benchmarks/memory_gap.py --hf "$TRAINED" --gen 32 --out "$OUT/memory_turns.json" \
      --sequence bf16:50%,bf16:25%,bf16:0%,int4:50%,int4:25%,int4:0% 2>&1 | grep -e "cache emptied" -e "x 128" -e Error
    [ "$(left)" -gt 60 ] && timeout "$(( $(left) - 5 ))" python3 benchmarks/predict_ab.py --hf "$TRAINED" \
      --formats "${AB_FORMATS:-int4}" --shares "${AB_SHARES:-0}" --out "$OUT/predict_ab.json" 2>&1 \
      | grep -v -e Warn -e "^ *$" | tail -n 20;;
  tuner)
    # the GPU tests; replays that predict or not by measured step time (predict_ab: trained-like routing,
    # int4, pools AB_SHARES, batch 1 and 8; depth 0, tuned depth 2, always-predicting depth 2); then the
    # CPU kernel with its OpenMP workers spinning longer between calls (GOMP_SPINCOUNT) against the default
    nvidia-smi --query-gpu=name --format=csv,noheader
    mkdir -p "$OUT/suite"
    OUT="$OUT/suite" PYTHON=python3 timeout -k 10 220 bash benchmarks/gpu_suite.sh tests
    pkill -f "pytest tests/engine/test_gpu" 2>/dev/null
    [ -d "$TRAINED" ] || python3 benchmarks/trained_like_checkpoint.py "$TRAINED" --layers 12 2>&1 | tail -n 2
    timeout "$(( $(left) - ${SPIN_S:-50} ))" python3 benchmarks/predict_ab.py --hf "$TRAINED" --formats "${AB_FORMATS:-int4}" \
      --shares "${AB_SHARES:-50,25,0}" --out "$OUT/predict_ab.json" 2>&1 | grep -v -e Warn -e "^ *$" | tail -n 30
    for spin in default 20000000; do
      [ "$(left)" -gt 25 ] || break
      if [ $spin = default ]; then env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY timeout 22 python3 benchmarks/cpu_phases.py \
        --threads 15 --calls 60 --out "$OUT/cpu_spin_$spin.json" 2>&1 | tail -n 1
      else GOMP_SPINCOUNT=$spin timeout 22 python3 benchmarks/cpu_phases.py --threads 15 --calls 60 \
        --out "$OUT/cpu_spin_$spin.json" 2>&1 | tail -n 1; fi
    done;;
  probes)
    # where the GPU memory goes at no pool (the kit measured 3.8 GB peak at int4 where the plan counts
    # 2.4), then the gather kernel's bus rate against the copy engine, then the kit's shape with and
    # without the gather at no pool (depth 2 and 0, batch 1 and 8, cold_experts auto), one process each
    for fmt in int4 bf16; do
      timeout 150 python3 benchmarks/memory_profile.py --format $fmt --pool 0 --out "$OUT/memory_$fmt.json" 2>&1 \
        | tail -n 22
    done
    python3 benchmarks/kernels/bench_host_copy.py --out "$OUT/host_copy.json" 2>&1 | tail -n 30
    for fmt in bf16 int4; do
      timeout "$(( $(left) / 2 ))" python3 benchmarks/cold_experts.py --formats $fmt --pools 0 --depths 2,0 \
        --batches 1,8 --modes auto --gather on,off --tokens 64 --out "$OUT/gather_ab_$fmt.json" 2>&1 | grep -v "^ "
    done;;
  no-pool)
    nvidia-smi --query-gpu=name --format=csv,noheader
    mkdir -p "$OUT/suite"
    OUT="$OUT/suite" PYTHON=python3 timeout -k 10 260 bash benchmarks/gpu_suite.sh tests
    timeout 90 python3 benchmarks/step_profile.py --cells int4/bf16,int4/bf16+nopdl,int4/fp8 --out "$OUT/step_profile.json" 2>&1 \
      | grep -e "tok/s" -e Error
    timeout 60 python3 benchmarks/cpu_phases.py --threads 1,8,16 --out "$OUT/cpu_phases.json" 2>&1 | tail -n 3
    timeout 60 python3 benchmarks/kernels/bench_host_copy.py --out "$OUT/host_copy.json" 2>&1 | tail -n 12
    timeout "$(( $(left) - 100 ))" python3 benchmarks/cold_experts.py --formats int4 --pools 0 --depths 0,2 \
      --batches 1,8 --modes bus,auto --gather on,all --tokens 32 --out "$OUT/gather_all.json" 2>&1 | grep -v "^ "
    timeout "$(( $(left) - 5 ))" python3 benchmarks/offload_trace.py --formats int4 --depths 0 --modes bus \
      --reads auto,copy --out "$OUT/no_pool_reads.json" 2>&1 | grep -v -e USDT -e Warn | tail -n 3;;
  *)
    echo "usage: h200_session.sh tests-and-kit | tests-ab-kit | ab-kit | finish | gemv-on | gemv-order |" \
      "validate | checks | turns | prefill-ab | tests-profile-kit | tests-table-kit | after-kit | kit |" \
      "kit-then-gpt-oss | gpt-oss | probes | no-pool | pages | prefill-py | share-ab | memory | cold-ab | table" >&2
    exit 2;;
esac
