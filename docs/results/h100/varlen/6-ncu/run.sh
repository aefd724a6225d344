#!/bin/bash
# ncu: the packed kernel (the walk shipped) against the same images padded, seeded mix, D = 80.
cd "$(dirname "$0")/../.."
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; date -u > $R/date.txt
S=stage/vl
SEEDED=442,1157,2117,2117,3026,401,785,2705,2810,2402,1601,4097,2501,2402,3601,3970,3970,2026,3845,3970,2602,1765,842,197,2810,362,442,1025,401,1765,197,3250
for d in 80 128; do
  timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:warp_specialized --launch-skip 3 --launch-count 1 --csv \
    $S/step8 --lengths $SEEDED --heads 16 --head-dim $d --check none --iters 3 --warmup 1 --no-ceilings > $R/ncu_packed_d$d.csv 2> $R/ncu_packed_d$d.err
  timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:warp_specialized --launch-skip 3 --launch-count 1 --csv \
    $S/step8 --batch 32 --tokens 4097 --key-padding --heads 16 --head-dim $d --check none --iters 3 --warmup 1 --no-ceilings > $R/ncu_padded_d$d.csv 2> $R/ncu_padded_d$d.err
done
for f in $R/ncu_*.csv; do echo "== $f"; grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Hit Rate|L1/TEX Hit Rate)"' $f | awk -F'","' '{print $(NF-2), $(NF-1), $NF}'; done
cd $OUT && tar czf all.tgz r && rm -rf r
