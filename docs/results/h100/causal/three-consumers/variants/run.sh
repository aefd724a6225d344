# Tile variants for causal v8 (D128, D64), v10 causal group sizes, non-causal old vs new at the seven shapes.
t0=$(date +%s)
O=$OUT/c2; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $O/times.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 > $O/smi.csv 2>&1 &
smi=$!
run() { # file variant step args...
  f=$1; v=$2; s=$3; shift 3; echo -n "$v " >> $O/$f
  $B/$v/$s "$@" --check none --format json --no-ceilings >> $O/$f 2>&1
}
$B/new/step8 --batch 8 --heads 12 --tokens 4097 --head-dim 64 --check none --iters 400 --warmup 300 --no-ceilings > /dev/null 2>&1
for r in 1 2 3; do
  vs="new c128_176 c128_80_2_2_3 c128_96_2_1_3 c128_64_2_2_3"; [ $r = 2 ] && vs="c128_64_2_2_3 c128_96_2_1_3 c128_80_2_2_3 c128_176 new"
  for v in $vs; do run d128.txt $v step8 --batch 8 --heads 16 --tokens 4097 --head-dim 128 --causal --iters 50; done
  vs="new c64_128_3_2_3 old"; [ $r = 2 ] && vs="old c64_128_3_2_3 new"
  for v in $vs; do run d64.txt $v step8 --batch 8 --heads 12 --tokens 4097 --head-dim 64 --causal --iters 50; done
  vs="new g2 g8 old"; [ $r = 2 ] && vs="old g8 g2 new"
  for v in $vs; do run bwd.txt $v step10 --batch 8 --heads 16 --tokens 4097 --head-dim 128 --causal --iters 30
                   run bwd.txt $v step10 --batch 8 --heads 12 --tokens 4097 --head-dim 64 --causal --iters 30; done
done
echo "variants $(( $(date +%s) - t0 )) s" >> $O/times.txt
for r in 1 2 3; do
  vs="old new"; [ $r = 2 ] && vs="new old"
  for s in "32 12 197 64 200" "32 12 577 64 200" "32 12 1025 64 100" "8 12 4097 64 50" "8 16 4097 128 30" "32 16 257 80 200" "1 8 1050 32 300"; do set -- $s
    for v in $vs; do run nc_fwd.txt $v step8 --batch $1 --heads $2 --tokens $3 --head-dim $4 --iters $5; done
    if [ $4 = 64 ] || [ $4 = 128 ]; then
      for v in $vs; do run nc_bwd.txt $v step10 --batch $1 --heads $2 --tokens $3 --head-dim $4 --iters $(( $5 / 2 + 5 )); done
    fi
  done
done
kill $smi; echo "done $(( $(date +%s) - t0 )) s" >> $O/times.txt
cd $OUT && tar czf c2.tgz c2 && rm -rf c2
