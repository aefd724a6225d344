# Which part of the fused dQ write costs: v10 new, without the proxy fence, without the count,
# without the wait for the add before last, with bar.sync for bar.red; against 359a04c's binary.
O=$OUT/c12; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
shapes=("32 12 197 64" "32 12 1025 64" "8 12 4097 64 --causal" "8 16 4097 128 --causal")
for r in 1 2; do
  order="step10_old step10 step10_v_nofence step10_v_nocount step10_v_nowait1 step10_v_nored"
  [ $r = 2 ] && order="step10_v_nored step10_v_nowait1 step10_v_nocount step10_v_nofence step10 step10_old"
  for s in "${shapes[@]}"; do set -- $s; b=$1 h=$2 n=$3 d=$4; shift 4
    for bin in $order; do echo -n "$bin $b,$h,$n,$d $* " >> $O/ab.txt
      $B/$bin --batch $b --heads $h --tokens $n --head-dim $d "$@" --check none --format json --iters 40 --no-ceilings >> $O/ab.txt 2>&1
    done; done
done
date -u >> $O/times.txt
cd $OUT && tar czf c12.tgz c12 && rm -rf c12
