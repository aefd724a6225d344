#!/usr/bin/env bash
# grade.sh on a machine without a usable GPU: it grades the built tree, reports every GPU part
# as skipped (never passed), exits 4, and writes a report that satisfies the schema.
#
#   grade_without_gpu.sh REPO_ROOT BUILD_DIR OUT_DIR STEP
#
# ctest runs this with CUDA_VISIBLE_DEVICES empty, so a GPU machine looks like a CPU one.
set -euo pipefail
repo_root=$1 build_dir=$2 out_dir=$3 step=$4
mkdir -p "$out_dir"
report="$out_dir/results_without_gpu.json"
rm -f "$report"

code=0
"$repo_root/scripts/grade.sh" --no-build --build-dir "$build_dir" --json "$report" "$step" \
  > "$out_dir/grade_without_gpu.out" 2>&1 || code=$?
cat "$out_dir/grade_without_gpu.out"
if [ "$code" != 4 ]; then
  echo "grade.sh exited $code; expected 4 (nothing failed, GPU parts skipped)" >&2
  exit 1
fi
grep -qE "^v$step .* skipped +skipped" "$out_dir/grade_without_gpu.out" ||
  { echo "the table does not show the sanitizer as skipped" >&2; exit 1; }
python3 "$repo_root/tests/grading/check_report.py" "$repo_root/scripts/grade_results.schema.json" \
  "$report" --expect-gpu-skipped
echo "grade.sh without a GPU: GPU parts skipped, exit 4, report valid ($report)"
