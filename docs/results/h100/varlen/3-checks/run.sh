#!/bin/bash
# GPU check 3: the packed suite on the longest-first walk, the checked build, the planted bugs,
# the sanitizer, and the seeded mix at each head dim.
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
S=stage/vl
timeout 170 $S/gpu_tests --step=v8 -tc="packed*" > $R/packed_tests.log 2>&1; echo "rc $?" >> $R/packed_tests.log
tail -4 $R/packed_tests.log
timeout 150 $S/gpu_tests_checked --step=v8 -tc="packed*" > $R/packed_tests_checked.log 2>&1; echo "rc $?" >> $R/packed_tests_checked.log
tail -4 $R/packed_tests_checked.log
L=197,577,50,1025,1,65,129
for bug in v8packedlongestkeys v8packedrowsunbounded; do
  timeout 60 $S/step8_$bug --lengths $L --heads 3 --check full --no-ceilings --iters 1 > $R/planted_$bug.log 2>&1; echo "rc $? (1: the check caught it)" >> $R/planted_$bug.log
  tail -3 $R/planted_$bug.log
done
timeout 100 compute-sanitizer --tool memcheck $S/step8 --lengths $L --heads 3 --check full --no-ceilings --iters 1 --warmup 0 --causal > $R/memcheck.log 2>&1; echo "rc $?" >> $R/memcheck.log
timeout 100 compute-sanitizer --tool racecheck $S/step8 --lengths $L --heads 3 --check full --no-ceilings --iters 1 --warmup 0 > $R/racecheck.log 2>&1; echo "rc $?" >> $R/racecheck.log
tail -n 2 $R/memcheck.log $R/racecheck.log
SEEDED=442,1157,2117,2117,3026,401,785,2705,2810,2402,1601,4097,2501,2402,3601,3970,3970,2026,3845,3970,2602,1765,842,197,2810,362,442,1025,401,1765,197,3250
for d in 64 80 96 128; do
  $S/step8 --lengths $SEEDED --heads 16 --head-dim $d --check none --format json --iters 20 --no-ceilings > $R/seeded_d$d.json 2>&1
  $S/step8 --batch 32 --tokens 4097 --key-padding --heads 16 --head-dim $d --check none --format json --iters 20 --no-ceilings > $R/seeded_padded_d$d.json 2>&1
done
grep -H -o '"median_us": [0-9.e+]*\|"tflops": [0-9.e+]*' $R/seeded*.json | paste - -
cd $OUT && tar czf all.tgz r && rm -rf r
