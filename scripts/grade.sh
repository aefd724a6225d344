#!/usr/bin/env bash
# Grades steps with the project's own test suite, the way a course grades a student's kernel.
#
#   scripts/grade.sh [options] [STEP | FILE.cu ...]   STEP: 3 or v3; default: every steps/vN_*/
#
# A FILE.cu is graded as the step its first line names: scripts/make-exercise.sh writes
# "// Exercise: step N, ..." there, so `scripts/grade.sh my_v3.cu` grades that very file.
# A step given without a file is graded from the shipped solution, and the table and the
# report say so (SHIPPED, and a NOTE line).
#
# For each step: configures and builds in its own build folder (only the graded steps, and the
# forward step a backward step runs first: -DATTN_STEPS), runs `ctest -L stepN`, runs
# compute-sanitizer memcheck and racecheck on stepN at a small tail shape, for a Hopper step
# (ARCH 90a in its step.cmake) runs its GPU suite again in the checked build of the
# asynchronous pipeline (a second folder, DIR-checked, configured with
# -DATTN_CHECKED_PIPELINE=ON: a race the sanitizer cannot see fails there with the rule it
# broke), and, when the step is built from a student's file, times it against the shipped
# solution at N = 577 (bench, ratio of medians). Prints a table and writes a JSON report in Gradescope's results.json
# form (docs/grading.md gives its schema). Without a usable GPU the GPU parts are reported as
# skipped and score nothing; so are a step's on a GPU outside its compute capability range (the
# Hopper steps on any other GPU), with that reason.
#
# Options:
#   -DSTEP<N>_SOURCE=FILE  grade FILE as step N. The environment variable STEP<N>_SOURCE does
#                          the same; the option wins. Steps given no source are built from
#                          the shipped solution (a source left in the build folder by an
#                          earlier run is cleared).
#   --build-dir DIR        where to configure and build (default: build-grade/ in the repo)
#   --json FILE            where to write the report (default: DIR/results.json)
#   --no-build             grade DIR (and DIR-checked) as configured and built, sources
#                          included: for a build made on one machine and run on another
#   -h, --help             this text
# Environment: STEP<N>_SOURCE (above); COMPUTE_SANITIZER, the compute-sanitizer to use
# (default: PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin, /opt/cuda/bin); SANITIZER_TIMEOUT_S,
# the limit of one sanitizer run and of the checked build's suite (default 1800).
#
# Exit codes: 0 every part ran and passed; 1 graded, and something failed (a test, the
# sanitizer, a file that does not compile); 2 usage error; 3 could not grade (configure
# failed, a tool is missing); 4 nothing failed, but parts were skipped (no GPU, a GPU the step
# cannot run on, or no compute-sanitizer): not a full pass.
set -euo pipefail

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail_usage() { echo "grade.sh: $1 (try --help)" >&2; exit 2; }
fail_runtime() { echo "grade.sh: $1" >&2; exit 3; }
say() { echo "grade.sh: $*" >&2; }

# The small tail shape of the sanitizer runs (65 = 64 + 1: the last tile is partial for every
# power-of-two tile size); --no-ceilings leaves the step's kernels the only ones that run, so
# the sanitizer checks all of them and nothing else. The speed comparison runs at N = 577.
sanitizer_arguments=(--tokens 65 --batch 2 --heads 3 --iters 1 --warmup 0 --check full --no-ceilings)
sanitizer_timeout_s=${SANITIZER_TIMEOUT_S:-1800}
speed_tokens=577

# Every step the repository has, as CMake finds them: steps/vN_<idea>/.
available_steps=()
for folder in "$repo_root"/steps/v[0-9]*_*/; do
  name="$(basename "$folder")"
  [[ "$name" =~ ^v([0-9]+)_ ]] && available_steps+=("${BASH_REMATCH[1]}")
done
[ "${#available_steps[@]}" -gt 0 ] || fail_runtime "no steps/vN_*/ folders in $repo_root"
mapfile -t available_steps < <(printf '%s\n' "${available_steps[@]}" | sort -n)
is_step() { printf '%s\n' "${available_steps[@]}" | grep -qx "$1"; }
# A Hopper step: its step.cmake says ARCH 90a (sm_90a code: the pipeline of steps/hopper/, which
# has a checked build).
is_hopper_step() { [ "$("$repo_root/scripts/step-facts.sh" "$(dirname "$repo_root"/steps/v"$1"_*/step.cmake)" | head -1)" = 90a ]; }

