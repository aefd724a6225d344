#!/usr/bin/env bash
# Sourced by scripts/gpu-check.sh, which defines the settings and helpers these use (BUILD_DIR,
# OUTDIR, limit, require_build, ...). The stages that check: info, tests, checked, planted, sanitizer.
# shellcheck shell=bash

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

# The suites a ctest log reports skipped: with a GPU each must have run, except the suite of a
# step whose compute capability range leaves this GPU out (skipped with its reason, neither
# passed nor failed). Prints a line per skip; returns 0 (none), kPassedWithSkips (all of that
# kind) or 1.
judge_skips() {
  local log=$1 name reason with_reason=0 without_reason=0
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
  done < <(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) .*\*\*\*Skipped.*/\1/p' "$log")
  [ "$without_reason" -eq 0 ] || return 1
  [ "$with_reason" -eq 0 ] || return "$kPassedWithSkips"
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
    local not_run=0 skips=0
    grep -qE 'No tests were found|Not Run' "$ctest_log" && not_run=1
    judge_skips "$ctest_log" || skips=$?
    rm -f "$ctest_log"
    [ "$rc" -eq 0 ] || { echo "ctest failed (exit $rc)"; return 1; }
    if [ "$not_run" -eq 1 ] || [ "$skips" -eq 1 ]; then
      echo "FAILED: some GPU tests did not run (not found, or skipped with no GPU); see above"
      return 1
    fi
    return "$skips"
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
  judge_skips "$log"
}

# Every planted bug caught: the build's `planted` tests (tests/planted_bugs.py, registered with
# -DATTN_PLANTED_TESTS=ON), PLANTED_JOBS at once; PLANTED_ONLY (ids, comma-separated) picks some.
stage_planted() {
  require_build || return 1
  grep -q '^ATTN_PLANTED_TESTS:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null ||
    { echo "$BUILD_DIR has no planted tests: configure it with -DATTN_PLANTED_TESTS=ON"; return 1; }
  local rc=0 pick=()
  [ -n "$PLANTED_ONLY" ] && pick=(-R "^planted\.(${PLANTED_ONLY//,/|}|report)\$")
  rm -rf "$BUILD_DIR/planted/rows" "$BUILD_DIR/planted/logs"
  timeout "$(limit 900)" ctest --test-dir "$BUILD_DIR" -L planted "${pick[@]}" --parallel "$PLANTED_JOBS" \
    > "$OUTDIR/planted_ctest.log" 2>&1 || rc=$?
  cp "$BUILD_DIR/planted/planted.csv" "$BUILD_DIR/planted/planted.txt" "$OUTDIR/" 2>/dev/null || true
  mkdir -p "$OUTDIR/planted_logs"
  cp "$BUILD_DIR"/planted/logs/*.log "$OUTDIR/planted_logs/" 2>/dev/null || true
  cat "$OUTDIR/planted.txt" 2>/dev/null || echo "no planted.txt (ctest exit $rc; $OUTDIR/planted_ctest.log)"
  grep -qE 'No tests were found' "$OUTDIR/planted_ctest.log" && { echo "no planted test ran"; return 1; }
  if grep -qE '\(Skipped\)|Not Run' "$OUTDIR/planted_ctest.log"; then
    echo "FAILED: planted copies skipped (no GPU they run on)"; return 1
  fi
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
