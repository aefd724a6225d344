#!/usr/bin/env bash
# A new step needs no edit outside its folder. In a copy of the sources, one more folder,
# steps/v<N>_copy/ (N one past the last step), holding step 0's kernel file and a step.cmake that
# says ARCH 80 (not step 0's 75, so the fact is seen to travel), is configured and built alone
# (-DATTN_STEPS=N): its program answers --help, and the bench lists it with compute capability
# 8.0+. Exit 0 when both hold.
#
#   new_step.sh REPO_ROOT WORK_DIR CUDA_ARCHITECTURES
set -euo pipefail
repo=${1:?repository root} work=${2:?work folder} arch=${3:?CUDA architectures}
rm -rf "$work"
mkdir -p "$work/tree"
for part in CMakeLists.txt contract reference harness programs baselines steps capi; do
  cp -r "$repo/$part" "$work/tree/"
done
last=$(ls -d "$work"/tree/steps/v*_* | sed -E 's|.*/v([0-9]+)_.*|\1|' | sort -n | tail -1)
number=$((last + 1))
folder="$work/tree/steps/v${number}_copy"
mkdir "$folder"
cp "$repo"/steps/v0_*/*.cu "$folder/copy.cu"
echo "attn_step_facts(ARCH 80)" > "$folder/step.cmake"
cmake -S "$work/tree" -B "$work/build" -DCMAKE_CUDA_ARCHITECTURES="$arch" -DATTN_STEPS="$number" \
  -DBUILD_TESTING=OFF > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" --target "step$number" bench > "$work/build.log" 2>&1 ||
  { tail -n 30 "$work/build.log"; exit 1; }
"$work/build/step$number" --help | grep -q "This step (v$number)" ||
  { echo "step$number --help does not name v$number"; exit 1; }
listed=$("$work/build/bench" --list 2>/dev/null | awk -F'\t' -v id="v$number" '$1 == id')
echo "bench --list: $listed"
[ "$(cut -f4 <<< "$listed")" = "8.0+" ] ||
  { echo "v$number is not listed with compute capability 8.0+ (its step.cmake says ARCH 80)"; exit 1; }
echo "a new step folder, v${number}_copy, built and listed with nothing edited outside it"
