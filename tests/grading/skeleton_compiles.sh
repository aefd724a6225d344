#!/usr/bin/env bash
# The exercise skeleton of a step is generated, carries one TODO per exercise region and no
# marker, and compiles as a step file (nvcc -c against the repository's include folders).
#
#   skeleton_compiles.sh REPO_ROOT STEP NVCC OUT_DIR [ARCH]        ARCH: 80 means sm_80, 90a sm_90a
#
# Exits 77 (ctest: skipped, with the reason) when the step has no exercise regions yet.
set -euo pipefail
repo_root=$1 step=$2 nvcc=$3 out_dir=$4
arch_option=()
# Machine code for that one target (-arch=sm_90a would add compute_90 PTX, which wgmma lacks).
[ -z "${5:-}" ] || arch_option=(-gencode "arch=compute_$5,code=sm_$5")
mkdir -p "$out_dir"
skeleton="$out_dir/skeleton_v$step.cu"
errors="$out_dir/make-exercise_v$step.err"

status=0
"$repo_root/scripts/make-exercise.sh" "$step" > "$skeleton" 2> "$errors" || status=$?
if [ "$status" = 1 ] && grep -q "has no exercise regions" "$errors"; then
  cat "$errors"
  exit 77
fi
[ "$status" = 0 ] || { cat "$errors" >&2; exit 1; }

step_file=$(ls "$repo_root"/steps/v"$step"_*/*.cu)
regions=$(grep -c '^[[:space:]]*// BEGIN EXERCISE' "$step_file")
todos_added=$(( $(grep -c '^[[:space:]]*// TODO: ' "$skeleton") - $(grep -c '^[[:space:]]*// TODO: ' "$step_file" || true) ))
if [ "$todos_added" -ne "$regions" ]; then
  echo "skeleton of step $step: $regions exercise region(s) but $todos_added TODO(s)" >&2
  exit 1
fi
if grep -nE '// (BEGIN|END) EXERCISE' "$skeleton" >&2; then
  echo "skeleton of step $step: markers left in $skeleton" >&2
  exit 1
fi

# As add_step() compiles a step: its id defined, the contract's headers (contract/) and steps/
# (the library folders, "hopper/...", "policies/...") on the include path.
"$nvcc" -std=c++17 --expt-relaxed-constexpr "${arch_option[@]}" -DATTN_STEP_ID="\"v$step\"" \
  -I"$repo_root/contract" -I"$repo_root/steps" \
  -c "$skeleton" -o "$out_dir/skeleton_v$step.o"
echo "skeleton of step $step: $regions region(s) replaced by TODOs; it compiles ($skeleton)"
