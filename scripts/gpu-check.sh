#!/usr/bin/env bash
# One command for a GPU machine: the GPU test suite, compute-sanitizer on every step, the
# benchmark sweeps, the ncu profiles and the PyTorch comparison. Every log and CSV goes under
# OUTDIR; a summary table closes the run. Run it from the repository root, with a build folder
# made elsewhere: the binaries travel prebuilt, so no cmake or compiler is needed here.
#
#   scripts/gpu-check.sh OUTDIR
#
# Stages, in this order (STAGES picks a subset, comma or space separated):
#   info       GPU, driver, toolkit, torch, the build and the date      -> info.txt
#   tests      ctest -L gpu (JUnit too)                                  -> tests.log, tests_junit.xml
#   checked    ctest -L checked: the GPU suites of the Hopper steps in the checked build of the
#              asynchronous pipeline (CHECKED_BUILD_DIR, configured with -DATTN_CHECKED_PIPELINE=ON):
#              the shipped steps break no protocol rule                  -> checked.log
#   planted    ctest -L planted (a build configured with -DATTN_PLANTED_TESTS=ON): every bug of
#              tests/planted_bugs.py is caught by the normal suite or the checked build
#                                                                        -> planted.csv, planted.txt
#   sanitizer  ctest -L sanitizer (a build configured with -DATTN_SANITIZER_TESTS=ON):
#              memcheck + racecheck on every stepN at tail shapes (D = 32, 64, 80, 96, 128), in
#              bf16, with 130 keys for 65 queries, the key-padding and causal masks, each skipped
#              with the step's refusal where it does not serve it (tests/sanitize.sh)
#                                                                        -> sanitizer.log, sanitizer/
#   bench      N = 197,577,1025 (the forward steps and the eager baseline), then N = 2049..16385
#              for those with no N limit (v0 excluded)                   -> bench_vit.csv, bench_long.csv
#   lse        the forward with and without L, the log-sum-exp a backward pass needs (bench and
#              bench --log-sum-exp, alternating, LSE_WINDOWS times) for LSE_STEPS at N =
#              197,577,1025, D = 64 and 128; a last column numbers the window    -> lse.csv
#   profile    ncu on each step at N = 577 (scripts/ncu_profile.py)          -> profile.csv, profile/
#   pytorch    PyTorch eager and SDPA backends beside steps v6-v8 (scripts/compare_pytorch.py, 5
#              interleaved timing windows each) at N = 197,577,1025, the two long shapes, and the
#              head dims of ViT-H/14 (32, 16, 257, 80) and DETR (1, 8, 1050, 32)
#                                                                         -> pytorch.csv, pytorch_info.txt
#   torch      the PyTorch operator: `pip install --no-build-isolation ./python` into a folder of
#              this run (built against the torch here, linking BUILD_DIR's library; the checkout's
#              package gets the built operator too, for the vit stage), its GPU tests
#              (tests/python/test_torch_op.py, test_torch_bridge.py --gpu, test_backward_masks.py,
#              test_backward_views.py, test_sdpa_masks.py, test_varlen.py, and
#              test_models_training.py where timm
#              or transformers imports), then
#              scripts/torch_op_bench.py with TORCH_OP_ARGS: host time per call beside SDPA, a
#              CUDA graph, graph breaks, vit_b_16 images/s eager and compiled
#                                              -> torch_op.csv, torch_op_build.log, torch_op_tests.log
#   backward   steps 9 and 10 (the backward; 10 on Hopper) beside SDPA's FlashAttention-2 and cuDNN
#              backward at the five backward shapes, one process each for fp16 and bf16
#              (scripts/compare_backward.py)  -> backward.csv, backward_bf16.csv
#   training   a small ViT trained on the digits with the steps and stock, and vit_b_16 training
#              steps (scripts/train_digits.py)     -> training_digits.csv/.txt, training_vit_b_16.csv
#   distributed  sequence-parallel attention (attention_steps.sequence_parallel): partial results
#              merged with L and ring and all-to-all attention on one GPU, and on 2 and 4 GPUs where
#              the machine has them, against the whole call (tests/python/test_sequence_parallel.py;
#              passed with skips, saying so, on fewer than 4 GPUs)   -> sequence_parallel_tests.log
#   models     ViT-H/14, SETR-Naive and DETR-R50 (3, 6, 12 encoder layers) with step 8 in every
#              nn.MultiheadAttention against stock, eager and compiled with CUDA graphs, at batch
#              1 and 32, with attention's share of each forward's GPU time; helper processes fill
#              the compile caches first (scripts/models_end_to_end.py, at most MODELS_DEADLINE_S,
#              default 420 s)                                             -> models_end_to_end.csv
#   vit        the PyTorch bridge's GPU tests (tests/python/test_torch_bridge.py --gpu), then
#              whole torchvision ViTs with each step swapped in, through libattention_steps.so
#              (scripts/vit_end_to_end.py), when torch and torchvision import; about 4 minutes,
#              skipped with the reason when less than 90 s of TIME_LIMIT_S is left
#                                  -> vit_end_to_end.csv, vit_end_to_end_kernels.csv, vit_end_to_end_info.txt
# Environment:
#   BUILD_DIR            the build folder (default: build)
#   CHECKED_BUILD_DIR    the checked build's folder, gpu_tests built (default: build-checked)
#   CHECKED_STEPS        the steps the checked stage runs (default: every suite labelled checked,
#                        the sm_90a steps')
#   PLANTED_ONLY         the planted bugs to run, comma-separated ids (default: all)
#   PLANTED_JOBS         planted copies run at once by ctest (default 4)
#   LSE_STEPS            the steps the lse stage times (default: the forward steps that write L,
#                        from the library's registrations)
#   LSE_WINDOWS          its alternating windows (default 2)
#   STAGES               default: info tests checked planted sanitizer bench lse profile pytorch torch backward training distributed models vit
#   TORCH_OP_ARGS        more arguments for scripts/torch_op_bench.py (e.g. --sizes 224 --parts host)
#   TRAINING_ARGS        more arguments for scripts/train_digits.py (e.g. --lr 1e-3 --warmup 20)
#   MODELS_DEADLINE_S    the models stage's time for its measurements (default 420): rows past it
#                        are written as not run, with the reason
#   PYTHON               interpreter for profile, pytorch and vit (default: python3)
#   VIT_ARGS             more arguments for scripts/vit_end_to_end.py (e.g. --quick)
#   COMPUTE_SANITIZER    compute-sanitizer to use (default: PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin)
#   NCU                  ncu to use (same search)
#   SANITIZER_JOBS       sanitizer runs at once (default 4)
#   TEST_JOBS            GPU test suites run at once by ctest (default 4)
#   LONG_SHAPE_BUDGET_S  the long sweep runs a (step, N) only when its estimated time is at most
#                        this many seconds (default 25)
#   TIME_LIMIT_S         the whole run's time limit (default 540): every command is cut at it and
#                        a stage that finds no time left fails, so the summary is always printed
# A GPU test suite of a step this GPU cannot run (its compute capability is outside the step's
# range: the Hopper steps on any other GPU, v6 below 8.0) is reported as skipped with the reason,
# and the tests stage as "passed with skips"; a suite skipped for any other reason (no CUDA
# device) fails the stage. The sanitizer reports such a step as n/a with the reason.
# Exit status: 0 when every stage passed or was skipped for a stated reason, 1 when one failed,
# 2 on a usage error.
set -euo pipefail

