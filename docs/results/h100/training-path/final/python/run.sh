# The four new Python suites after their shared preamble moved into tests/python/torch_gpu.py.
t0=$(date +%s)
O=$OUT/c24; mkdir -p $O; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
export ATTENTION_STEPS_LIBRARY=$PWD/stage/exp/lib/libattention_steps.so
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=stage/exp/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(el) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/
for t in test_backward_views test_backward_masks test_sdpa_masks test_models_training; do
  timeout 100 python3 tests/python/$t.py > $O/$t.log 2>&1; echo "$t rc=$? $(el) s" >> $O/times.txt
done
cd $OUT && tar czf c24.tgz c24 && rm -rf c24
