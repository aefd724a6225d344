#!/usr/bin/env bash
# Builds a bench that holds steps as they are now AND as they were at an earlier commit, so one
# run on a GPU says whether a change made a step faster or slower (same process, same inputs).
#
#   scripts/bench-against.sh [--build-dir DIR] [--out DIR] COMMIT STEP...     e.g. e9360c9 v7 v8
#
# Each STEP's kernel file at COMMIT is compiled against that commit's steps/ folder (its headers)
# and today's contract headers, with that commit's step facts, registered as <STEP>at<COMMIT>
# (v8ate9360c9), and linked with today's steps (and the forward step a backward one runs first)
# and harness from an existing build (default build/) into OUT/bench_against (default
# stage/against). On the GPU:
#   stage/against/bench_against --steps v8,v8ate9360c9 --tokens 197,577,1025 --csv against.csv
set -euo pipefail

build_dir=build out=stage/against
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    -*) echo "bench-against.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ "$#" -ge 2 ] || { echo "bench-against.sh: give a COMMIT and at least one STEP (see --help)" >&2; exit 2; }
commit=$1
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
git -C "$repo" rev-parse --verify --quiet "$commit^{commit}" > /dev/null ||
  { echo "bench-against.sh: no commit '$commit' in this repository" >&2; exit 2; }
harness=(
  "$build_dir/CMakeFiles/bench.dir/programs/bench_main.cpp.o"
  "$build_dir/baselines/CMakeFiles/attn_eager.dir/eager_cublas.cu.o"
  "$build_dir/harness/libattn_harness.a"
  "$build_dir/reference/libattn_reference.a"
  "$build_dir/contract/libattn_contract.a"
)
for file in "${harness[@]}"; do
  [ -f "$file" ] || { echo "bench-against.sh: $file missing; build first: cmake --build $build_dir --target bench" >&2; exit 3; }
done

mkdir -p "$out"
tree="$out/tree-$commit"
rm -rf "$tree"
mkdir -p "$tree"
git -C "$repo" archive "$commit" steps | tar -x -C "$tree"
objects=()
for step in "$@"; do
  [[ "$step" =~ ^v[0-9]+$ ]] || { echo "bench-against.sh: '$step' is not a step id (v7, say)" >&2; exit 2; }
  today=("$build_dir"/CMakeFiles/attn_"$step".dir/steps/*/*.cu.o)
  [ -f "${today[0]}" ] || { echo "bench-against.sh: ${today[0]} missing; build $step first" >&2; exit 3; }
  then_source=("$tree"/steps/"$step"_*/*.cu)
  [ -f "${then_source[0]}" ] || { echo "bench-against.sh: $commit has no steps/${step}_*/" >&2; exit 2; }
  # The step's facts at COMMIT, as add_step() passes them (its folder's step.cmake). A commit
  # before step.cmake named its GPUs in its registration, and used sm_90a instructions where the
  # file says wgmma or setmaxnreg.
  arch=90
  facts_defines=()
  if facts=$("$repo/scripts/step-facts.sh" "$(dirname "${then_source[0]}")"); then
    mapfile -t facts_defines <<< "$facts"
    arch=${facts_defines[0]}
    facts_defines=("${facts_defines[@]:1}")
  else
    grep -qE 'wgmma|setmaxnreg' "${then_source[0]}" "$tree"/steps/"$step"_*/* && arch=90a
  fi
  id="${step}at${commit}"
  echo "bench-against.sh: compiling $id (sm_$arch)"
  nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode "arch=compute_$arch,code=sm_$arch" \
    -I"$repo/contract" -I"$tree/steps" -DATTN_STEP_ID="\"$id\"" "${facts_defines[@]}" \
    -c "${then_source[0]}" -o "$out/$id.o"
  objects+=("${today[0]}" "$out/$id.o")
done
# A backward step runs after its forward step (today's, as the bench does): link the forward
# steps the named ones declare (step.cmake's FORWARD) and the list does not name.
for step in "$@"; do
  forward=$("$repo/scripts/step-facts.sh" "$(dirname "$repo"/steps/"$step"_*/*.cu)" | sed -nE 's/^-DATTN_STEP_FORWARD="(v[0-9]+)"$/\1/p' || true)
  if [ -n "$forward" ] && [[ " $* " != *" $forward "* ]]; then
    forward_object=("$build_dir"/CMakeFiles/attn_"$forward".dir/steps/*/*.cu.o)
    [ -f "${forward_object[0]}" ] || { echo "bench-against.sh: ${forward_object[0]} missing; build $forward first" >&2; exit 3; }
    [[ " ${objects[*]} " == *" ${forward_object[0]} "* ]] || objects+=("${forward_object[0]}")
  fi
done
nvcc -o "$out/bench_against" "${harness[0]}" "${objects[@]}" "${harness[@]:1}" -lcublas -lpthread
rm -rf "$tree" "$out"/*.o
echo "bench-against.sh: wrote $out/bench_against ($("$out/bench_against" --list 2>/dev/null | cut -f1 | paste -sd' '))"
