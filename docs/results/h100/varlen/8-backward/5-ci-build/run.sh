#!/usr/bin/env bash
# The clean-clone CI build of ba6dedf (every step, sm_75-90): the backward suites of step 9 and
# of the eager backward on the changed harness, and every step's packed case.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
S=stage/ci3
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt; date -u >> $O/gpu.txt
for step in v9 eager_backward; do
  timeout 240 $S/gpu_tests --step=$step -ts=backward > $O/backward_$step.log 2>&1; echo "backward $step rc=$?" >> $O/runs.txt
done
for step in v0 v6 v9 v10; do
  timeout 60 $S/gpu_tests --step=$step -tc="packed*" > $O/packed_$step.log 2>&1; echo "packed $step rc=$?" >> $O/runs.txt
done
cd $O && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name runs.txt -delete; echo done
