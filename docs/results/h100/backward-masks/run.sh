# #31: v9 (N_k, padding, head dims 32-128) never run before; v6 at D = 96; planted bugs of the new
# paths; sanitizer on masked/cross shapes; v10 A/B against f85de65 (non-causal, unchanged?) and
# the D = 80/96 tile choice; the checked build on v10's new cases.
t0=$(date +%s)
O=$OUT/c17; mkdir -p $O/san $O/planted; B=stage/exp; date -u > $O/times.txt
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
timeout 170 $B/gpu_tests --step=v9 > $O/gpu_v9.log 2>&1; echo "gpu v9 rc=$? $(el) s" >> $O/times.txt
timeout 60 $B/gpu_tests --step=v6 > $O/gpu_v6.log 2>&1; echo "gpu v6 rc=$? $(el) s" >> $O/times.txt
P=$B/planted
for bug in v10paddeddvkept v10paddingignored v10keytilesfromn v10unseenrowsleft v10dqpastd v9paddingunmasked; do
  case $bug in
    v10padd*|v9padd*) tc="*padding*";; v10keytilesfromn) tc="cross-attention*";;
    v10unseenrowsleft) tc="deterministic mode on cross*";; *) tc="*";;
  esac
  timeout 60 $P/gpu_tests_planted --step=$bug -tc="$tc" --abort-after=1 > $O/planted/$bug.normal.log 2>&1; rn=$?
  rc=-
  if [ ${bug#v10} != $bug ]; then
    timeout 60 $P/gpu_tests_planted_checked --step=${bug}_checked -tc="$tc" --abort-after=1 > $O/planted/$bug.checked.log 2>&1; rc=$?
  fi
  echo "$bug: tests '$tc', normal build rc=$rn; checked build rc=$rc" >> $O/planted.txt
done
echo "planted $(el) s" >> $O/times.txt
export ATTN_SANITIZER_LOGS=$O/san ATTN_SANITIZER_RESULTS=$O/sanitizer.txt SANITIZER_TIMEOUT_S=60
for tool in memcheck racecheck; do
  for s in step10_new step9; do
    bash tests/sanitize.sh $tool $B/$s d80_cross_pad --batch 2 --heads 3 --tokens 130 --kv-tokens 77 --head-dim 80 --key-padding
    bash tests/sanitize.sh $tool $B/$s d32_cross_causal_br_det --batch 2 --heads 3 --tokens 197 --kv-tokens 65 --head-dim 32 --causal --causal-align bottom-right --deterministic
  done
done >> $O/sanitizer.log 2>&1
echo "sanitizer $(el) s" >> $O/times.txt
ab() {  # label bins... : shapes from $shapes
  for r in 1 2; do
    order="$*"; [ $r = 2 ] && order=$(echo "$*" | tr ' ' '\n' | tac | tr '\n' ' ')
    for s in "${shapes[@]}"; do set -- $s; b=$1 h=$2 n=$3 d=$4; shift 4
      for bin in $order; do echo -n "$bin $b,$h,$n,$d $* " >> $O/ab.txt
        $B/$bin --batch $b --heads $h --tokens $n --head-dim $d "$@" --check none --format json --iters 30 --no-ceilings >> $O/ab.txt 2>&1
      done; done
    echo "ab round $r ($order) $(el) s" >> $O/times.txt
  done
}
shapes=("32 12 197 64" "32 12 577 64" "32 12 1025 64" "8 12 4097 64" "8 16 4097 128")
ab step10_old step10_new
shapes=("32 16 257 80" "8 16 4097 80" "32 12 197 96" "8 12 4097 96")
ab step10_new step10_r128
if [ $(el) -lt 420 ]; then
  timeout $(( 560 - $(el) )) $B/checked/gpu_tests --step=v10 -tc="cross-attention*,key-padding mask*,causal mask with N_q*,a batch element whose keys*,deterministic mode on cross*" > $O/checked_v10_new.log 2>&1
  echo "checked v10 new cases rc=$? $(el) s" >> $O/times.txt
fi
cd $OUT && tar czf c17.tgz c17 && rm -rf c17
