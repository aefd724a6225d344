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
#   planted    scripts/plant_bugs.py --run-only on the copies built in PLANTED_DIR: every planted
#              bug is caught by the normal suite or the checked build    -> planted.csv, planted.txt
#   sanitizer  ctest -L sanitizer (a build configured with -DATTN_SANITIZER_TESTS=ON):
#              memcheck + racecheck on every stepN at tail shapes (D = 32, 64, 80, 96, 128), in
#              bf16, with 130 keys for 65 queries, the key-padding and causal masks, each skipped
#              with the step's refusal where it does not serve it (tests/sanitize.sh)
#                                                                        -> sanitizer.log, sanitizer/
#   bench      N = 197,577,1025 (all steps, baselines), then N = 2049..16385 for the steps
#              with no N limit (v0 excluded)                             -> bench_vit.csv, bench_long.csv
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
#              (tests/python/test_torch_op.py, test_torch_bridge.py --gpu), then
#              scripts/torch_op_bench.py with TORCH_OP_ARGS: host time per call beside SDPA, a
#              CUDA graph, graph breaks, vit_b_16 images/s eager and compiled
#                                              -> torch_op.csv, torch_op_build.log, torch_op_tests.log
#   backward   steps 9 and 10 (the backward; 10 on Hopper) beside SDPA's FlashAttention-2 and cuDNN
#              backward at the five backward shapes, one process each for fp16 and bf16
#              (scripts/compare_backward.py)  -> backward.csv, backward_bf16.csv
#   training   a small ViT trained on the digits with the steps and stock, and vit_b_16 training
#              steps (scripts/train_digits.py)     -> training_digits.csv/.txt, training_vit_b_16.csv
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
#   PLANTED_DIR          where scripts/plant_bugs.py --build-only wrote its binaries (default:
#                        stage/planted)
#   PLANTED_ONLY         the planted bugs to run, as plant_bugs.py --only takes them (default: all)
#   PLANTED_JOBS         planted copies' suites run at once (default 4)
#   LSE_STEPS            the steps the lse stage times (default: v6,v7,v8, those that write L)
#   LSE_WINDOWS          its alternating windows (default 2)
#   STAGES               default: info tests checked planted sanitizer bench lse profile pytorch torch backward training models vit
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
PLANTED_DIR=${PLANTED_DIR:-stage/planted}
PLANTED_ONLY=${PLANTED_ONLY:-}
PLANTED_JOBS=${PLANTED_JOBS:-4}
LSE_STEPS=${LSE_STEPS:-v6,v7,v8}
LSE_WINDOWS=${LSE_WINDOWS:-2}
PYTHON=${PYTHON:-python3}
SANITIZER_JOBS=${SANITIZER_JOBS:-4}
LONG_SHAPE_BUDGET_S=${LONG_SHAPE_BUDGET_S:-25}
TEST_JOBS=${TEST_JOBS:-4}
TIME_LIMIT_S=${TIME_LIMIT_S:-540}

all_stages=(info tests checked planted sanitizer bench lse profile pytorch torch backward training models vit)
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

# ---- stages ----------------------------------------------------------------------------------

stage_info() {
  local tool
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname 2>/dev/null || echo unknown)"
  echo "repository: $repo_root"
  echo "git_commit: $(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo 'unknown (no git here)')"
  echo "git_changed_files: $(git -C "$repo_root" status --porcelain 2>/dev/null | wc -l)"
  echo "build_dir: $BUILD_DIR"
  if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
    grep -E '^(CMAKE_BUILD_TYPE|CMAKE_CUDA_ARCHITECTURES|CMAKE_CUDA_COMPILER):' "$BUILD_DIR/CMakeCache.txt" |
      sed 's/^/build: /'
  fi
  echo
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "## nvidia-smi -L"
    nvidia-smi -L || true
    echo "## nvidia-smi --query-gpu"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
               --format=csv || true
  else
    echo "nvidia-smi: not found"
  fi
  echo
  if command -v nvcc >/dev/null 2>&1; then echo "## nvcc --version"; nvcc --version; else echo "nvcc: not found (not needed: the binaries are prebuilt)"; fi
  for tool in compute-sanitizer ncu; do
    local var=COMPUTE_SANITIZER path
    [ "$tool" = ncu ] && var=NCU
    if path=$(find_tool "$tool" "${!var:-}"); then
      echo "$tool: $path: $("$path" --version 2>&1 | tail -n 1)"
    else
      echo "$tool: not found"
    fi
  done
  if command -v ctest >/dev/null 2>&1; then echo "ctest: $(ctest --version | sed -n 1p)"; else echo "ctest: not found"; fi
  echo "python: $("$PYTHON" --version 2>&1 || echo 'not found')"
  echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "cuda_available", torch.cuda.is_available())' 2>/dev/null || echo 'not importable')"
  echo
  if [ -x "$BUILD_DIR/bench" ]; then
    echo "## bench --list"
    bench_list || true
  else
    echo "bench: not found in $BUILD_DIR"
  fi
}