# --help prints the comment above, up to the first line that is not a comment.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") echo "gpu-check.sh: missing OUTDIR (usage: scripts/gpu-check.sh OUTDIR; see --help)" >&2; exit 2 ;;
  -*) echo "gpu-check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
if [ "$#" -ne 1 ]; then
  echo "gpu-check.sh: expected one argument, OUTDIR; got $# (see --help)" >&2
  exit 2
fi

outdir_argument=$1
repo_root=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo_root"
BUILD_DIR=${BUILD_DIR:-build}
[ -d "$BUILD_DIR" ] && BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
CHECKED_BUILD_DIR=${CHECKED_BUILD_DIR:-build-checked}
[ -d "$CHECKED_BUILD_DIR" ] && CHECKED_BUILD_DIR=$(cd "$CHECKED_BUILD_DIR" && pwd)
CHECKED_STEPS=${CHECKED_STEPS:-}
PLANTED_ONLY=${PLANTED_ONLY:-}
PLANTED_JOBS=${PLANTED_JOBS:-4}
LSE_STEPS=${LSE_STEPS:-}
LSE_WINDOWS=${LSE_WINDOWS:-2}
PYTHON=${PYTHON:-python3}
SANITIZER_JOBS=${SANITIZER_JOBS:-4}
LONG_SHAPE_BUDGET_S=${LONG_SHAPE_BUDGET_S:-25}
TEST_JOBS=${TEST_JOBS:-4}
TIME_LIMIT_S=${TIME_LIMIT_S:-540}

