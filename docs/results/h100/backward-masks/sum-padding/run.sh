# #31: v10 leaves the dQ sum's padding columns (D = 80, 96) unzeroed and unread. The suite, three
# planted bugs on the sum, A/B against 2a7f982's v10 (two rounds, alternating).
t0=$(date +%s)
O=$OUT/c20; mkdir -p $O/planted; B=stage/exp; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
timeout 170 $B/gpu_tests --step=v10 > $O/gpu_v10.log 2>&1; echo "gpu v10 rc=$? $(el) s" >> $O/times.txt
for bug in v10dqsumhalfzeroed v10dqpastd v10dqpieceshort; do
  timeout 60 $B/planted/gpu_tests_planted --step=$bug --abort-after=1 > $O/planted/$bug.normal.log 2>&1; rn=$?
  timeout 60 $B/planted/gpu_tests_planted_checked --step=${bug}_checked --abort-after=1 > $O/planted/$bug.checked.log 2>&1; rc=$?
  echo "$bug: whole suite, normal build rc=$rn; checked build rc=$rc" >> $O/planted.txt
done
echo "planted $(el) s" >> $O/times.txt
for r in 1 2; do
  order="step10_head step10_skip"; [ $r = 2 ] && order="step10_skip step10_head"
  for s in "32 16 257 80" "8 16 4097 80" "32 12 197 96" "8 12 4097 96" "32 12 197 64"; do
    set -- $s
    for bin in $order; do echo -n "$bin $1,$2,$3,$4 " >> $O/ab.txt
      $B/$bin --batch $1 --heads $2 --tokens $3 --head-dim $4 --check none --format json --iters 30 --no-ceilings >> $O/ab.txt 2>&1
    done; done
  echo "ab round $r ($order) $(el) s" >> $O/times.txt
done
cd $OUT && tar czf c20.tgz c20 && rm -rf c20