stage_tests() {
  require_build gpu_tests || return 1
  local ctest_log
  ctest_log=$(mktemp)
  # ctest runs the paths CMake wrote into the build folder; when the folder was carried to
  # another path (or there is no ctest here), run the same commands directly.
  local recorded=""
  [ -f "$BUILD_DIR/CTestTestfile.cmake" ] &&
    recorded=$(sed -n 's/^# Build directory: //p' "$BUILD_DIR/CTestTestfile.cmake")
  if command -v ctest >/dev/null 2>&1 && [ "$recorded" = "$BUILD_DIR" ]; then
    local junit=() ctest_help
    ctest_help=$(ctest --help 2>/dev/null || true)
    [[ "$ctest_help" == *--output-junit* ]] && junit=(--output-junit "$OUTDIR/tests_junit.xml")
    local rc=0
    # Several suites at once: they check correctness, nothing here is timed.
    timeout "$(limit 900)" ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure --timeout 600 \
      --parallel "$TEST_JOBS" "${junit[@]}" 2>&1 | tee "$ctest_log" || rc=$?
    local not_run=0 name reason with_reason=0 without_reason=0
    grep -qE 'No tests were found|Not Run' "$ctest_log" && not_run=1
    # With a GPU every GPU test must run, except the suite of a step whose compute capability
    # range leaves this GPU out: that one is skipped with its reason, neither passed nor failed.
    while read -r name; do
      reason=""
      [[ "$name" =~ ^(capi\.)?gpu\.(v[0-9]+)$ ]] && reason=$(suite_skip_reason "${BASH_REMATCH[2]}")
      if is_capability_skip "$reason"; then
        echo "skipped: $name: ${reason#SKIPPED: }"
        with_reason=$((with_reason + 1))
      else
        echo "FAILED: $name was skipped${reason:+ (${reason#SKIPPED: })}; with a GPU it must run"
        without_reason=$((without_reason + 1))
      fi
    done < <(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) .*\*\*\*Skipped.*/\1/p' "$ctest_log")
    rm -f "$ctest_log"
    [ "$rc" -eq 0 ] || { echo "ctest failed (exit $rc)"; return 1; }
    if [ "$not_run" -eq 1 ] || [ "$without_reason" -gt 0 ]; then
      echo "FAILED: some GPU tests did not run (not found, or skipped with no GPU); see above"
      return 1
    fi
    [ "$with_reason" -eq 0 ] || return "$kPassedWithSkips"
    return 0
  fi
  if command -v ctest >/dev/null 2>&1; then
    echo "note: the build folder was made at '${recorded:-?}', not '$BUILD_DIR': running gpu_tests directly"
  else
    echo "note: no ctest here: running gpu_tests directly (no JUnit file)"
  fi
  local binary id rc reason failed=0 skipped=0 count=0
  while read -r binary; do
    id=v${binary##*/step}
    count=$((count + 1))
    rc=0
    timeout "$(limit 600)" "$BUILD_DIR/gpu_tests" "--step=$id" > "$OUTDIR/tests_$id.log" 2>&1 || rc=$?
    reason=$(grep -m 1 '^SKIPPED: ' "$OUTDIR/tests_$id.log" || true)
    case $rc in
      0) echo "gpu.$id passed" ;;
      77)
        if is_capability_skip "$reason"; then
          echo "skipped: gpu.$id: ${reason#SKIPPED: }"; skipped=1
        else
          echo "gpu.$id FAILED: skipped with a GPU present: ${reason:-$(tail -n 1 "$OUTDIR/tests_$id.log")}"; failed=1
        fi ;;
      *) echo "gpu.$id FAILED (exit $rc); last lines of tests_$id.log:"; tail -n 20 "$OUTDIR/tests_$id.log"; failed=1 ;;
    esac
  done < <(step_binaries)
  [ "$count" -gt 0 ] || { echo "no step executables in $BUILD_DIR"; return 1; }
  [ "$failed" -eq 0 ] || return 1
  [ "$skipped" -eq 0 ] || return "$kPassedWithSkips"
  return 0
}

