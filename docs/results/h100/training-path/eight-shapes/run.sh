# #31: the training path measured (compare_backward.py --training, the eight shapes, fp16), a
# second A/B of v10 against f85de65 (non-causal), the v6 suite with D = 96.
t0=$(date +%s)
O=$OUT/c18; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
export ATTENTION_STEPS_LIBRARY=$PWD/stage/exp/lib/libattention_steps.so
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=stage/exp/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(el) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/
timeout 330 python3 scripts/compare_backward.py --training --csv $O/training_fp16.csv > $O/training_fp16.log 2>&1; echo "training rc=$? $(el) s" >> $O/times.txt
for r in 1 2; do
  order="step10_old step10_new"; [ $r = 2 ] && order="step10_new step10_old"
  for s in "32 12 197 64" "32 12 577 64" "32 12 1025 64" "8 12 4097 64" "8 16 4097 128"; do
    set -- $s
    for bin in $order; do echo -n "$bin $1,$2,$3,$4 " >> $O/ab.txt
      $B/$bin --batch $1 --heads $2 --tokens $3 --head-dim $4 --check none --format json --iters 30 --no-ceilings >> $O/ab.txt 2>&1
    done; done
  echo "ab round $r ($order) $(el) s" >> $O/times.txt
done
left=$(( 570 - $(el) ))
[ $left -gt 30 ] && { timeout $left $B/gpu_tests --step=v6 > $O/gpu_v6.log 2>&1; echo "gpu v6 rc=$? $(el) s" >> $O/times.txt; }
cd $OUT && tar czf c18.tgz c18 && rm -rf c18
