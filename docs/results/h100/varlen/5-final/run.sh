#!/bin/bash
# GPU check 5: the rest of the v8 suite, the checked build's packed test, the comparison repeated,
# the ViT example.
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
S=stage/vl
timeout 120 $S/gpu_tests_checked --step=v8 -tc="packed*" > $R/packed_tests_checked.log 2>&1; echo "rc $?" >> $R/packed_tests_checked.log
tail -3 $R/packed_tests_checked.log
MIX=197,197,197,197,197,197,197,197,577,577,577,577,577,577,577,577,1025,1025,1025,1025,2305,2305,4097
for d in "12 64" "16 80" "16 128"; do set -- $d
  $S/step8 --lengths $MIX --heads $1 --head-dim $2 --check none --format json --iters 30 --no-ceilings > $R/packed_h$1_d$2.json 2>&1
done
grep -H -o '"median_us": [0-9.e+]*\|"min_us": [0-9.e+]*\|"max_us": [0-9.e+]*' $R/packed_h*.json | paste - - -
ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $R/pip.log 2>&1; echo "pip rc $?"
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
timeout 150 python3 scripts/compare_varlen.py --out $R/varlen.csv > $R/compare_varlen.log 2>&1; echo "compare rc $?" >> $R/compare_varlen.log
cat $R/compare_varlen.log
timeout 90 python3 scripts/varlen_vit.py --out $R/varlen_vit.csv > $R/varlen_vit.log 2>&1; echo "vit rc $?" >> $R/varlen_vit.log
cat $R/varlen_vit.log
timeout 260 $S/gpu_tests --step=v8 -tce="packed*" > $R/gpu_v8_rest.log 2>&1; echo "rc $?" >> $R/gpu_v8_rest.log
tail -4 $R/gpu_v8_rest.log
cd $OUT && tar czf all.tgz r && rm -rf r
