#!/usr/bin/env bash
# Builds a bench with several tile shapes of step v6 side by side, so one run compares them.
#
#   scripts/tune-v6.sh [--build-dir DIR] [--out DIR] WARPS,ROW_GROUPS,KEY_TILE ...
#   e.g. scripts/tune-v6.sh 4,1,64 4,2,64 8,1,64 4,1,32
#
# Each shape is a variant of steps/v6_flash/flash.cu (CMakeLists.txt, ATTN_VARIANTS) with its
# head-dim-64 tile shape replaced (ATTN_V6_TILES_D64=WARPS,ROW_GROUPS,KEY_TILE), registered as
# v6wWgGnN, built for the build folder's architectures (default build/) into bench_variants,
# copied to OUT/bench_tune (default stage/tune). On a GPU machine:
#   stage/tune/bench_tune --steps v6w4g1n64,v6w4g2n64 --tokens 197,577,1025 --csv tune.csv
# Chapter 7 used it to choose v6's tile (docs/results/h100/tuning/).
set -euo pipefail

build_dir=build out=stage/tune
shapes=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    -*) echo "tune-v6.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [[ "$1" =~ ^[0-9]+,[0-9]+,[0-9]+$ ]] ||
         { echo "tune-v6.sh: '$1' is not WARPS,ROW_GROUPS,KEY_TILE" >&2; exit 2; }
       shapes+=("$1"); shift ;;
  esac
done
[ "${#shapes[@]}" -gt 0 ] || { echo "tune-v6.sh: give at least one WARPS,ROW_GROUPS,KEY_TILE (see --help)" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
grep -q 'Tiles<64, ATTN_V6_TILES_D64>' "$repo/steps/v6_flash/flash.cu" ||
  { echo "tune-v6.sh: flash.cu no longer takes its D = 64 tile from ATTN_V6_TILES_D64; update this script" >&2; exit 3; }
variants=()
for shape in "${shapes[@]}"; do
  IFS=, read -r warps groups key_tile <<< "$shape"
  variants+=("v6w${warps}g${groups}n${key_tile}=v6:ATTN_V6_TILES_D64=$warps,$groups,$key_tile")
done
"$repo/scripts/build-variants.sh" "$build_dir" "$out/bench_tune" -DATTN_VARIANTS="$(IFS=';'; echo "${variants[*]}")"
