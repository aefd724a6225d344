#!/usr/bin/env bash
# Builds a bench that holds steps as they are now AND as they were at an earlier commit, so one
# run on a GPU says whether a change made a step faster or slower (same process, same inputs).
#
#   scripts/bench-against.sh [--build-dir DIR] [--out DIR] COMMIT STEP...     e.g. e9360c9 v7 v8
#
# Each STEP's kernel file at COMMIT joins the build as a variant (CMakeLists.txt, ATTN_AGAINST):
# compiled against that commit's steps/ folder and today's contract, with its step facts,
# registered as <STEP>at<COMMIT> (v8ate9360c9), and linked with today's steps into bench_variants,
# copied to OUT/bench_against (default stage/against). The build folder (default build/) keeps
# its other settings; the variants are cleared from it afterwards. On the GPU:
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
for step in "$@"; do
  [[ "$step" =~ ^v[0-9]+$ ]] || { echo "bench-against.sh: '$step' is not a step id (v7, say)" >&2; exit 2; }
done
steps=$(IFS=';'; echo "$*")
"$repo/scripts/build-variants.sh" "$build_dir" "$out/bench_against" \
  -DATTN_AGAINST="$commit" -DATTN_AGAINST_STEPS="$steps"
