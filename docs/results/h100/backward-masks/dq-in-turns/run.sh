# #31: D = 80 and 96 in 96-column tiles, dQ computed by the consumers in turns. The suite in both
# builds, the sanitizer at D = 80, three planted bugs on the dQ sum, A/B against 17b2b6b's
# v10 (the tiles of 128), then the training path at ViT-H's shape.
t0=$(date +%s)
O=$OUT/c23; mkdir -p $O/planted $O/san; B=stage/exp; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
timeout 150 $B/gpu_tests --step=v10 > $O/gpu_v10.log 2>&1; echo "gpu v10 rc=$? $(el) s" >> $O/times.txt
for r in 1 2; do
  order="step10_pad128 step10_turns"; [ $r = 2 ] && order="step10_turns step10_pad128"
  for s in "32 16 257 80" "8 16 4097 80" "32 12 197 96" "8 12 4097 96" "32 12 197 64" "8 16 4097 128"; do
    set -- $s
    for bin in $order; do echo -n "$bin $1,$2,$3,$4 " >> $O/ab.txt
      $B/$bin --batch $1 --heads $2 --tokens $3 --head-dim $4 --check none --format json --iters 30 --no-ceilings >> $O/ab.txt 2>&1
    done; done
  echo "ab round $r ($order) $(el) s" >> $O/times.txt
done
for bug in v10dqsumhalfzeroed v10dqpastd v10dqpieceshort; do
  timeout 40 $B/planted/gpu_tests_planted --step=$bug --abort-after=1 > $O/planted/$bug.normal.log 2>&1; rn=$?
  timeout 40 $B/planted/gpu_tests_planted_checked --step=${bug}_checked --abort-after=1 > $O/planted/$bug.checked.log 2>&1; rc=$?
  echo "$bug: whole suite, normal build rc=$rn; checked build rc=$rc" >> $O/planted.txt
done
echo "planted $(el) s" >> $O/times.txt
export ATTN_SANITIZER_LOGS=$O/san ATTN_SANITIZER_RESULTS=$O/sanitizer.txt SANITIZER_TIMEOUT_S=60
for tool in memcheck racecheck; do
  bash tests/sanitize.sh $tool $B/step10_turns d80_cross_pad --batch 2 --heads 3 --tokens 130 --kv-tokens 77 --head-dim 80 --key-padding
  bash tests/sanitize.sh $tool $B/step10_turns d96_det --batch 2 --heads 3 --tokens 197 --head-dim 96 --deterministic
done >> $O/sanitizer.log 2>&1
echo "sanitizer $(el) s" >> $O/times.txt
left=$(( 560 - $(el) ))
[ $left -gt 60 ] && { timeout $left $B/checked/gpu_tests --step=v10 > $O/checked_v10.log 2>&1; echo "checked v10 rc=$? $(el) s" >> $O/times.txt; }
cd $OUT && tar czf c23.tgz c23 && rm -rf c23
