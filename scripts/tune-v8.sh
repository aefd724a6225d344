#!/usr/bin/env bash
# Builds a bench with several tile shapes of step v8 side by side, so one run compares them.
#
#   scripts/tune-v8.sh [--build-dir DIR] [--out DIR] HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS ...
#   e.g. scripts/tune-v8.sh 64,128,2,2 64,208,2,2 128,128,2,2 128,160,2,1
#
# Each shape is a variant of steps/v8_warp_specialized/warp_specialized.cu (CMakeLists.txt,
# ATTN_VARIANTS) with that head dim's tile shape replaced (ATTN_V8_TILES_D<HEAD_DIM>=BLOCK_N,
# STAGES,Q_BUFFERS), registered as v8dDnNsSqQ, built in an existing build folder (default
# build/) into bench_variants, copied to OUT/bench_tune (default stage/tune8). On an H100:
#   stage/tune8/bench_tune --steps v8d64n128s2q2,v8d64n208s2q2 --tokens 197,577,1025 --csv tune.csv
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
    *) [[ "$1" =~ ^(32|64|80|96|128),[0-9]+,[0-9]+,[12]$ ]] ||
         { echo "tune-v8.sh: '$1' is not HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS with a head dim step 8 serves" >&2; exit 2; }
       shapes+=("$1"); shift ;;
  esac
done
[ "${#shapes[@]}" -gt 0 ] || { echo "tune-v8.sh: give at least one HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS (see --help)" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
source_file="$repo/steps/v8_warp_specialized/warp_specialized.cu"
variants=()
for shape in "${shapes[@]}"; do
  IFS=, read -r head_dim block_n stages q_buffers <<< "$shape"
  grep -q "Tiles<$head_dim, ATTN_V8_TILES_D$head_dim>" "$source_file" ||
    { echo "tune-v8.sh: warp_specialized.cu no longer takes its D = $head_dim tile from ATTN_V8_TILES_D$head_dim; update this script" >&2; exit 3; }
  variants+=("v8d${head_dim}n${block_n}s${stages}q${q_buffers}=v8:ATTN_V8_TILES_D$head_dim=$block_n,$stages,$q_buffers")
done
"$repo/scripts/build-variants.sh" "$build_dir" "$out/bench_tune" -DATTN_VARIANTS="$(IFS=';'; echo "${variants[*]}")"
