# v10's dQ written by the block that completes its sum, second form (the add two back counted, so
# no wait for the newest to land): A/B against 359a04c's binary, the first form and the second
# without its dQ write (a timing control only: its dQ is wrong), three rounds alternating.
t0=$(date +%s)
O=$OUT/c11; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
shapes=("32 12 197 64" "32 12 577 64" "32 12 1025 64" "8 12 4097 64" "8 16 4097 128" "8 12 4097 64 --causal" "8 16 4097 128 --causal")
for r in 1 2 3; do
  order="step10_old step10 step10_first step10_nowrite"; [ $r = 2 ] && order="step10_nowrite step10_first step10 step10_old"
  for s in "${shapes[@]}"; do set -- $s; b=$1 h=$2 n=$3 d=$4; shift 4
    for bin in $order; do echo -n "$bin $b,$h,$n,$d $* " >> $O/ab.txt
      $B/$bin --batch $b --heads $h --tokens $n --head-dim $d "$@" --check none --format json --iters 50 --no-ceilings >> $O/ab.txt 2>&1
    done; done
  echo "ab round $r $(( $(date +%s) - t0 )) s" >> $O/times.txt
done
cd $OUT && tar czf c11.tgz c11 && rm -rf c11
