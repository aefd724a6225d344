#!/usr/bin/env bash
# One compute-sanitizer run of a step executable, as a CTest test (label `sanitizer`, registered
# when the build is configured with -DATTN_SANITIZER_TESTS=ON; tests/CMakeLists.txt):
#
#   sanitize.sh TOOL STEP_BINARY SHAPE_NAME [the step's flags...]
#
# The step runs once, small (B = 2, H = 3), every output checked, and without measuring the GPU's
# ceilings (--no-ceilings: a cuBLAS GEMM and a 1 GiB copy, far too slow under the sanitizer, and
# racecheck crashes inside cuBLAS's sm_90 GEMM on the H100), so every kernel that runs is the
# step's own or the harness's. Exit 0: clean. 77, skipped, with the reason: no compute-sanitizer
# (COMPUTE_SANITIZER, else PATH, else /usr/local/cuda/bin), no GPU, or the step refuses the shape
# (a head dim, dtype, mask or GPU it does not serve: nothing ran, nothing to check). 1: errors or
# hazards, a time-out (SANITIZER_TIMEOUT_S, default 600), or a binary whose kernels could not be
# told apart from the harness's.
# ATTN_SANITIZER_LOGS, a folder: the run's log is kept there as <step>_<tool>_<shape>.log.
# ATTN_SANITIZER_RESULTS, a file: one line "step tool shape result" is appended (gpu-check).
set -uo pipefail
tool=${1:?tool} binary=${2:?step binary} shape=${3:?shape name}
shift 3
step=$(basename "$binary")
log_dir=${ATTN_SANITIZER_LOGS:-$(mktemp -d)}
mkdir -p "$log_dir"
log="$log_dir/${step}_${tool}_${shape}.log"
finish() {  # exit code, result text
  [ -n "${ATTN_SANITIZER_RESULTS:-}" ] &&
    printf '%-8s %-10s %-22s %s\n' "$step" "$tool" "$shape" "$2" >> "$ATTN_SANITIZER_RESULTS"
  echo "$step $tool $shape: $2"
  exit "$1"
}
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$sanitizer" ] || finish 77 "n/a (SKIPPED: no compute-sanitizer; set COMPUTE_SANITIZER)"
# A sanitizer that checked nothing would still print 0 errors: the step's kernels must be there.
grep -aqE '_Z[A-Za-z0-9_]*attention' "$binary" ||
  finish 1 "FAILED (no kernel name contains 'attention': the sanitizer would check nothing)"
rc=0
timeout "${SANITIZER_TIMEOUT_S:-600}" "$sanitizer" --tool "$tool" --error-exitcode 86 \
  "$binary" --batch 2 --heads 3 --iters 1 --warmup 0 --check full --no-ceilings "$@" > "$log" 2>&1 || rc=$?
clean_line='ERROR SUMMARY: 0 errors'
[ "$tool" = racecheck ] && clean_line='RACECHECK SUMMARY: 0 hazards'
# The step's one-line refusal (exit 2; compute-sanitizer reports it as 255 on the H100).
refusal=$(grep -m 1 -E "^$step: .*(does not serve|needs a GPU of compute capability)" "$log")
no_gpu=$(grep -m 1 -E "no CUDA device found" "$log")
if [ "$rc" -ne 0 ] && [ -n "$refusal" ]; then
  finish 77 "n/a (refused: ${refusal#"$step: "})"
elif [ "$rc" -ne 0 ] && [ -n "$no_gpu" ]; then
  finish 77 "n/a (SKIPPED: no GPU)"
elif [ "$rc" -eq 0 ] && grep -q "$clean_line" "$log"; then
  finish 0 "clean"
elif [ "$rc" -eq 124 ]; then
  finish 1 "FAILED (timed out)"
fi
summary=$(grep -m 1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | sed 's/^=* *//')
tail -n 20 "$log"
finish 1 "FAILED (exit $rc${summary:+; $summary})"
