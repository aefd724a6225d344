#!/usr/bin/env bash
# make-exercise.sh on hand-made step files: regions become TODOs at their indentation (with
# their SKELETON lines as code after them), and
# every malformed marker, a step without regions, and a missing step are refused with one line
# that names the file and line.
#
#   exercise_markers.sh REPO_ROOT OUT_DIR
set -euo pipefail
repo_root=$1 out_dir=$2
fake_repo="$out_dir/fake_repo"
rm -rf "$fake_repo"
mkdir -p "$fake_repo/scripts"
cp "$repo_root/scripts/make-exercise.sh" "$fake_repo/scripts/"

make_step() {  # make_step NUMBER TEXT: steps/vNUMBER_case/case.cu holding TEXT
  mkdir -p "$fake_repo/steps/v$1_case"
  printf '%b' "$2" > "$fake_repo/steps/v$1_case/case.cu"
}
make_step 1 'keep 1\n    // BEGIN EXERCISE: first task\nsolution one\n      // SKELETON: poison_the_output();\n    // END EXERCISE\nkeep 2\n// BEGIN EXERCISE: second task\nsolution two\n// END EXERCISE\nkeep 3\n'
make_step 2 'a\n// BEGIN EXERCISE: never closed\nb\n'
make_step 3 'a\n  // END EXERCISE\n'
make_step 4 'a\n// BEGIN EXERCISE:\n// END EXERCISE\n'
make_step 5 '// BEGIN EXERCISE: one\n// BEGIN EXERCISE: two\n// END EXERCISE\n'
make_step 6 'no markers here\n'

failures=0
expect() {  # expect STEP EXIT_CODE STDERR_PATTERN
  local code=0 stderr
  stderr=$("$fake_repo/scripts/make-exercise.sh" "$1" 2>&1 >/dev/null) || code=$?
  if [ "$code" != "$2" ] || ! grep -qE -- "$3" <<< "$stderr" || [ "$(wc -l <<< "$stderr")" != 1 ]; then
    echo "make-exercise.sh $1: exit $code, stderr '$stderr'; expected exit $2 and one line matching '$3'" >&2
    failures=$((failures + 1))
  fi
}
expect 2 1 'case.cu:2: BEGIN EXERCISE has no END EXERCISE'
expect 3 1 'case.cu:2: END EXERCISE without a BEGIN EXERCISE'
expect 4 1 'case.cu:2: BEGIN EXERCISE needs a task'
expect 5 1 'case.cu:2: BEGIN EXERCISE inside the region opened on line 1'
expect 6 1 'step 6 has no exercise regions'
expect 9 2 'no step 9'
expect x 2 "'x' is not a step number"

# A SKELETON line becomes code after the TODO, at the region's indentation; the four header
# lines come first.
expected_body=$'keep 1\n    // TODO: first task\n    poison_the_output();\nkeep 2\n// TODO: second task\nkeep 3'
body=$("$fake_repo/scripts/make-exercise.sh" 1 | tail -n +5)
if [ "$body" != "$expected_body" ]; then
  echo "make-exercise.sh 1 printed:" >&2
  echo "$body" >&2
  failures=$((failures + 1))
fi
[ "$failures" = 0 ] && echo "make-exercise.sh: regions, malformed markers and missing steps handled"
exit "$((failures > 0))"
