#!/bin/bash
# GPU check 1 of packed sequences in step 8: the new tests, the v8 suite, sanitizer, timings.
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
date -u > $R/date.txt
export ATTN_TEST_PERSISTENT_BLOCKS=
timeout 200 ./gpu_tests --step=v8 -tc="packed*" > $R/packed_tests.log 2>&1; echo "rc $?" >> $R/packed_tests.log
tail -5 $R/packed_tests.log
L=197,577,50,1025,1,65,129
timeout 120 compute-sanitizer --tool memcheck ./step8 --lengths $L --heads 3 --check full --no-ceilings --iters 1 --warmup 0 > $R/memcheck.log 2>&1; echo "rc $?" >> $R/memcheck.log
timeout 120 compute-sanitizer --tool racecheck ./step8 --lengths $L --heads 3 --check full --no-ceilings --iters 1 --warmup 0 --causal > $R/racecheck.log 2>&1; echo "rc $?" >> $R/racecheck.log
tail -3 $R/memcheck.log $R/racecheck.log
# Non-packed speed, new against the committed step 8, alternating
for round in 1 2; do
for shape in "--batch 32 --heads 12 --tokens 197 --head-dim 64" "--batch 8 --heads 16 --tokens 4097 --head-dim 128" "--batch 32 --heads 16 --tokens 257 --head-dim 80"; do
  for bin in base new; do
    if [ $bin = base ]; then B=./step8_base; else B=./step8; fi
    echo "$round $bin $shape $($B $shape --check none --format json --iters 30 --no-ceilings | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["median_us"], r["min_us"], r["max_us"])')" >> $R/ab.txt
  done
done
done
cat $R/ab.txt
# Packed against padded: a mix of ViT images (patch 16: 224 197, 384 577, 512 1025, 768 2305, 1024 4097)
MIX=197,197,197,197,197,197,197,197,577,577,577,577,577,577,577,577,1025,1025,1025,1025,2305,2305,4097
for d in "12 64" "16 80" "16 128"; do set -- $d
  ./step8 --lengths $MIX --heads $1 --head-dim $2 --check sample --format json --iters 30 --no-ceilings > $R/packed_h$1_d$2.json 2>&1
  ./step8 --batch 23 --tokens 4097 --key-padding --heads $1 --head-dim $2 --check none --format json --iters 30 --no-ceilings > $R/padded_h$1_d$2.json 2>&1
done
grep -h -o '"tokens": [0-9]*\|"median_us": [0-9.e+]*\|"tflops": [0-9.e+]*\|"status": "[a-z ]*"' $R/*_h*.json | paste - - - - 
cd $OUT && tar czf all.tgz r && rm -rf r
