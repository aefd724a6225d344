#!/usr/bin/env bash
# On an H100: packed against padded backwards (fp16 repeated, bf16), the packed mix in parts,
# vit_b_16 trained one step on packed images, and the operator's suites.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}; mkdir -p $O
S=stage/p10
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt; date -u >> $O/gpu.txt
(ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $O/op_build.log 2>&1; echo "op rc=$?" >> $O/runs.txt) &
L197=$(printf '197,%.0s' $(seq 16)); L577=$(printf '577,%.0s' $(seq 16))
for round in 1 2 3; do
  for lengths in "${L197%,}" "${L577%,}" "${L197}${L577%,}"; do
    echo "round=$round $($S/step10 --lengths $lengths --heads 12 --head-dim 64 --check none --format json --iters 30 --no-ceilings 2>&1 | tr -d '\n')" >> $O/parts.txt
  done
done
wait
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python:$PWD/scripts ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
for dtype in fp16 bf16; do
  timeout 170 python3 scripts/compare_varlen.py --backward --dtype $dtype --out $O/varlen_backward_$dtype.csv > $O/varlen_backward_$dtype.log 2>&1; echo "compare bwd $dtype rc=$?" >> $O/runs.txt
done
timeout 120 python3 scripts/varlen_vit.py --out $O/varlen_vit.csv > $O/varlen_vit.log 2>&1; echo "varlen_vit rc=$?" >> $O/runs.txt
for t in test_varlen test_torch_op; do timeout 120 python3 tests/python/$t.py > $O/$t.log 2>&1; echo "$t rc=$?" >> $O/runs.txt; done
cd $O && tar czf all.tgz * && find . -type f ! -name all.tgz ! -name runs.txt -delete; echo done
