# The training path measured by compare_backward.py --training (first run of the mode).
t0=$(date +%s)
O=$OUT/c8; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $O/times.txt
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=$B/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/ 2>/dev/null
export ATTENTION_STEPS_LIBRARY=$PWD/$B/lib/libattention_steps.so
timeout 150 python3 scripts/compare_backward.py --training --windows 7 --shapes "32,12,197,64;32,12,577,64;8,16,4097,128;32,16,257,80" --csv $O/training_fp16.csv > $O/training_fp16.log 2>&1; echo "training rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
cd $OUT && tar czf c8.tgz c8 && rm -rf c8
