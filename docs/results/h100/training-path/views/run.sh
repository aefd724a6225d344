# #31: views in the backward (C ABI, operator) checked; the Python suites on the H100; the training
# path at the eight shapes with views; ncu of step 10 at ViT-H's shape and DETR's decoder call.
t0=$(date +%s)
O=$OUT/c19; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
for s in v10 v9 eager_backward; do
  timeout 90 $B/lib/capi_gpu_tests --step=$s > $O/capi_gpu_$s.log 2>&1; echo "capi gpu $s rc=$? $(el) s" >> $O/times.txt
done
export ATTENTION_STEPS_LIBRARY=$PWD/stage/exp/lib/libattention_steps.so
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=stage/exp/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(el) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/
for t in test_backward_views test_backward_masks test_torch_op test_sdpa_masks; do
  timeout 120 python3 tests/python/$t.py > $O/$t.log 2>&1; echo "$t rc=$? $(el) s" >> $O/times.txt
done
timeout 300 python3 scripts/compare_backward.py --training --csv $O/training_fp16.csv > $O/training_fp16.log 2>&1; echo "training rc=$? $(el) s" >> $O/times.txt
left=$(( 560 - $(el) ))
if [ $left -gt 60 ]; then
  timeout $(( left / 2 )) python3 scripts/ncu_profile.py --out $O/ncu_d80 --build-dir $B/build --steps v10 --batch 32 --heads 16 --tokens 257 --head-dim 80 --kernel-regex "hopper_backward|row_vectors|dq_convert" > $O/ncu_d80.log 2>&1
  echo "ncu d80 rc=$? $(el) s" >> $O/times.txt
  timeout $(( 560 - $(el) )) python3 scripts/ncu_profile.py --out $O/ncu_detr --build-dir $B/build --steps v10 --batch 32 --heads 8 --tokens 100 --kv-tokens 1050 --key-padding --head-dim 32 --kernel-regex "hopper_backward|row_vectors|dq_convert" > $O/ncu_detr.log 2>&1
  echo "ncu detr rc=$? $(el) s" >> $O/times.txt
fi
cd $OUT && tar czf c19.tgz c19 && rm -rf c19
