# Whether the harness's fp16 D64 causal v8 time depends on running first: bf16, fp16, fp16 again; and the binary.
t0=$(date +%s)
O=$OUT/c6; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=$B/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/ 2>/dev/null
export ATTENTION_STEPS_LIBRARY=$PWD/$B/lib/libattention_steps.so
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $O/smi.csv 2>&1 &
smi=$!
i=0; for dt in bf16 fp16 fp16 bf16; do i=$((i+1))
  timeout 60 python3 scripts/compare_pytorch.py --batch 8 --heads 12 --tokens 4097 --head-dim 64 --steps v8,sdpa_cudnn --causal --dtype $dt --windows 9 --csv $O/causal_forward_${i}_${dt}_d64.csv > $O/causal_forward_${i}_${dt}_d64.log 2>&1; echo "fwd $i $dt rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
done
for r in 1 2; do for dt in fp16 bf16; do echo -n "$dt " >> $O/binary.txt
  $B/step8 --batch 8 --heads 12 --tokens 4097 --head-dim 64 --causal --dtype $dt --check none --format json --iters 100 --no-ceilings >> $O/binary.txt 2>&1; done; done
kill $smi; echo "done $(( $(date +%s) - t0 )) s" >> $O/times.txt
cd $OUT && tar czf c6.tgz c6 && rm -rf c6
