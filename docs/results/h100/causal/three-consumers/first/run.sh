# Three consumers for causal D64 (v8), longest-first groups for causal v10: suites, A/B old vs new, SDPA.
t0=$(date +%s)
O=$OUT/c1; mkdir -p $O; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
timeout 170 $B/gpu_tests --step=v8 > $O/gpu_v8.log 2>&1; echo "gpu_v8 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
timeout 90 $B/gpu_tests --step=v10 > $O/gpu_v10.log 2>&1; echo "gpu_v10 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
# warm the clock before A/B
$B/step8 --batch 8 --heads 12 --tokens 4097 --head-dim 64 --check none --iters 300 --warmup 300 --no-ceilings > /dev/null 2>&1
for r in 1 2 3; do
  if [ $r = 2 ]; then order="new old"; else order="old new"; fi
  for dt in fp16; do
    for hd in "12 64 --causal" "16 128 --causal" "12 64" "16 128"; do set -- $hd
      for v in $order; do echo -n "$v " >> $O/ab_fwd.txt
        $B/$v/step8 --batch 8 --heads $1 --tokens 4097 --head-dim $2 $3 --dtype $dt --check none --format json --iters 50 --no-ceilings >> $O/ab_fwd.txt 2>&1
      done
      for v in $order; do echo -n "$v " >> $O/ab_bwd.txt
        $B/$v/step10 --batch 8 --heads $1 --tokens 4097 --head-dim $2 $3 --dtype $dt --check none --format json --iters 30 --no-ceilings >> $O/ab_bwd.txt 2>&1
      done
    done
    for v in $order; do echo -n "$v " >> $O/ab_fwd.txt
      $B/$v/step8 --batch 32 --heads 12 --tokens 577 --head-dim 64 --dtype $dt --check none --format json --iters 100 --no-ceilings >> $O/ab_fwd.txt 2>&1
    done
  done
done
echo "ab $(( $(date +%s) - t0 )) s" >> $O/times.txt
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=$B/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/ 2>/dev/null
export ATTENTION_STEPS_LIBRARY=$PWD/$B/lib/libattention_steps.so
for s in "12 64" "16 128"; do set -- $s
  timeout 100 python3 scripts/compare_pytorch.py --batch 8 --heads $1 --tokens 4097 --head-dim $2 --steps v8,sdpa_cudnn --causal --dtype fp16 --windows 7 --csv $O/causal_forward_fp16_d$2.csv --info $O/causal_forward_info.txt > $O/causal_forward_fp16_d$2.log 2>&1; echo "fwd $2 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
done
timeout 150 python3 scripts/compare_backward.py --causal --dtype fp16 --windows 7 --shapes "8,12,4097,64;8,16,4097,128" --csv $O/causal_backward_fp16.csv > $O/causal_backward_fp16.log 2>&1; echo "bwd rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