all_stages=(info tests checked planted sanitizer bench lse profile pytorch torch backward training distributed models vit)
IFS=', ' read -r -a stages <<< "${STAGES:-${all_stages[*]}}"  # "a,b" and "a b" both work
for stage in "${stages[@]}"; do
  case " ${all_stages[*]} " in
    *" $stage "*) ;;
    *) echo "gpu-check.sh: STAGES: unknown stage '$stage' (stages: ${all_stages[*]})" >&2; exit 2 ;;
  esac
done
for variable in SANITIZER_JOBS LONG_SHAPE_BUDGET_S TEST_JOBS TIME_LIMIT_S LSE_WINDOWS PLANTED_JOBS; do
  [[ "${!variable}" =~ ^[1-9][0-9]*$ ]] ||
    { echo "gpu-check.sh: $variable must be a positive integer, not '${!variable}'" >&2; exit 2; }
done
deadline=$(( $(date +%s) + TIME_LIMIT_S ))
mkdir -p "$outdir_argument" || { echo "gpu-check.sh: cannot create OUTDIR '$outdir_argument'" >&2; exit 2; }
OUTDIR=$(cd "$outdir_argument" && pwd)

# ---- helpers ---------------------------------------------------------------------------------

# A stage's exit status: 0 passed, 1 failed, kSkipped skipped (its log's last line says why),
# kPassedWithSkips: what ran passed, and the log's "skipped: " lines name what did not and why.
readonly kSkipped=75
readonly kPassedWithSkips=76

# Seconds a command may run: at most $1, and never past the run's deadline. `timeout` stops the
# command's whole process group, so a profiler's or sanitizer's child goes with it.
limit() {
  local left=$(( deadline - $(date +%s) ))
  (( left < 1 )) && left=1
  if (( left < $1 )); then echo "$left"; else echo "$1"; fi
}

# A CUDA tool: the variable's value, else PATH, else the usual toolkit folders.
find_tool() {
  local name=$1 given=$2 dir
  if [ -n "$given" ]; then
    [ -x "$given" ] && { echo "$given"; return 0; }
    return 1
  fi
  command -v "$name" 2>/dev/null && return 0
  for dir in "${CUDA_HOME:-/nonexistent}/bin" /usr/local/cuda/bin /opt/cuda/bin; do
    [ -x "$dir/$name" ] && { echo "$dir/$name"; return 0; }
  done
  return 1
}

# The step executables stepN of the build, in step order (step10 after step9).
step_binaries() {
  local path
  for path in "$BUILD_DIR"/step[0-9]*; do
    if [[ -f "$path" && -x "$path" && "$(basename "$path")" =~ ^step[0-9]+$ ]]; then echo "$path"; fi
  done | sort -V
}

require_build() {
  local name
  [ -d "$BUILD_DIR" ] || { echo "no build folder '$BUILD_DIR' (set BUILD_DIR)"; return 1; }
  for name in "$@"; do
    [ -x "$BUILD_DIR/$name" ] || { echo "no executable $BUILD_DIR/$name (build it first)"; return 1; }
  done
}

# bench --list, one line per registered step and baseline, for this GPU:
# "id<TAB>largest N (a number, any, or none: this GPU cannot run it)<TAB>head dims<TAB>compute
# capability (8.0+, 9.0)<TAB>title". stderr names the GPU whose limits it used.
bench_list() { "$BUILD_DIR/bench" --list; }

# Why the GPU suite of a step would be skipped on this GPU, from the suite's own probe (it runs
# no kernel): "SKIPPED: ..." or nothing.
suite_skip_reason() {
  "$BUILD_DIR/gpu_tests" --step="$1" --list-test-cases 2>&1 | grep -m 1 '^SKIPPED: ' || true
}