stage_checked() {
  [ -x "$CHECKED_BUILD_DIR/gpu_tests" ] ||
    { echo "no $CHECKED_BUILD_DIR/gpu_tests: cmake -B $CHECKED_BUILD_DIR -DATTN_CHECKED_PIPELINE=ON && cmake --build $CHECKED_BUILD_DIR --target gpu_tests"; return 1; }
  grep -q '^ATTN_CHECKED_PIPELINE:BOOL=ON' "$CHECKED_BUILD_DIR/CMakeCache.txt" 2>/dev/null ||
    { echo "$CHECKED_BUILD_DIR is not configured with -DATTN_CHECKED_PIPELINE=ON"; return 1; }
  # The suites labelled checked (the sm_90a steps'), or those of CHECKED_STEPS.
  local select=(-L checked) rc=0 log="$OUTDIR/checked_ctest.log"
  [ -n "$CHECKED_STEPS" ] && select+=(-R "^gpu\.($(tr ' ' '|' <<< "$CHECKED_STEPS"))\$")
  timeout "$(limit 900)" ctest --test-dir "$CHECKED_BUILD_DIR" "${select[@]}" --output-on-failure \
    --timeout 600 > "$log" 2>&1 || rc=$?
  grep -E 'Test +#|tests passed|pipeline rule' "$log" || true
  grep -qE 'No tests were found|Not Run' "$log" && { echo "checked build: no suite ran ($log)"; return 1; }
  [ "$rc" -eq 0 ] || { echo "checked build: FAILED (ctest exit $rc; $log)"; return 1; }
  # A suite skipped on a GPU outside the step's range (not a Hopper GPU) passes with a skip.
  if grep -q '\*\*\*Skipped' "$log"; then
    local name reason failed=0
    while read -r name; do
      reason=$(suite_skip_reason "${name#gpu.}")
      if is_capability_skip "$reason"; then echo "skipped: checked $name: ${reason#SKIPPED: }"
      else echo "checked build: $name FAILED: skipped${reason:+ ($reason)}; on a GPU of its range it must run"; failed=1; fi
    done < <(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) .*\*\*\*Skipped.*/\1/p' "$log")
    [ "$failed" -eq 0 ] || return 1
    return "$kPassedWithSkips"
  fi
}

