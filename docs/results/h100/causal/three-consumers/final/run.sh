# Causal against SDPA (cuDNN, FA2), fp16 and bf16, forward and backward; v10 group sizes A/B.
t0=$(date +%s)
O=$OUT/c4; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=$B/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/ 2>/dev/null
export ATTENTION_STEPS_LIBRARY=$PWD/$B/lib/libattention_steps.so
for dt in fp16 bf16; do
  for s in "12 64" "16 128"; do set -- $s
    timeout 100 python3 scripts/compare_pytorch.py --batch 8 --heads $1 --tokens 4097 --head-dim $2 --steps v8,sdpa_flash,sdpa_cudnn --causal --dtype $dt --windows 7 --csv $O/causal_forward_${dt}_d$2.csv --info $O/causal_forward_info.txt > $O/causal_forward_${dt}_d$2.log 2>&1; echo "fwd $dt $2 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
  done
  timeout 150 python3 scripts/compare_backward.py --causal --dtype $dt --windows 7 --shapes "8,12,4097,64;8,16,4097,128" --csv $O/causal_backward_$dt.csv > $O/causal_backward_$dt.log 2>&1; echo "bwd $dt rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
done
run() { f=$1; v=$2; shift 2; echo -n "$v " >> $O/$f; $B/$v/step10 "$@" --check none --format json --no-ceilings >> $O/$f 2>&1; }
for r in 1 2 3; do
  vs="new g2 g8 old"; [ $r = 2 ] && vs="old g8 g2 new"
  for v in $vs; do run groups.txt $v --batch 8 --heads 16 --tokens 4097 --head-dim 128 --causal --iters 30
                   run groups.txt $v --batch 8 --heads 12 --tokens 4097 --head-dim 64 --causal --iters 30; done
done
echo "groups $(( $(date +%s) - t0 )) s" >> $O/times.txt
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
