#!/usr/bin/env bash
# Prints the exercise skeleton of step N to stdout: the shipped step file with every region
#
#     // BEGIN EXERCISE: <short task>
#     ...solution...
#     // END EXERCISE
#
# replaced by a TODO comment that carries the task. A region's lines of the form
#
#     // SKELETON: <code>
#
# are the skeleton's code after the TODO (comments in the shipped file): they write NaN into
# what the region computes, so an untouched skeleton fails every check with non-finite output
# instead of passing a plausible wrong answer along. The step file is the only source of truth,
# so no copy of a kernel is kept by hand.
#
#   scripts/make-exercise.sh N > my_vN.cu        N: the step number (3 or v3)
#
# Build the skeleton with cmake -DSTEP<N>_SOURCE=my_vN.cu; grade that file with
# scripts/grade.sh my_vN.cu (docs/grading.md). Exit codes: 0 printed, 1 the step has no
# exercise regions or malformed markers, 2 usage error (unknown option, no such step).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail_usage() { echo "make-exercise.sh: $1 (try --help)" >&2; exit 2; }

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") fail_usage "missing the step number" ;;
esac
[ "$#" -eq 1 ] || fail_usage "expected one step number, got $#"
step="${1#v}"
[[ "$step" =~ ^[0-9]+$ ]] || fail_usage "'$1' is not a step number"

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
shopt -s nullglob
step_folders=("$repo_root"/steps/v"$step"_*/)
[ "${#step_folders[@]}" -eq 1 ] || fail_usage "no step $step (no single folder steps/v${step}_*/)"
step_files=("${step_folders[0]}"*.cu)
[ "${#step_files[@]}" -eq 1 ] || fail_usage "${step_folders[0]#"$repo_root"/} must hold exactly one .cu file"
step_file="${step_files[0]}"
relative_path="${step_file#"$repo_root"/}"

# awk buffers the skeleton and prints it only when every marker is well formed, so a broken
# file never yields half a skeleton.
awk -v path="$relative_path" -v step="$step" '
  function fail(message) { print "make-exercise.sh: " path ":" FNR ": " message > "/dev/stderr"; failed = 1; exit 1 }
  /^[ \t]*\/\/ BEGIN EXERCISE/ {
    if (inside) fail("BEGIN EXERCISE inside the region opened on line " begin_line)
    task = $0
    sub(/^[ \t]*\/\/ BEGIN EXERCISE:?[ \t]*/, "", task)
    if (task == "") fail("BEGIN EXERCISE needs a task: // BEGIN EXERCISE: <short task>")
    indent = $0
    sub(/\/\/.*/, "", indent)
    skeleton = skeleton indent "// TODO: " task "\n"
    inside = 1; begin_line = FNR; regions++
    next
  }
  /^[ \t]*\/\/ END EXERCISE/ {
    if (!inside) fail("END EXERCISE without a BEGIN EXERCISE")
    inside = 0
    next
  }
  inside && /^[ \t]*\/\/ SKELETON: / {
    code = $0
    sub(/^[ \t]*\/\/ SKELETON: /, "", code)
    skeleton = skeleton indent code "\n"
    next
  }
  !inside { skeleton = skeleton $0 "\n" }
  END {
    if (failed) exit 1
    if (inside) { FNR = begin_line; fail("BEGIN EXERCISE has no END EXERCISE") }
    if (regions == 0) {
      print "make-exercise.sh: step " step " has no exercise regions: " path " holds no " \
            "\"// BEGIN EXERCISE: <task>\" ... \"// END EXERCISE\" markers" > "/dev/stderr"
      exit 1
    }
    printf "// Exercise: step %s, generated from %s by scripts/make-exercise.sh.\n", step, path
    printf "// Write each TODO (code right after a TODO writes NaN until you replace it); build with\n"
    printf "// cmake -DSTEP%s_SOURCE=<this file>; grade this file with\n", step
    printf "// scripts/grade.sh <this file> (docs/grading.md).\n"
    printf "%s", skeleton
  }
' "$step_file"
