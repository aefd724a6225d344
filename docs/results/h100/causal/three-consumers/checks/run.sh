# Final: the checked build's causal tests, the sanitizer on the causal kernels, the causal planted bugs
# (their causal test, normal and checked), then the forward comparison again with 11 windows.
t0=$(date +%s)
O=$OUT/c5; mkdir -p $O/san $O/planted; B=stage/exp; date -u > $O/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $O/times.txt
timeout 100 $B/checked/gpu_tests --step=v8 -tc="*causal*" > $O/checked_v8_causal.log 2>&1; echo "checked v8 causal rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
timeout 60 $B/checked/gpu_tests --step=v10 -tc="*causal*" > $O/checked_v10_causal.log 2>&1; echo "checked v10 causal rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export ATTN_SANITIZER_LOGS=$O/san ATTN_SANITIZER_RESULTS=$O/sanitizer.txt SANITIZER_TIMEOUT_S=90
for tool in memcheck racecheck; do
  bash tests/sanitize.sh $tool $B/step8 causal197d64 --tokens 197 --head-dim 64 --causal
  bash tests/sanitize.sh $tool $B/step8 causal_br300x77_bf16_padded --tokens 300 --kv-tokens 77 --head-dim 64 --causal --causal-align bottom-right --dtype bf16 --key-padding
  bash tests/sanitize.sh $tool $B/step10 causal577d128 --tokens 577 --head-dim 128 --causal
done >> $O/sanitizer.log 2>&1
echo "sanitizer $(( $(date +%s) - t0 )) s" >> $O/times.txt
P=$B/planted
for bug in v8causaloffbyone v8causalpartial v8causalalign v8causalextratile v8idlenoturnwait; do
  timeout 45 $P/gpu_tests_planted --step=$bug -tc="*causal*" --abort-after=1 > $O/planted/$bug.normal.log 2>&1; rn=$?
  timeout 45 $P/gpu_tests_planted_checked --step=${bug}_checked -tc="*causal*" --abort-after=1 > $O/planted/$bug.checked.log 2>&1; rc=$?
  rule=$(grep -aoE "pipeline rule [a-z-]+" $O/planted/$bug.checked.log | head -1)
  echo "$bug: causal test, normal build rc=$rn; checked build rc=$rc ${rule:-(no rule named)}" >> $O/planted.txt
done
echo "planted $(( $(date +%s) - t0 )) s" >> $O/times.txt
SITE=/tmp/site; rm -rf python/build python/*.egg-info $SITE
ATTENTION_STEPS_BUILD_DIR=$B/lib python3 -m pip install --no-build-isolation --no-deps --target $SITE ./python > $O/op_build.log 2>&1; echo "op rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
export PYTHONPATH=$SITE; cp $SITE/attention_steps/_operator*.so python/attention_steps/ 2>/dev/null
export ATTENTION_STEPS_LIBRARY=$PWD/$B/lib/libattention_steps.so
for dt in fp16 bf16; do for s in "12 64" "16 128"; do set -- $s
  [ $(( $(date +%s) - t0 )) -gt 540 ] && break 2
  timeout 60 python3 scripts/compare_pytorch.py --batch 8 --heads $1 --tokens 4097 --head-dim $2 --steps v8,sdpa_flash,sdpa_cudnn --causal --dtype $dt --windows 11 --csv $O/causal_forward_${dt}_d$2.csv --info $O/causal_forward_info.txt > $O/causal_forward_${dt}_d$2.log 2>&1; echo "fwd $dt $2 rc=$? $(( $(date +%s) - t0 )) s" >> $O/times.txt
done; done
cd $OUT && tar czf c5.tgz c5 && rm -rf c5