stage_planted() {
  [ -x "$PLANTED_DIR/gpu_tests_planted" ] ||
    { echo "no $PLANTED_DIR/gpu_tests_planted: run scripts/plant_bugs.py --build-only --out $PLANTED_DIR first"; return 1; }
  local rc=0
  local only=()
  [ -n "$PLANTED_ONLY" ] && only=(--only "$PLANTED_ONLY")
  timeout "$(limit 420)" "$PYTHON" scripts/plant_bugs.py --run-only --out "$PLANTED_DIR" \
    --jobs "$PLANTED_JOBS" "${only[@]}" || rc=$?
  cp "$PLANTED_DIR/planted.csv" "$PLANTED_DIR/planted.txt" "$OUTDIR/" 2>/dev/null || true
  mkdir -p "$OUTDIR/planted_logs"
  cp "$PLANTED_DIR"/logs/*.log "$OUTDIR/planted_logs/" 2>/dev/null || true
  return "$rc"
}

# compute-sanitizer's memcheck and racecheck on every step: the build's `sanitizer` tests
# (tests/sanitize.sh, registered with -DATTN_SANITIZER_TESTS=ON), SANITIZER_JOBS at once. Each
# writes its log under sanitizer/ and one line "step tool shape result" into the results table.
stage_sanitizer() {
  require_build || return 1
  grep -q '^ATTN_SANITIZER_TESTS:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null ||
    { echo "$BUILD_DIR has no sanitizer tests: configure it with -DATTN_SANITIZER_TESTS=ON"; return 1; }
  local sanitizer
  sanitizer=$(find_tool compute-sanitizer "${COMPUTE_SANITIZER:-}") ||
    { echo "compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)"; return 1; }
  mkdir -p "$OUTDIR/sanitizer"
  local results="$OUTDIR/sanitizer/results.txt" rc=0
  : > "$results"
  COMPUTE_SANITIZER="$sanitizer" ATTN_SANITIZER_LOGS="$OUTDIR/sanitizer" ATTN_SANITIZER_RESULTS="$results" \
    SANITIZER_TIMEOUT_S="$(limit 600)" timeout "$(limit 1800)" \
    ctest --test-dir "$BUILD_DIR" -L sanitizer --parallel "$SANITIZER_JOBS" --timeout "$(limit 900)" \
    > "$OUTDIR/sanitizer/ctest.log" 2>&1 || rc=$?
  [ -s "$results" ] || { echo "no sanitizer test ran (ctest exit $rc; $OUTDIR/sanitizer/ctest.log)"; return 1; }
  printf '%-8s %-10s %-22s %s\n' step tool shape result
  sort -V "$results"
  echo "(logs: $OUTDIR/sanitizer/<step>_<tool>_<shape>.log; ctest's: sanitizer/ctest.log)"
  # No GPU, or no sanitizer, skips every test: with a GPU every run must check something.
  if grep -q 'SKIPPED: no' "$results"; then echo "FAILED: sanitizer runs skipped with no GPU or no sanitizer"; return 1; fi
  [ "$rc" -eq 0 ] && ! grep -q 'FAILED' "$results"
}

stage_bench() {
  require_build bench || return 1
  local rc=0 failed=0
  echo "## bench over the ViT shapes, every step and baseline"
  timeout "$(limit 600)" "$BUILD_DIR/bench" --tokens 197,577,1025 --csv "$OUTDIR/bench_vit.csv" || rc=$?
  case $rc in
    0) ;;
    1) echo "bench: a result check FAILED (see the table above)"; failed=1 ;;
    124) echo "bench: timed out; the CSV holds the rows written so far"; failed=1 ;;
    *) echo "bench failed (exit $rc)"; return 1 ;;
  esac

  echo
  echo "## long sweep: N = 2049, 4097, 8193, 16385 for the steps with no N limit, v0 excluded"
  bench_list > "$OUTDIR/bench_list.txt" || { echo "bench --list failed"; return 1; }
  local plan="$OUTDIR/bench_long_plan.txt"
  "$PYTHON" scripts/plan_long_sweep.py --list "$OUTDIR/bench_list.txt" \
    --bench-csv "$OUTDIR/bench_vit.csv" --tokens 2049,4097,8193,16385 --exclude v0 \
    --budget-seconds "$LONG_SHAPE_BUDGET_S" --skipped-rows "$OUTDIR/bench_long_skipped.csv" > "$plan" ||
    { echo "planning the long sweep failed"; return 1; }
  grep '^#' "$plan" || true
  local long_csv="$OUTDIR/bench_long.csv" part=0 tokens steps part_csv
  : > "$long_csv"
  while IFS=$'\t' read -r tokens steps; do
    [[ -z "$tokens" || "$tokens" == \#* ]] && continue
    part=$((part + 1))
    part_csv="$OUTDIR/bench_long_part$part.csv"
    echo "bench --steps $steps --tokens $tokens --warmup 3"
    rc=0
    # Three warm-ups: at these sizes one run takes milliseconds to seconds.
    timeout "$(limit 420)" "$BUILD_DIR/bench" --steps "$steps" --tokens "$tokens" --warmup 3 --csv "$part_csv" || rc=$?
    case $rc in
      0) ;;
      1) echo "bench: a result check FAILED in the long sweep"; failed=1 ;;
      124) echo "bench: the long sweep timed out; its CSV holds the rows written so far"; failed=1 ;;
      *) echo "bench failed in the long sweep (exit $rc)"; failed=1 ;;
    esac
    if [ -s "$part_csv" ]; then
      if [ -s "$long_csv" ]; then tail -n +2 "$part_csv" >> "$long_csv"; else cat "$part_csv" > "$long_csv"; fi
      rm -f "$part_csv"
    fi
  done < "$plan"
  if [ -s "$OUTDIR/bench_long_skipped.csv" ]; then
    [ -s "$long_csv" ] || head -n 1 "$OUTDIR/bench_vit.csv" > "$long_csv"
    cat "$OUTDIR/bench_long_skipped.csv" >> "$long_csv"
  fi
  rm -f "$OUTDIR/bench_long_skipped.csv"
  [ -s "$long_csv" ] || { rm -f "$long_csv"; echo "long sweep: no step qualifies"; }
  return "$failed"
}

# The cost of writing L: each window times LSE_STEPS without L, then with it, in two bench
# processes, so that drift of the GPU's clocks shows as a spread across windows, not as a ratio.
stage_lse() {
  require_build bench || return 1
  local csv="$OUTDIR/lse.csv" part="$OUTDIR/lse_part.csv" window mode rc failed=0
  echo "## $LSE_STEPS at N = 197,577,1025, D = 64,128: without L, then with it; $LSE_WINDOWS windows"
  : > "$csv"
  for window in $(seq 1 "$LSE_WINDOWS"); do
    for mode in plain lse; do
      local flags=()
      [ "$mode" = lse ] && flags=(--log-sum-exp)
      rc=0
      timeout "$(limit 240)" "$BUILD_DIR/bench" --steps "$LSE_STEPS" --tokens 197,577,1025 \
        --head-dim 64,128 "${flags[@]}" --csv "$part" || rc=$?
      case $rc in
        0) ;;
        1) echo "bench: a result check FAILED (window $window, $mode)"; failed=1 ;;
        *) echo "bench failed (exit $rc, window $window, $mode)"; rm -f "$part"; return 1 ;;
      esac
      [ -s "$csv" ] || echo "$(head -n 1 "$part"),window" > "$csv"
      tail -n +2 "$part" | sed "s/\$/,$window/" >> "$csv"
      rm -f "$part"
    done
  done
  return "$failed"
}

stage_profile() {
  require_build || return 1
  local ncu
  ncu=$(find_tool ncu "${NCU:-}") || { echo "ncu not found (set NCU=/path/to/ncu)"; return 1; }
  timeout "$(limit 900)" "$PYTHON" scripts/ncu_profile.py --build-dir "$BUILD_DIR" --out "$OUTDIR" --ncu "$ncu" --tokens 577
}

stage_pytorch() {
  if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "skipped: torch does not import with $PYTHON"
    return "$kSkipped"
  fi
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "skipped: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') sees no CUDA device"
    return "$kSkipped"
  fi
  # The flash steps run beside PyTorch in the same process through the build's library, each
  # implementation timed in interleaved windows: the ratios of the README and chapter 10.
  local steps="" id part rc=0
  for id in v6 v7 v8; do [ -x "$BUILD_DIR/step${id#v}" ] && steps+=",$id"; done
  [ -f "$BUILD_DIR/libattention_steps.so" ] || steps=""
  local parts=(
    "--tokens 197,577,1025 --steps all$steps"
    "--tokens 4097 --batch 8 --heads 12 --head-dim 64 --steps sdpa_flash,sdpa_cudnn$steps"
    "--tokens 4097 --batch 8 --heads 16 --head-dim 128 --steps sdpa_flash,sdpa_cudnn$steps"
    "--tokens 257 --batch 32 --heads 16 --head-dim 80 --steps sdpa_flash,sdpa_cudnn$steps"
    "--tokens 1050 --batch 1 --heads 8 --head-dim 32 --steps sdpa_flash,sdpa_cudnn$steps"
  )
  : > "$OUTDIR/pytorch.csv"
  for part in "${parts[@]}"; do
    echo "## compare_pytorch.py $part"
    # shellcheck disable=SC2086  # $part is a list of flags
    ATTENTION_STEPS_LIBRARY="$BUILD_DIR/libattention_steps.so" timeout "$(limit 300)" \
      "$PYTHON" scripts/compare_pytorch.py $part --windows 5 --csv "$OUTDIR/pytorch_part.csv" \
      --info "$OUTDIR/pytorch_info.txt" || rc=$?
    if [ -s "$OUTDIR/pytorch_part.csv" ]; then
      if [ -s "$OUTDIR/pytorch.csv" ]; then tail -n +2 "$OUTDIR/pytorch_part.csv" >> "$OUTDIR/pytorch.csv"
      else cat "$OUTDIR/pytorch_part.csv" > "$OUTDIR/pytorch.csv"; fi
    fi
    rm -f "$OUTDIR/pytorch_part.csv"
  done
  return "$rc"
}

# The stages that use the PyTorch operator: torch and CUDA present, and the operator installed
# (once a run, by the first of them) into $site, a folder of this run that the end removes.
site="$OUTDIR/torch-site"
trap 'rm -rf "$site"' EXIT
with_operator() {
  if ! "$PYTHON" -c 'import torch, torchvision' 2>/dev/null; then
    echo "skipped: torch and torchvision do not import with $PYTHON"
    return "$kSkipped"
  fi
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "skipped: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') sees no CUDA device"
    return "$kSkipped"
  fi
  [ -f "$BUILD_DIR/libattention_steps.so" ] || { echo "no $BUILD_DIR/libattention_steps.so (build the attention_steps target)"; return 1; }
  [ -d "$site/attention_steps" ] && return 0
  rm -rf python/build python/*.egg-info  # a clean build: its time is the one to report
  echo "## pip install --no-build-isolation ./python (into $site)"
  local started=$(date +%s)
  ATTENTION_STEPS_BUILD_DIR="$BUILD_DIR" timeout "$(limit 300)" "$PYTHON" -m pip install \
    --no-build-isolation --no-deps --target "$site" ./python > "$OUTDIR/torch_op_build.log" 2>&1 ||
    { tail -n 30 "$OUTDIR/torch_op_build.log"; echo "the operator did not build"; rm -rf "$site"; return 1; }
  echo "built and installed in $(( $(date +%s) - started )) s"
  cp "$site"/attention_steps/_operator*.so python/attention_steps/  # for the vit stage (git ignores it)
  rm -rf python/build python/*.egg-info
  echo
}

stage_torch() {
  with_operator || return $?
  echo "## the operator's tests (tests/python/test_torch_op.py, test_torch_bridge.py --gpu)"
  local rc=0
  for test in test_torch_op.py "test_torch_bridge.py --gpu"; do
    # shellcheck disable=SC2086  # the test's arguments
    PYTHONPATH="$site" timeout "$(limit 240)" "$PYTHON" -X faulthandler tests/python/$test \
      >> "$OUTDIR/torch_op_tests.log" 2>&1 || { echo "$test FAILED"; rc=1; }
  done
  grep -E "^(Ran|OK|FAILED)|(ERROR|FAIL):" "$OUTDIR/torch_op_tests.log" || true
  echo
  echo "## scripts/torch_op_bench.py"
  local extra=()
  [ -n "${TORCH_OP_ARGS:-}" ] && read -r -a extra <<< "$TORCH_OP_ARGS"
  local left=$(( deadline - $(date +%s) - 15 ))
  PYTHONPATH="$site" timeout "$(limit 600)" "$PYTHON" scripts/torch_op_bench.py \
    --csv "$OUTDIR/torch_op.csv" --budget-s "$(( left > 60 ? left - 60 : 0 ))" "${extra[@]}" || rc=1
  return "$rc"
}

stage_backward() {
  with_operator || return $?
  echo "## scripts/compare_backward.py: v9 and v10 beside SDPA's FlashAttention-2 and cuDNN backward"
  PYTHONPATH="$site" timeout "$(limit 300)" "$PYTHON" scripts/compare_backward.py \
    --csv "$OUTDIR/backward.csv" || return 1
  echo "## the same in bf16"
  PYTHONPATH="$site" timeout "$(limit 300)" "$PYTHON" scripts/compare_backward.py \
    --dtype bf16 --csv "$OUTDIR/backward_bf16.csv"
}

stage_training() {
  with_operator || return $?
  echo "## scripts/train_digits.py: a small ViT on the digits, stock and with the steps; vit_b_16 training steps"
  local extra=()
  [ -n "${TRAINING_ARGS:-}" ] && read -r -a extra <<< "$TRAINING_ARGS"
  PYTHONPATH="$site" timeout "$(limit 400)" "$PYTHON" scripts/train_digits.py --out-dir "$OUTDIR" \
    "${extra[@]}"
}

stage_models() {
  with_operator || return $?
  echo "## scripts/models_end_to_end.py: ViT-H/14, SETR-Naive, DETR-R50 with step 8 against stock"
  local left=$(( deadline - $(date +%s) - 30 ))
  local budget=${MODELS_DEADLINE_S:-420}
  (( left < budget )) && budget=$left
  PYTHONPATH="$site" timeout "$(limit 480)" "$PYTHON" scripts/models_end_to_end.py --compiled \
    --deadline-s "$budget" --csv "$OUTDIR/models_end_to_end.csv"
}

stage_vit() {
  with_operator || return $?  # the bridge's tests and the script use the checkout's package
  local library="$BUILD_DIR/libattention_steps.so"
  [ -f "$library" ] || { echo "no $library (build the attention_steps target)"; return 1; }
  local left=$(( deadline - $(date +%s) ))
  if (( left < 90 )); then
    echo "skipped: ${left} s of TIME_LIMIT_S=$TIME_LIMIT_S left; the end-to-end run takes about 4 minutes (STAGES=vit runs it alone)"
    return "$kSkipped"
  fi
  echo "## the PyTorch bridge on this GPU: every step against SDPA, a side stream, a refusal"
  PYTHONPATH="$repo_root/python" ATTENTION_STEPS_LIBRARY="$library" timeout "$(limit 120)" \
    "$PYTHON" tests/python/test_torch_bridge.py --gpu 2>&1 | tail -n 25 ||
    { echo "the PyTorch bridge's GPU tests FAILED"; return 1; }
  echo
  echo "## whole ViTs (scripts/vit_end_to_end.py)"
  left=$(( deadline - $(date +%s) ))
  # The script skips, with the reason, the rows that would end past its deadline, and still
  # writes its CSVs; the deadline leaves it time to do so within this run's limit.
  local script_deadline=$(( left - 20 ))
  (( script_deadline > 225 )) && script_deadline=225
  local extra=()
  [ -n "${VIT_ARGS:-}" ] && read -r -a extra <<< "$VIT_ARGS"
  ATTENTION_STEPS_LIBRARY="$library" timeout "$(limit 330)" "$PYTHON" scripts/vit_end_to_end.py \
    --out-dir "$OUTDIR" --deadline-s "$script_deadline" "${extra[@]}"
}

# ---- driver ----------------------------------------------------------------------------------

declare -A stage_file=(
  [info]=info.txt [tests]=tests.log [checked]=checked.log [planted]=planted.log
  [sanitizer]=sanitizer.log [bench]=bench.log [lse]=lse.log
  [profile]=profile.log [pytorch]=pytorch.log [torch]=torch.log [backward]=backward.log
  [training]=training.log [models]=models.log [vit]=vit.log)
declare -A stage_results=(
  [info]="" [tests]=tests_junit.xml [checked]="" [planted]="planted.csv planted.txt"
  [sanitizer]=sanitizer/ [bench]="bench_vit.csv bench_long.csv" [lse]=lse.csv
  [profile]="profile.csv profile/" [pytorch]="pytorch.csv pytorch_info.txt"
  [torch]="torch_op.csv torch_op_tests.log torch_op_build.log" [backward]="backward.csv backward_bf16.csv"
  [training]="training_digits.csv training_digits.txt training_vit_b_16.csv"
  [models]=models_end_to_end.csv
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
