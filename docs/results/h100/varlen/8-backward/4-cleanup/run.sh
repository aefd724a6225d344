#!/usr/bin/env bash
# After the clean-up (shared helpers for the packed tests, the operator's and the C ABI's backward
# calls): the packed cases forward and backward, the deterministic cases, the operator's suites.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
S=stage/p10
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt; date -u >> $O/gpu.txt
(ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $O/op_build.log 2>&1; echo "op rc=$?" >> $O/runs.txt) &
timeout 150 $S/gpu_tests --step=v8 -tc="packed*" > $O/v8_packed.log 2>&1; echo "v8 packed rc=$?" >> $O/runs.txt
timeout 200 $S/gpu_tests --step=v10 -ts=backward -tc="packed*,deterministic*" > $O/v10_packed_deterministic.log 2>&1; echo "v10 packed+deterministic rc=$?" >> $O/runs.txt
wait
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python:$PWD/scripts ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
for t in test_varlen test_torch_op test_backward_masks; do timeout 150 python3 tests/python/$t.py > $O/$t.log 2>&1; echo "$t rc=$?" >> $O/runs.txt; done
cd $O && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name runs.txt -delete; echo done
