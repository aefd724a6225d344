#!/usr/bin/env bash
# v10 on packed sequences: its GPU suite case, the CLI, the sanitizer, same-process A/B of the
# unpacked kernels against HEAD's step10, the operator's packed gradients, and packed against
# padded backwards.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
S=stage/p10
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $O/gpu.txt; date -u >> $O/gpu.txt
(ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $O/op_build.log 2>&1; echo "op rc=$?" >> $O/runs.txt) &
timeout 200 $S/gpu_tests --step=v10 -ts=backward -tc="packed*" > $O/v10_packed.log 2>&1; echo "packed suite rc=$?" >> $O/runs.txt
for len in "197,577,50" "1,129,0,65,128,127"; do
  $S/step10 --lengths $len --heads 12 --head-dim 64 --check full > $O/cli_$len.txt 2>&1; echo "cli $len rc=$?" >> $O/runs.txt
  $S/step10 --lengths $len --heads 4 --head-dim 128 --causal --deterministic --dtype bf16 --check full >> $O/cli_$len.txt 2>&1; echo "cli det $len rc=$?" >> $O/runs.txt
done
timeout 120 compute-sanitizer --tool memcheck $S/step10 --lengths 1,129,0,65,200 --heads 2 --head-dim 64 --iters 1 --warmup 0 > $O/memcheck.txt 2>&1; echo "memcheck rc=$?" >> $O/runs.txt
timeout 120 compute-sanitizer --tool memcheck $S/step10 --lengths 1,129,0,65,200 --heads 2 --head-dim 80 --causal --deterministic --iters 1 --warmup 0 >> $O/memcheck.txt 2>&1; echo "memcheck2 rc=$?" >> $O/runs.txt
timeout 150 compute-sanitizer --tool racecheck $S/step10 --lengths 1,129,0,65 --heads 1 --head-dim 64 --iters 1 --warmup 0 --check none > $O/racecheck.txt 2>&1; echo "racecheck rc=$?" >> $O/runs.txt
run() { echo "round=$1 bin=$2 ${*:3} $(./$2 ${@:3} --check none --format json --iters 30 --no-ceilings 2>&1 | tr -d '\n')"; }
for round in 1 2 3; do
  for shape in "32 12 197 64" "32 12 577 64" "8 12 4097 64" "8 16 4097 128" "32 16 257 80"; do
    set -- $shape
    for b in $S/old_step10 $S/step10; do run $round $b --batch $1 --heads $2 --tokens $3 --head-dim $4 >> $O/ab.txt; done
  done
  for b in $S/old_step10 $S/step10; do run $round $b --batch 8 --heads 16 --tokens 4097 --head-dim 128 --causal >> $O/ab.txt; done
done
wait
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
timeout 200 python3 tests/python/test_varlen.py > $O/test_varlen.log 2>&1; echo "test_varlen rc=$?" >> $O/runs.txt
timeout 150 python3 scripts/compare_varlen.py --backward --out $O/varlen_backward_fp16.csv > $O/varlen_backward_fp16.log 2>&1; echo "compare bwd rc=$?" >> $O/runs.txt
cd $O && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name runs.txt -delete; echo done
