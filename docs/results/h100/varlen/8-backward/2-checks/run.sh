#!/usr/bin/env bash
# v10 on packed sequences, second round: the backward suite (the packed case with the fp64
# reference's packed mask), two planted bugs, the checked build, the sanitizer (no ceilings), the
# operator's gradients, and the packed mix timed in parts.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
S=stage/p10
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt; date -u >> $O/gpu.txt
(ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $O/op_build.log 2>&1; echo "op rc=$?" >> $O/runs.txt) &
timeout 150 $S/gpu_tests --step=v10 -ts=backward -tc="packed*" > $O/v10_packed.log 2>&1; echo "packed suite rc=$?" >> $O/runs.txt
for id in v10packedrowsseen v10packedlongestkeys; do
  timeout 100 $S/planted/gpu_tests_$id --step=v10 -ts=backward -tc="packed*" --abort-after=1 > $O/planted_$id.log 2>&1; echo "planted $id rc=$? (nonzero: caught)" >> $O/runs.txt
done
timeout 150 $S/checked/gpu_tests --step=v10 -ts=backward -tc="packed*" > $O/v10_packed_checked.log 2>&1; echo "checked packed rc=$?" >> $O/runs.txt
for tool in memcheck racecheck; do
  for flags in "--head-dim 64" "--head-dim 80 --causal --deterministic" "--head-dim 128 --dtype bf16"; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 86 $S/step10 --lengths 1,129,0,65,200 --heads 2 $flags --iters 1 --warmup 0 --check full --no-ceilings >> $O/sanitizer.log 2>&1; echo "$tool $flags rc=$?" >> $O/runs.txt
  done
done
L197=$(printf '197,%.0s' $(seq 16)); L577=$(printf '577,%.0s' $(seq 16))
for round in 1 2 3; do
  for lengths in "${L197%,}" "${L577%,}" "${L197}${L577%,}"; do
    echo "round=$round $($S/step10 --lengths $lengths --heads 12 --head-dim 64 --check none --format json --iters 30 --no-ceilings 2>&1 | tr -d '\n')" >> $O/parts.txt
  done
done
wait
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
timeout 150 python3 tests/python/test_varlen.py > $O/test_varlen.log 2>&1; echo "test_varlen rc=$?" >> $O/runs.txt
timeout 200 $S/gpu_tests --step=v10 -ts=backward -tce="packed*" > $O/v10_rest.log 2>&1; echo "rest of backward suite rc=$?" >> $O/runs.txt
cd $O && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name runs.txt -delete; echo done
