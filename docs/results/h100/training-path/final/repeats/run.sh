# #31: the three shapes where the backward alone is at or past cuDNN's time, repeated twice more
# (the final tree), for the spread of repeats; the flushed D = 80 row of c21 had a wide spread.
t0=$(date +%s)
O=$OUT/c22; mkdir -p $O; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
export ATTENTION_STEPS_LIBRARY=$PWD/stage/exp/lib/libattention_steps.so
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=stage/exp/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(el) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/
for r in 1 2; do
  timeout 200 python3 scripts/compare_backward.py --training --shapes "32,12,197,64;32,16,257,80;8,16,4097,128" --csv $O/repeat$r.csv > $O/repeat$r.log 2>&1; echo "repeat $r rc=$? $(el) s" >> $O/times.txt
done
cd $OUT && tar czf c22.tgz c22 && rm -rf c22
