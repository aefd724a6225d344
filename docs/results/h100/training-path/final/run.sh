# #31, the final tree: the training path at the eight shapes (fp16) and 100 training steps of
# ViT-H/14 and DETR through use_steps() against stock, on the H100.
t0=$(date +%s)
O=$OUT/c21; mkdir -p $O; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
export ATTENTION_STEPS_LIBRARY=$PWD/stage/exp/lib/libattention_steps.so
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=stage/exp/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(el) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/
timeout 300 python3 scripts/compare_backward.py --training --csv $O/training_fp16.csv > $O/training_fp16.log 2>&1; echo "training rc=$? $(el) s" >> $O/times.txt
timeout $(( 560 - $(el) )) python3 scripts/train_models.py --seed 0 --csv $O/train_seed0.csv > $O/train_models.log 2>&1; echo "train_models rc=$? $(el) s" >> $O/times.txt
cd $OUT && tar czf c21.tgz c21 && rm -rf c21