build_dir="$repo_root/build-grade"
json_path=""
no_build=0
declare -A source_option=()  # step number -> file given with -DSTEP<N>_SOURCE=
steps=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --build-dir) [ "$#" -ge 2 ] || fail_usage "--build-dir: missing value"; build_dir="$2"; shift ;;
    --json) [ "$#" -ge 2 ] || fail_usage "--json: missing value"; json_path="$2"; shift ;;
    --no-build) no_build=1 ;;
    -DSTEP*_SOURCE=*)
      [[ "$1" =~ ^-DSTEP([0-9]+)_SOURCE=(.*)$ ]] || fail_usage "'$1': expected -DSTEP<N>_SOURCE=FILE"
      is_step "${BASH_REMATCH[1]}" || fail_usage "-DSTEP${BASH_REMATCH[1]}_SOURCE: there is no step ${BASH_REMATCH[1]}"
      source_option["${BASH_REMATCH[1]}"]="${BASH_REMATCH[2]}" ;;
    -*) fail_usage "unknown option '$1'" ;;
    *.cu)
      [ -f "$1" ] || fail_usage "no such file '$1'"
      header="$(head -n 1 "$1")"
      [[ "$header" =~ ^//\ Exercise:\ step\ ([0-9]+), ]] ||
        fail_usage "$1: its first line names no step (\"// Exercise: step N, ...\"); name it: -DSTEP<N>_SOURCE=$1 N"
      step="${BASH_REMATCH[1]}"
      is_step "$step" || fail_usage "$1 names step $step; there is no step $step"
      source_option["$step"]="$1"
      steps+=("$step") ;;
    *)
      step="${1#v}"
      [[ "$step" =~ ^[0-9]+$ ]] || fail_usage "'$1' is not a step number"
      is_step "$step" || fail_usage "no step $step (steps: ${available_steps[*]})"
      steps+=("$step") ;;
  esac
  shift
done
[ "${#steps[@]}" -gt 0 ] || steps=("${available_steps[@]}")
mapfile -t steps < <(printf '%s\n' "${steps[@]}" | awk '!seen[$0]++')  # "7 v7 7" grades step 7 once
command -v python3 >/dev/null || fail_runtime "python3 not found; it writes the report (scripts/setup.sh installs it)"
command -v ctest >/dev/null || fail_runtime "ctest not found; install CMake (scripts/setup.sh)"

# The source each step is built from: read back from the build folder, or given here. Every
# input is checked before anything is written.
declare -A step_source=()
if [ "$no_build" = 1 ]; then
  [ "${#source_option[@]}" -eq 0 ] || fail_usage "--no-build grades DIR as configured; -DSTEP<N>_SOURCE needs a build"
  cache="$build_dir/CMakeCache.txt"
  [ -f "$cache" ] || fail_usage "--no-build: '$build_dir' holds no configured build (no CMakeCache.txt)"
  for step in "${available_steps[@]}"; do
    step_source[$step]="$(sed -n "s/^STEP${step}_SOURCE:[A-Z]*=//p" "$cache")"
  done
  for program in gpu_tests bench "${steps[@]/#/step}"; do
    [ -x "$build_dir/$program" ] || fail_runtime "--no-build: $build_dir has no $program; build it first"
  done
  for step in "${steps[@]}"; do
    if is_hopper_step "$step" && [ ! -x "$build_dir-checked/gpu_tests" ]; then
      fail_runtime "--no-build: step $step is a Hopper step and $build_dir-checked has no gpu_tests; build it first"
    fi
  done
else
  configure_arguments=()
  for step in "${available_steps[@]}"; do
    environment_name="STEP${step}_SOURCE"
    file="${source_option[$step]:-${!environment_name:-}}"
    if [ -n "$file" ]; then
      [ -f "$file" ] || fail_usage "STEP${step}_SOURCE: no such file '$file'"
      file="$(cd "$(dirname "$file")" && pwd)/$(basename "$file")"
    fi
    step_source[$step]="$file"
    configure_arguments+=("-DSTEP${step}_SOURCE=$file")
  done
  mkdir -p "$build_dir"
fi
build_dir="$(cd "$build_dir" && pwd)"
step_list="$(IFS=';'; echo "${steps[*]}")"  # -DATTN_STEPS: build these steps only
for step in "${steps[@]}"; do
  if [ -z "${step_source[$step]}" ]; then
    shipped=("$repo_root"/steps/v"$step"_*/*.cu)
    say "NOTE: step $step is graded from its shipped solution (${shipped[0]#"$repo_root"/}), not a" \
        "student's file; to grade a file: scripts/grade.sh my_v$step.cu"
  fi
done
checked_dir="$build_dir-checked"  # the checked pipeline build, for the Hopper steps
[ -n "$json_path" ] || json_path="$build_dir/results.json"
work_dir="$build_dir/grading"  # raw results of this run, read by grade_report.py
rm -rf "$work_dir"
mkdir -p "$work_dir"

if [ "$no_build" = 0 ]; then
  say "configuring $build_dir (steps ${steps[*]})"
  cmake -S "$repo_root" -B "$build_dir" -DBUILD_TESTING=ON "-DATTN_STEPS=$step_list" \
      "${configure_arguments[@]}" > "$work_dir/build.log" 2>&1 ||
    fail_runtime "configure failed; see $work_dir/build.log"
  targets=(gpu_tests bench)
  for step in "${steps[@]}"; do
    targets+=("step$step")
    [ -z "${step_source[$step]}" ] || targets+=("step${step}_ref")
  done
  say "building ${targets[*]}"
  if ! cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" >> "$work_dir/build.log" 2>&1; then
    say "the build failed; see $work_dir/build.log"
    touch "$work_dir/build.failed"
  fi
  for step in "${steps[@]}"; do
    is_hopper_step "$step" || continue
    [ -e "$work_dir/build.failed" ] && break
    say "configuring and building the checked pipeline build in $checked_dir"
    # Hopper alone (90): the checked build only ever runs there.
    if ! { cmake -S "$repo_root" -B "$checked_dir" -DBUILD_TESTING=ON -DATTN_CHECKED_PIPELINE=ON \
             -DCMAKE_CUDA_ARCHITECTURES=90 "-DATTN_STEPS=$step_list" \
             "${configure_arguments[@]}" && cmake --build "$checked_dir" -j "$(nproc)" --target gpu_tests; } \
         >> "$work_dir/build.log" 2>&1; then
      say "the checked build failed; see $work_dir/build.log"
      touch "$work_dir/build.failed"
    fi
    break
  done
fi
for step in "${steps[@]}"; do
  printf '%s' "${step_source[$step]}" > "$work_dir/step$step.source"
  if is_hopper_step "$step"; then touch "$work_dir/step$step.hopper"; fi
done

# A usable GPU: nvidia-smi sees one, and the CUDA runtime does too (the GPU suite's own device
# probe, which exits 77 without a device and runs no kernel). It also exits 77 on a GPU outside
# the step's compute capability range (a Hopper step on an A100): that GPU is usable, and such a
# step's GPU parts are skipped with that reason below.
gpu_reason=""
if [ -e "$work_dir/build.failed" ]; then
  :  # nothing runs; grade_report.py fails every part
elif ! command -v nvidia-smi >/dev/null; then
  gpu_reason="no GPU: nvidia-smi not found"
elif ! nvidia-smi -L > "$work_dir/nvidia-smi.log" 2>&1; then
  gpu_reason="no GPU: nvidia-smi -L failed: $(head -n 1 "$work_dir/nvidia-smi.log")"
elif ! "$build_dir/gpu_tests" --step="v${steps[0]}" --list-test-cases > "$work_dir/probe.log" 2>&1 &&
     ! grep -q 'needs a GPU of compute capability' "$work_dir/probe.log"; then
  gpu_reason="no usable GPU: $(grep -m 1 . "$work_dir/probe.log" || echo "the CUDA device probe failed")"
fi

# Why this GPU cannot run step $1 at all (its compute capability), from the same probe; or nothing.
capability_reason() {
  "$build_dir/gpu_tests" --step="v$1" --list-test-cases 2>&1 |
    sed -n '/^SKIPPED: .*needs a GPU of compute capability/{s/^SKIPPED: //;s/; the GPU suite for [^ ]* did not run$//;p;}' |
    head -n 1 || true
}
[ -n "$gpu_reason" ] && say "$gpu_reason; the GPU parts are skipped"

# compute-sanitizer: $COMPUTE_SANITIZER, else PATH, else the toolkit folders it ships in.
sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
for folder in "${CUDA_HOME:-/nonexistent}/bin" /usr/local/cuda/bin /opt/cuda/bin; do
  [ -n "$sanitizer" ] || [ ! -x "$folder/compute-sanitizer" ] || sanitizer="$folder/compute-sanitizer"
done

for step in "${steps[@]}"; do
  label="^step${step}\$"
  # The tests of the step, listed even when the build failed, so each is reported.
  ctest --test-dir "$build_dir" -L "$label" --show-only=json-v1 > "$work_dir/step$step.tests.json"
  [ -e "$work_dir/build.failed" ] && continue
  step_reason="$gpu_reason"
  [ -n "$step_reason" ] || step_reason="$(capability_reason "$step")"
  say "step $step: ctest -L step$step"
  # Its exit code says only "something failed"; the JUnit file says what, test by test.
  ctest --test-dir "$build_dir" -L "$label" --no-tests=error --output-on-failure \
      --output-junit "$work_dir/step$step.junit.xml" > "$work_dir/step$step.ctest.log" 2>&1 || true

  # A kernel that never finishes hangs compute-sanitizer too (it waits for every kernel), and
  # each tool would wait out SANITIZER_TIMEOUT_S. So the step runs once on the sanitizer's shape
  # without it first: the harness gives up on a hung kernel after 10 s and says so, and then
  # both sanitizer parts fail as timed out, with that line, without running.
  hung_log=""
  if [ -z "$step_reason" ] && [ -x "$sanitizer" ]; then
    timeout 300 "$build_dir/step$step" "${sanitizer_arguments[@]}" > "$work_dir/step$step.hangcheck.log" 2>&1 || true
    if grep -q "did not finish within" "$work_dir/step$step.hangcheck.log"; then
      hung_log="$work_dir/step$step.hangcheck.log"
      say "step $step: its kernel never finishes at the sanitizer's shape; the sanitizer parts fail without running"
    fi
  fi
  for tool in memcheck racecheck; do
    part="$work_dir/step$step.$tool"
    if [ -n "$step_reason" ]; then
      echo "$step_reason" > "$part.skipped"
    elif [ ! -x "$sanitizer" ]; then
      echo "compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)" > "$part.skipped"
    elif [ -n "$hung_log" ]; then
      cp "$hung_log" "$part.log"
      echo 124 > "$part.rc"  # reported as timed out, with the step's line
    else
      say "step $step: compute-sanitizer --tool $tool"
      tool_status=0
      timeout "$sanitizer_timeout_s" "$sanitizer" --tool "$tool" --error-exitcode 86 \
          "$build_dir/step$step" "${sanitizer_arguments[@]}" > "$part.log" 2>&1 || tool_status=$?
      echo "$tool_status" > "$part.rc"
    fi
  done

  if is_hopper_step "$step"; then
    part="$work_dir/step$step.checked"
    if [ -n "$step_reason" ]; then
      echo "$step_reason" > "$part.skipped"
    else
      say "step $step: the GPU suite in the checked pipeline build"
      checked_status=0
      timeout "$sanitizer_timeout_s" "$checked_dir/gpu_tests" --step="v$step" > "$part.log" 2>&1 ||
        checked_status=$?
      echo "$checked_status" > "$part.rc"
    fi
  fi

  part="$work_dir/step$step.speed"
  if [ -n "${step_source[$step]}" ]; then
    if [ -n "$step_reason" ]; then
      echo "$step_reason" > "$part.skipped"
    else
      bench_status=0
      say "step $step: bench --steps v$step,v${step}_ref --tokens $speed_tokens"
      "$build_dir/bench" --steps "v$step,v${step}_ref" --tokens "$speed_tokens" \
          --csv "$part.csv" > "$part.log" 2>&1 || bench_status=$?
      echo "$bench_status" > "$part.rc"
    fi
  fi
done

report_status=0
python3 "$repo_root/scripts/grade_report.py" --work-dir "$work_dir" --json "$json_path" \
    --gpu-skipped-reason "$gpu_reason" --sanitizer-arguments "${sanitizer_arguments[*]}" \
    --speed-tokens "$speed_tokens" --elapsed-s "$SECONDS" "${steps[@]}" || report_status=$?
case "$report_status" in
  0|1|4) say "report written to $json_path"; exit "$report_status" ;;
  *) fail_runtime "grade_report.py failed (exit $report_status); the raw results are in $work_dir" ;;
esac
