#!/usr/bin/env bash
# Builds a bench with several tile shapes of step v6 side by side, so one run compares them.
#
#   scripts/tune-v6.sh [--build-dir DIR] [--out DIR] [--arch SM] WARPS,ROW_GROUPS,KEY_TILE ...
#   e.g. scripts/tune-v6.sh 4,1,64 4,2,64 8,1,64 4,1,32
#
# Each shape is steps/v6_flash/flash.cu built with its head-dim-64 tile shape replaced
# (-DATTN_V6_TILES_D64=WARPS,ROW_GROUPS,KEY_TILE), registered as v6wWgGnN. They are linked
# with the harness of an existing build (default build/, built with `cmake --build build`)
# into OUT/bench_tune (default stage/tune). On a GPU machine:
#   stage/tune/bench_tune --tokens 197,577,1025 --csv tune.csv
# Chapter 7 used it to choose v6's tile (docs/results/h100/tuning/).
set -euo pipefail

build_dir=build out=stage/tune arch=90
shapes=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --arch) arch=${2:?--arch needs a value}; shift 2 ;;
    -*) echo "tune-v6.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [[ "$1" =~ ^[0-9]+,[0-9]+,[0-9]+$ ]] ||
         { echo "tune-v6.sh: '$1' is not WARPS,ROW_GROUPS,KEY_TILE" >&2; exit 2; }
       shapes+=("$1"); shift ;;
  esac
done
[ "${#shapes[@]}" -gt 0 ] || { echo "tune-v6.sh: give at least one WARPS,ROW_GROUPS,KEY_TILE (see --help)" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
harness=(
  "$build_dir/CMakeFiles/bench.dir/programs/bench_main.cpp.o"
  "$build_dir/baselines/CMakeFiles/attn_eager.dir/eager_cublas.cu.o"
  "$build_dir/harness/libattn_harness.a"
  "$build_dir/reference/libattn_reference.a"
  "$build_dir/contract/libattn_contract.a"
)
for file in "${harness[@]}"; do
  [ -f "$file" ] || { echo "tune-v6.sh: $file missing; build first: cmake -B $build_dir && cmake --build $build_dir --target bench" >&2; exit 3; }
done
grep -q 'Tiles<64, ATTN_V6_TILES_D64>' "$repo/steps/v6_flash/flash.cu" ||
  { echo "tune-v6.sh: flash.cu no longer takes its D = 64 tile from ATTN_V6_TILES_D64; update this script" >&2; exit 3; }

mkdir -p "$out"
mapfile -t facts < <("$repo/scripts/step-facts.sh" "$repo/steps/v6_flash")  # 90, the -D flags
objects=()
for shape in "${shapes[@]}"; do
  IFS=, read -r warps groups key_tile <<< "$shape"
  id="v6w${warps}g${groups}n${key_tile}"
  echo "tune-v6.sh: compiling $id"
  # nvcc splits -D values at commas unless they are escaped.
  nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr \
    -gencode "arch=compute_$arch,code=sm_$arch" -I"$repo/contract" -I"$repo/steps" \
    -DATTN_STEP_ID="\"$id\"" "${facts[@]:1}" "-DATTN_V6_TILES_D64=$warps\\,$groups\\,$key_tile" \
    -c "$repo/steps/v6_flash/flash.cu" -o "$out/$id.o"
  objects+=("$out/$id.o")
done
nvcc -o "$out/bench_tune" "${harness[0]}" "${objects[@]}" "${harness[@]:1}" -lcublas -lpthread
echo "tune-v6.sh: wrote $out/bench_tune ($("$out/bench_tune" --list | cut -f1 | paste -sd' '))"
