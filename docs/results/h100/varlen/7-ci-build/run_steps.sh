#!/bin/bash
# The clean-clone CI build (all steps, sm_75-90): every step's packed test case (the refusal of
# --lengths where a step takes none), and the operator's full suite on the library of ABI 9.
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
S=stage/ci
for step in v0 v1 v2 v3 v4 v5 v6 v7 v8 v9 v10 eager eager_backward; do
  timeout 200 $S/gpu_tests --step=$step -tc="packed*" > $R/packed_$step.log 2>&1; echo "$step rc $? $(grep 'test cases' $R/packed_$step.log)"
done
cd $OUT && tar czf all.tgz r && rm -rf r
