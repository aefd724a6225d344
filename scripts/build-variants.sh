#!/usr/bin/env bash
# Builds bench_variants in an existing build folder with the given variant settings
# (CMakeLists.txt: ATTN_AGAINST, ATTN_AGAINST_STEPS, ATTN_VARIANTS), copies it to OUTPUT, and
# clears the settings again, so the folder's own builds stay as they were. For bench-against.sh
# and the tune scripts:
#
#   scripts/build-variants.sh BUILD_DIR OUTPUT -DATTN_VARIANTS=... | -DATTN_AGAINST=... ...
set -euo pipefail
build_dir=${1:?build folder} output=${2:?output file}
shift 2
[ -f "$build_dir/CMakeCache.txt" ] ||
  { echo "build-variants.sh: $build_dir is not a build folder; configure it first: cmake -B $build_dir" >&2; exit 3; }
clear() {
  cmake -B "$build_dir" -DATTN_AGAINST= -DATTN_AGAINST_STEPS= -DATTN_VARIANTS= > /dev/null
  rm -rf "$build_dir"/against-*
}
trap clear EXIT
cmake -B "$build_dir" "$@" > /dev/null
cmake --build "$build_dir" --target bench_variants
mkdir -p "$(dirname "$output")"
cp "$build_dir/bench_variants" "$output"
echo "$(basename "$0"): wrote $output ($("$output" --list 2>/dev/null | cut -f1 | paste -sd' '))"
