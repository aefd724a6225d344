# Causal D = 128 tiles for step 8: the shipped 160-key tiles against 144, 128 and 112 keys.
O=$OUT/c7; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $O/times.txt
$B/new/step8 --batch 8 --heads 16 --tokens 4097 --head-dim 128 --causal --check none --iters 300 --warmup 300 --no-ceilings > /dev/null 2>&1
for r in 1 2 3 4; do
  vs="new c128_144_2_1 c128_128_2_2 c128_112_2_2"; [ $((r % 2)) = 0 ] && vs="c128_112_2_2 c128_128_2_2 c128_144_2_1 new"
  for dt in fp16 bf16; do for v in $vs; do echo -n "$v " >> $O/d128.txt
    $B/$v/step8 --batch 8 --heads 16 --tokens 4097 --head-dim 128 --causal --dtype $dt --check none --format json --iters 50 --no-ceilings >> $O/d128.txt 2>&1
  done; done
done
date -u >> $O/times.txt
cd $OUT && tar czf c7.tgz c7 && rm -rf c7
