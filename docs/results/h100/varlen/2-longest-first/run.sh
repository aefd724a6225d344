#!/bin/bash
# GPU check 2: the longest-first walk for packed sequences; the operator and its tests; the
# packed-against-padded comparison; the whole v8 suite.
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
S=stage/vl
MIX=197,197,197,197,197,197,197,197,577,577,577,577,577,577,577,577,1025,1025,1025,1025,2305,2305,4097
for d in "12 64" "16 80" "16 128"; do set -- $d
  $S/step8 --lengths $MIX --heads $1 --head-dim $2 --check sample --format json --iters 30 --no-ceilings > $R/packed_h$1_d$2.json 2>&1
  $S/step8 --batch 23 --tokens 4097 --key-padding --heads $1 --head-dim $2 --check none --format json --iters 30 --no-ceilings > $R/padded_h$1_d$2.json 2>&1
done
grep -h -o '"tokens": [0-9]*\|"median_us": [0-9.e+]*\|"tflops": [0-9.e+]*\|"status": "[a-z ]*"' $R/*_h*.json | paste - - - -
ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $R/pip.log 2>&1; echo "pip rc $?"
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
timeout 200 python3 tests/python/test_varlen.py > $R/test_varlen.log 2>&1; echo "varlen rc $?" >> $R/test_varlen.log
tail -25 $R/test_varlen.log
timeout 150 python3 scripts/compare_varlen.py --out $R/varlen.csv > $R/compare_varlen.log 2>&1; echo "compare rc $?" >> $R/compare_varlen.log
cat $R/compare_varlen.log | tail -30
timeout 240 $S/gpu_tests --step=v8 > $R/gpu_v8.log 2>&1; echo "rc $?" >> $R/gpu_v8.log
tail -4 $R/gpu_v8.log
cd $OUT && tar czf all.tgz r && rm -rf r