# A skip that is a stated reason: the GPU's compute capability is outside the step's range.
is_capability_skip() { [[ "$1" == *"needs a GPU of compute capability"* ]]; }

# ---- stages: scripts/gpu-check/correctness.sh and measurements.sh ---------------------------

# shellcheck source=gpu-check/correctness.sh
source "$repo_root/scripts/gpu-check/correctness.sh"
# shellcheck source=gpu-check/measurements.sh
source "$repo_root/scripts/gpu-check/measurements.sh"

# ---- driver ----------------------------------------------------------------------------------

declare -A stage_file=(
  [info]=info.txt [tests]=tests.log [checked]=checked.log [planted]=planted.log
  [sanitizer]=sanitizer.log [bench]=bench.log [lse]=lse.log
  [profile]=profile.log [pytorch]=pytorch.log [torch]=torch.log [backward]=backward.log
  [training]=training.log [distributed]=distributed.log [models]=models.log [vit]=vit.log)
declare -A stage_results=(
  [info]="" [tests]=tests_junit.xml [checked]="" [planted]="planted.csv planted.txt"
  [sanitizer]=sanitizer/ [bench]="bench_vit.csv bench_long.csv" [lse]=lse.csv
  [profile]="profile.csv profile/" [pytorch]="pytorch.csv pytorch_info.txt"
  [torch]="torch_op.csv torch_op_tests.log torch_op_build.log" [backward]="backward.csv backward_bf16.csv"
  [training]="training_digits.csv training_digits.txt training_vit_b_16.csv"
  [distributed]=sequence_parallel_tests.log [models]=models_end_to_end.csv
  [vit]="vit_end_to_end.csv vit_end_to_end_kernels.csv vit_end_to_end_info.txt")

summary=()
any_failed=0
total_start=$(date +%s)
echo "gpu-check: stages ${stages[*]}; build $BUILD_DIR; output $OUTDIR"
for stage in "${stages[@]}"; do
  log="$OUTDIR/${stage_file[$stage]}"
  start=$(date +%s)
  echo "== $stage ..."
  if (( $(date +%s) >= deadline - 5 )); then
    echo "not run: the run reached TIME_LIMIT_S=$TIME_LIMIT_S" > "$log"
    rc=1
  else
    set +e
    # A subshell per stage: a failing stage is reported and the next one still runs.
    ( set -euo pipefail; "stage_$stage" ) > "$log" 2>&1
    rc=$?
    set -e
  fi
  seconds=$(( $(date +%s) - start ))
  case $rc in
    0) status=passed ;;
    "$kSkipped") status="skipped: $(grep -m 1 '^skipped: ' "$log" | sed 's/^skipped: //')" ;;
    "$kPassedWithSkips") status="passed with skips" ;;
    *) status=FAILED; any_failed=1 ;;
  esac
  echo "== $stage: $status (${seconds} s), log $log"
  if [ "$status" = FAILED ]; then
    echo "---- last lines of ${stage_file[$stage]}:"
    tail -n 25 "$log" | sed 's/^/    /'
  fi
  files=${stage_file[$stage]}
  for file in ${stage_results[$stage]}; do
    [ -e "$OUTDIR/$file" ] && files+="${files:+, }$file"
  done
  summary+=("$(printf '%-10s %-8s %6s  %s' "$stage" "${status%%:*}" "${seconds}s" "$files")")
  [[ "$status" == skipped* ]] && summary+=("$(printf '%-10s %s' "" "${status}")")
  if [ "$rc" -eq "$kPassedWithSkips" ]; then
    while read -r line; do summary+=("$(printf '%-10s %s' "" "$line")"); done < <(grep '^skipped: ' "$log")
  fi
done

echo
echo "gpu-check summary ($(( $(date +%s) - total_start )) s; files under $OUTDIR)"
printf '%-10s %-8s %6s  %s\n' stage status time file
printf '%s\n' "${summary[@]}"
if [ "$any_failed" -ne 0 ]; then
  echo "gpu-check: FAILED (see the logs named above)"
  exit 1
fi
echo "gpu-check: all stages passed. Results for the notebooks: copy bench_vit.csv, bench_long.csv," \
     "profile.csv, pytorch.csv, pytorch_info.txt and vit_end_to_end*.csv/.txt to docs/results/<gpu>/."
