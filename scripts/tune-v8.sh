#!/usr/bin/env bash
# Builds a bench with several tile shapes of step v8 side by side, so one run compares them.
#
#   scripts/tune-v8.sh [--build-dir DIR] [--out DIR] HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS ...
#   e.g. scripts/tune-v8.sh 64,128,2,2 64,208,2,2 128,128,2,2 128,160,2,1
#
# Each shape is steps/v8_warp_specialized/warp_specialized.cu built with that head dim's tile shape
# replaced (-DATTN_V8_TILES_D<HEAD_DIM>=BLOCK_N,STAGES,Q_BUFFERS), registered as v8dDnNsSqQ. They are linked with the
# harness of an existing build (default build/, built with `cmake --build build`) into
# OUT/bench_tune (default stage/tune8). On an H100:
#   stage/tune8/bench_tune --tokens 197,577,1025 --csv tune.csv
# Chapter 10 used it to choose v8's tiles (docs/results/h100/tuning/).
set -euo pipefail

build_dir=build out=stage/tune8
shapes=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    -*) echo "tune-v8.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [[ "$1" =~ ^(64|128),[0-9]+,[0-9]+,[12]$ ]] ||
         { echo "tune-v8.sh: '$1' is not HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS with HEAD_DIM 64 or 128" >&2; exit 2; }
       shapes+=("$1"); shift ;;
  esac
done
[ "${#shapes[@]}" -gt 0 ] || { echo "tune-v8.sh: give at least one HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS (see --help)" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
source_file="$repo/steps/v8_warp_specialized/warp_specialized.cu"
harness=(
  "$build_dir/CMakeFiles/bench.dir/programs/bench_main.cpp.o"
  "$build_dir/baselines/CMakeFiles/attn_eager.dir/eager_cublas.cu.o"
  "$build_dir/harness/libattn_harness.a"
  "$build_dir/reference/libattn_reference.a"
  "$build_dir/contract/libattn_contract.a"
)
for file in "${harness[@]}"; do
  [ -f "$file" ] || { echo "tune-v8.sh: $file missing; build first: cmake -B $build_dir && cmake --build $build_dir --target bench" >&2; exit 3; }
done
for head_dim in 64 128; do
  grep -q "Tiles<$head_dim, ATTN_V8_TILES_D$head_dim>" "$source_file" ||
    { echo "tune-v8.sh: warp_specialized.cu no longer takes its D = $head_dim tile from ATTN_V8_TILES_D$head_dim; update this script" >&2; exit 3; }
done

mkdir -p "$out"
mapfile -t facts < <("$repo/scripts/step-facts.sh" "$repo/steps/v8_warp_specialized")  # 90a, the -D flags
objects=()
for shape in "${shapes[@]}"; do
  IFS=, read -r head_dim block_n stages q_buffers <<< "$shape"
  id="v8d${head_dim}n${block_n}s${stages}q${q_buffers}"
  echo "tune-v8.sh: compiling $id"
  # nvcc splits -D values at commas unless they are escaped.
  nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
    -I"$repo/contract" -I"$repo/steps" -DATTN_STEP_ID="\"$id\"" "${facts[@]:1}" \
    "-DATTN_V8_TILES_D$head_dim=$block_n\\,$stages\\,$q_buffers" -c "$source_file" -o "$out/$id.o"
  objects+=("$out/$id.o")
done
nvcc -o "$out/bench_tune" "${harness[0]}" "${objects[@]}" "${harness[@]:1}" -lcublas -lpthread
echo "tune-v8.sh: wrote $out/bench_tune ($("$out/bench_tune" --list 2>/dev/null | cut -f1 | paste -sd' '))"
