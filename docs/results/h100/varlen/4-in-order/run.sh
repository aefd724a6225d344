#!/bin/bash
# GPU check 4: the walk of the row tiles that exist (PackedScheduler): the packed suite, the
# sanitizer, the operator's tests, the comparison with padded batches, the ViT example.
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
S=stage/vl
timeout 170 $S/gpu_tests --step=v8 -tc="packed*,persistent*" > $R/packed_tests.log 2>&1; echo "rc $?" >> $R/packed_tests.log
tail -4 $R/packed_tests.log
L=65,1,130,17,129,0,64
timeout 100 compute-sanitizer --tool memcheck $S/step8 --lengths $L --heads 2 --check full --no-ceilings --iters 1 --warmup 0 > $R/memcheck.log 2>&1; echo "rc $?" >> $R/memcheck.log
timeout 100 compute-sanitizer --tool racecheck $S/step8 --lengths $L --heads 2 --check full --no-ceilings --iters 1 --warmup 0 > $R/racecheck.log 2>&1; echo "rc $?" >> $R/racecheck.log
timeout 100 compute-sanitizer --tool racecheck $S/step8 --lengths $L --heads 2 --check full --no-ceilings --iters 1 --warmup 0 --causal > $R/racecheck_causal.log 2>&1; echo "rc $?" >> $R/racecheck_causal.log
tail -n 2 $R/memcheck.log $R/racecheck.log $R/racecheck_causal.log
SEEDED=442,1157,2117,2117,3026,401,785,2705,2810,2402,1601,4097,2501,2402,3601,3970,3970,2026,3845,3970,2602,1765,842,197,2810,362,442,1025,401,1765,197,3250
for d in 64 80 96 128; do
  $S/step8 --lengths $SEEDED --heads 16 --head-dim $d --check none --format json --iters 20 --no-ceilings > $R/seeded_d$d.json 2>&1
done
grep -H -o '"median_us": [0-9.e+]*\|"tflops": [0-9.e+]*' $R/seeded*.json | paste - -
ATTENTION_STEPS_BUILD_DIR=$S/lib python3 -m pip install --no-build-isolation --no-deps --target /tmp/site ./python > $R/pip.log 2>&1; echo "pip rc $?"
cp /tmp/site/attention_steps/_operator*.so python/attention_steps/
export PYTHONPATH=$PWD/python:$PWD/tests/python ATTENTION_STEPS_LIBRARY=$PWD/$S/lib/libattention_steps.so
timeout 120 python3 tests/python/test_varlen.py > $R/test_varlen.log 2>&1; echo "varlen rc $?" >> $R/test_varlen.log
tail -4 $R/test_varlen.log
timeout 150 python3 scripts/compare_varlen.py --out $R/varlen.csv > $R/compare_varlen.log 2>&1; echo "compare rc $?" >> $R/compare_varlen.log
cat $R/compare_varlen.log
timeout 90 python3 scripts/varlen_vit.py --out $R/varlen_vit.csv > $R/varlen_vit.log 2>&1; echo "vit rc $?" >> $R/varlen_vit.log
cat $R/varlen_vit.log
cd $OUT && tar czf all.tgz r && rm -rf r
