# v10 with dQ written by the block that completes its sum, third form (a thread of warp 1 counts
# the landed adds, its result read a Q tile later): suites, checked build, sanitizer, planted, A/B.
t0=$(date +%s)
O=$OUT/c13; mkdir -p $O/san $O/planted; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
timeout 150 $B/gpu_tests --step=v10 > $O/gpu_v10.log 2>&1; echo "gpu v10 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
timeout 150 $B/checked/gpu_tests --step=v10 > $O/checked_v10.log 2>&1; echo "checked v10 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export ATTN_SANITIZER_LOGS=$O/san ATTN_SANITIZER_RESULTS=$O/sanitizer.txt SANITIZER_TIMEOUT_S=60
{ bash tests/sanitize.sh memcheck $B/step10 d64_130 --batch 2 --heads 3 --tokens 130 --head-dim 64
  bash tests/sanitize.sh memcheck $B/step10 d64_130_causal --batch 2 --heads 3 --tokens 130 --head-dim 64 --causal
  bash tests/sanitize.sh memcheck $B/step10 d64_130_det --batch 2 --heads 3 --tokens 130 --head-dim 64 --deterministic
  bash tests/sanitize.sh memcheck $B/step10 d128_130_causal_det --batch 2 --heads 3 --tokens 130 --head-dim 128 --causal --deterministic
  bash tests/sanitize.sh racecheck $B/step10 d64_197 --batch 1 --heads 2 --tokens 197 --head-dim 64
  bash tests/sanitize.sh racecheck $B/step10 d128_197_causal --batch 1 --heads 2 --tokens 197 --head-dim 128 --causal
} >> $O/sanitizer.log 2>&1
echo "sanitizer $(( $(date +%s) - t0 )) s" >> $O/times.txt
P=$B/planted
for bug in v10dqwriteearly v10dqaddsunmasked v10nostagingwait v10dqsumhalfzeroed; do
  tc="*"; [ $bug = v10dqaddsunmasked ] && tc="*causal*"
  timeout 60 $P/gpu_tests_planted --step=$bug -tc="$tc" --abort-after=1 > $O/planted/$bug.normal.log 2>&1; rn=$?
  timeout 60 $P/gpu_tests_planted_checked --step=${bug}_checked -tc="$tc" --abort-after=1 > $O/planted/$bug.checked.log 2>&1; rc=$?
  rule=$(grep -aoE "pipeline rule [a-z-]+" $O/planted/$bug.checked.log | head -1)
  echo "$bug: tests '$tc', normal build rc=$rn; checked build rc=$rc ${rule:-(no rule named)}" >> $O/planted.txt
done
echo "planted $(( $(date +%s) - t0 )) s" >> $O/times.txt
shapes=("32 12 197 64" "32 12 577 64" "32 12 1025 64" "8 12 4097 64" "8 16 4097 128" "8 12 4097 64 --causal" "8 16 4097 128 --causal" "32 12 1025 64 --deterministic" "8 16 4097 128 --causal --dtype bf16")
for r in 1 2 3; do
  order="step10_old step10 step10_nocount"; [ $r = 2 ] && order="step10_nocount step10 step10_old"
  for s in "${shapes[@]}"; do set -- $s; b=$1 h=$2 n=$3 d=$4; shift 4
    for bin in $order; do echo -n "$bin $b,$h,$n,$d $* " >> $O/ab.txt
      $B/$bin --batch $b --heads $h --tokens $n --head-dim $d "$@" --check none --format json --iters 50 --no-ceilings >> $O/ab.txt 2>&1
    done; done
  echo "ab round $r $(( $(date +%s) - t0 )) s" >> $O/times.txt
  [ $(( $(date +%s) - t0 )) -gt 520 ] && break
done
cd $OUT && tar czf c13.tgz c13 && rm -rf c13
