#!/usr/bin/env bash
# Builds a bench with several tile shapes of step 6 or step 8 side by side, so one run compares
# them.
#
#   scripts/tune.sh [--build-dir DIR] [--out DIR] v6 WARPS,ROW_GROUPS,KEY_TILE ...
#   scripts/tune.sh [--build-dir DIR] [--out DIR] [--causal] v8 HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS[,CONSUMERS] ...
#   e.g. scripts/tune.sh v6 4,1,64 4,2,64 8,1,64     scripts/tune.sh v8 64,128,2,2 128,160,2,1
#
# Each shape is a variant of the step's file (CMakeLists.txt, ATTN_VARIANTS) with one head dim's
# tile shape replaced (v6: ATTN_V6_TILES_D64, registered as v6wWgGnN; v8: ATTN_V8_TILES_D<HEAD_DIM>,
# registered as v8dDnNsSqQ, or v8dDnNsSqQcC with CONSUMERS, 2 or 3; with --causal the causal
# list's ATTN_V8_CAUSAL_TILES_D<HEAD_DIM>, registered as v8causal...), built for the build
# folder's architectures (default build/) into bench_variants, copied to OUT/bench_tune (default
# stage/tune). On a GPU machine:
#   stage/tune/bench_tune --steps v6w4g1n64,v6w4g2n64 --tokens 197,577,1025 --csv tune.csv
# Chapters 7 and 10 used it to choose the steps' tiles (docs/results/h100/tuning/).
set -euo pipefail

build_dir=build out=stage/tune step="" shapes=() causal=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --causal) causal=1; shift ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    -*) echo "tune.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) if [ -z "$step" ]; then step=$1; else shapes+=("$1"); fi; shift ;;
  esac
done
case "$step" in
  v6) form='^[0-9]+,[0-9]+,[0-9]+$' what=WARPS,ROW_GROUPS,KEY_TILE ;;
  v8) form='^(32|64|80|96|128),[0-9]+,[0-9]+,[12](,[23])?$' what=HEAD_DIM,BLOCK_N,STAGES,Q_BUFFERS[,CONSUMERS] ;;
  *) echo "tune.sh: the first argument is the step, v6 or v8 (see --help)" >&2; exit 2 ;;
esac
[ "${#shapes[@]}" -gt 0 ] || { echo "tune.sh: give at least one $what (see --help)" >&2; exit 2; }
[ "$causal" = 0 ] || [ "$step" = v8 ] || { echo "tune.sh: --causal is for v8's causal tiles" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
source_file=$(echo "$repo"/steps/"$step"_*/*.cu)
variants=()
for shape in "${shapes[@]}"; do
  [[ "$shape" =~ $form ]] || { echo "tune.sh: '$shape' is not $what (with a head dim the step serves)" >&2; exit 2; }
  if [ "$step" = v6 ]; then
    IFS=, read -r warps groups key_tile <<< "$shape"
    head_dim=64 id="v6w${warps}g${groups}n${key_tile}"
  else
    IFS=, read -r head_dim block_n stages q_buffers consumers <<< "$shape"
    id="v8d${head_dim}n${block_n}s${stages}q${q_buffers}${consumers:+c$consumers}"
    shape="$block_n,$stages,$q_buffers${consumers:+,$consumers}"
  fi
  macro="ATTN_${step^^}_TILES_D$head_dim"
  if [ "$causal" = 1 ]; then macro="ATTN_V8_CAUSAL_TILES_D$head_dim" id="v8causal${id#v8}"; fi
  if ! grep -q "Tiles<$head_dim, $macro>" "$source_file"; then
    [ "$causal" = 1 ] && grep -q "Tiles<$head_dim, ATTN_V8_TILES_D$head_dim>" "$source_file" &&
      { echo "tune.sh: the causal list takes D = $head_dim's tile from ATTN_V8_TILES_D$head_dim (none of its own): tune it without --causal" >&2; exit 2; }
    echo "tune.sh: $(basename "$source_file") no longer takes its D = $head_dim tile from $macro; update this script" >&2; exit 3
  fi
  variants+=("$id=$step:$macro=$shape")
done
"$repo/scripts/build-variants.sh" "$build_dir" "$out/bench_tune" -DATTN_VARIANTS="$(IFS=';'; echo "${variants[*]}")"
