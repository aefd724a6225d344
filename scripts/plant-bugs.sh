#!/usr/bin/env bash
# Proves that the checks can fail: builds copies of the flash steps (v6, v7, v8), each with one
# planted bug, into one bench, and on a GPU runs them on tail shapes, where every copy must FAIL
# its fp64 check. A planted bug the checks miss means the tests are weaker than they look.
#
#   scripts/plant-bugs.sh [--build-dir DIR] [--out DIR] [--run | --run-only]
#
# The bugs (each a one-line edit of the shipped kernel, refused if the line is gone):
#   nomask      the keys past N in the last K/V tile keep their (zero-K) scores: p != 0 there
#   norescale   the running output is not multiplied by the correction when the row max grows
#   nonorm      the output is not divided by the row sum
# They are linked with the harness of an existing build (default build/) into
# OUT/bench_planted (default stage/planted). --run then runs, on this machine's GPU,
#   bench_planted --steps <all planted ids> --tokens 65,577,1025 --batch 2 --heads 3 --check full
# (--run-only: the bench_planted already in OUT, built here or on another machine, without
# building) and exits 0 only when every copy failed its check at one N at least (the expected outcome:
# a missing rescale cannot show at N = 65, where one K/V tile holds every key), 1 otherwise.
set -euo pipefail

build_dir=build out=stage/planted run=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --run) run=1; shift ;;
    --run-only) run=2; shift ;;
    *) echo "plant-bugs.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
harness=(
  "$build_dir/CMakeFiles/bench.dir/common/bench_main.cpp.o"
  "$build_dir/reference/CMakeFiles/attn_eager.dir/eager_cublas.cu.o"
  "$build_dir/common/libattn_common.a"
)
for file in "${harness[@]}"; do
  [ -f "$file" ] || { echo "plant-bugs.sh: $file missing; build first: cmake -B $build_dir && cmake --build $build_dir --target bench" >&2; exit 3; }
done

# step folder | id | gencode arch | the line as shipped | the line with the bug
bugs=(
  "v6_flash|v6nomask|90|if (tile_keys < kBlockN) {|if (false) {"
  "v6_flash|v6norescale|90|o_acc[g][d][2 * half] *= correction;|;"
  "v6_flash|v6nonorm|90|const float inverse = 1.0f / total;|const float inverse = 1.0f;"
  "v7_tma_wgmma|v7nomask|90a|if (tile_keys < T::kBlockN) {|if (false) {"
  "v7_tma_wgmma|v7norescale|90a|o_acc[4 * d + 2 * half] *= correction;|;"
  "v7_tma_wgmma|v7nonorm|90a|inverse[half] = 1.0f / total;|inverse[half] = 1.0f;"
  "v8_warp_specialized|v8nomask|90a|if (last_tile_keys < kBlockN) {|if (false) {"
  "v8_warp_specialized|v8norescale|90a|o_acc[4 * d + 2 * half] *= correction[half];|;"
  "v8_warp_specialized|v8nonorm|90a|inverse[half] = 1.0f / total;|inverse[half] = 1.0f;"
)

mkdir -p "$out"
objects=() ids=()
for bug in "${bugs[@]}"; do
  IFS='|' read -r folder id arch shipped planted <<< "$bug"
  ids+=("$id")
  [ "$run" = 2 ] && continue
  source_file=$(ls "$repo"/steps/"$folder"/*.cu)
  grep -qF -- "$shipped" "$source_file" ||
    { echo "plant-bugs.sh: $source_file no longer has the line '$shipped'; update this script" >&2; exit 3; }
  # Replace the first occurrence only: one bug per copy.
  awk -v shipped="$shipped" -v planted="$planted" '
    !done && index($0, shipped) { i = index($0, shipped); $0 = substr($0, 1, i - 1) planted substr($0, i + length(shipped)); done = 1 }
    { print }' "$source_file" > "$out/$id.cu"
  cmp -s "$source_file" "$out/$id.cu" && { echo "plant-bugs.sh: planting $id changed nothing" >&2; exit 3; }
  echo "plant-bugs.sh: compiling $id"
  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode "arch=compute_$arch,code=sm_$arch" \
    -I"$repo/common" -I"$repo/steps" -DATTN_STEP_ID="\"$id\"" -c "$out/$id.cu" -o "$out/$id.o"
  objects+=("$out/$id.o")
done
ids_list=$(IFS=,; echo "${ids[*]}")
if [ "$run" != 2 ]; then
  nvcc -o "$out/bench_planted" "${harness[0]}" "${objects[@]}" "${harness[1]}" "${harness[2]}" -lcublas -lpthread
  rm -f "$out"/*.o
  echo "plant-bugs.sh: wrote $out/bench_planted ($ids_list)"
fi
[ "$run" != 0 ] || exit 0

csv="$out/planted.csv"
"$out/bench_planted" --steps "$ids_list" --tokens 65,577,1025 --batch 2 --heads 3 --check full \
  --iters 1 --warmup 0 --csv "$csv" || true
status_column=$(head -n 1 "$csv" | tr ',' '\n' | grep -nx status | cut -d: -f1)
missed=0
for id in "${ids[@]}"; do
  failed_at=$(awk -F, -v id="$id" -v column="$status_column" \
    'NR > 1 && $1 == id && $column == "failed" { printf "%s%s", (n++ ? "," : ""), $4 }' "$csv")
  if [ -n "$failed_at" ]; then
    echo "plant-bugs.sh: $id caught: its check failed at N = $failed_at"
  else
    echo "plant-bugs.sh: $id NOT caught: its check passed at every N"
    missed=$((missed + 1))
  fi
done
echo "plant-bugs.sh: $(( ${#ids[@]} - missed )) of ${#ids[@]} planted bugs caught (all must be)"
[ "$missed" -eq 0 ]
