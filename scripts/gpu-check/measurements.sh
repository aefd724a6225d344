#!/usr/bin/env bash
# Sourced by scripts/gpu-check.sh, which defines the settings and helpers these use (BUILD_DIR,
# OUTDIR, limit, require_build, ...). The stages that measure: bench, lse, profile, pytorch, torch,
# backward, training, models, vit.
# shellcheck shell=bash

stage_bench() {
  require_build bench || return 1
  local rc=0 failed=0
  echo "## bench over the ViT shapes, every step and baseline"
  timeout "$(limit 600)" "$BUILD_DIR/bench" --tokens 197,577,1025 --csv "$OUTDIR/bench_vit.csv" || rc=$?
  case $rc in
    0) ;;
    1) echo "bench: a result check FAILED (see the table above)"; failed=1 ;;
    124) echo "bench: timed out; the CSV holds the rows written so far"; failed=1 ;;
    *) echo "bench failed (exit $rc)"; return 1 ;;
  esac

  echo
  echo "## long sweep: N = 2049, 4097, 8193, 16385 for the steps with no N limit, v0 excluded"
  bench_list > "$OUTDIR/bench_list.txt" || { echo "bench --list failed"; return 1; }
  local plan="$OUTDIR/bench_long_plan.txt"
  "$PYTHON" scripts/plan_long_sweep.py --list "$OUTDIR/bench_list.txt" \
    --bench-csv "$OUTDIR/bench_vit.csv" --tokens 2049,4097,8193,16385 --exclude v0 \
    --budget-seconds "$LONG_SHAPE_BUDGET_S" --skipped-rows "$OUTDIR/bench_long_skipped.csv" > "$plan" ||
    { echo "planning the long sweep failed"; return 1; }
  grep '^#' "$plan" || true
  local long_csv="$OUTDIR/bench_long.csv" part=0 tokens steps part_csv
  : > "$long_csv"
  while IFS=$'\t' read -r tokens steps; do
    [[ -z "$tokens" || "$tokens" == \#* ]] && continue
    part=$((part + 1))
    part_csv="$OUTDIR/bench_long_part$part.csv"
    echo "bench --steps $steps --tokens $tokens --warmup 3"
    rc=0
    # Three warm-ups: at these sizes one run takes milliseconds to seconds.
    timeout "$(limit 420)" "$BUILD_DIR/bench" --steps "$steps" --tokens "$tokens" --warmup 3 --csv "$part_csv" || rc=$?
    case $rc in
      0) ;;
      1) echo "bench: a result check FAILED in the long sweep"; failed=1 ;;
      124) echo "bench: the long sweep timed out; its CSV holds the rows written so far"; failed=1 ;;
      *) echo "bench failed in the long sweep (exit $rc)"; failed=1 ;;
    esac
    if [ -s "$part_csv" ]; then
      if [ -s "$long_csv" ]; then tail -n +2 "$part_csv" >> "$long_csv"; else cat "$part_csv" > "$long_csv"; fi
      rm -f "$part_csv"
    fi
  done < "$plan"
  if [ -s "$OUTDIR/bench_long_skipped.csv" ]; then
    [ -s "$long_csv" ] || head -n 1 "$OUTDIR/bench_vit.csv" > "$long_csv"
    cat "$OUTDIR/bench_long_skipped.csv" >> "$long_csv"
  fi
  rm -f "$OUTDIR/bench_long_skipped.csv"
  [ -s "$long_csv" ] || { rm -f "$long_csv"; echo "long sweep: no step qualifies"; }
  return "$failed"
}

# The cost of writing L: each window times LSE_STEPS without L, then with it, in two bench
# processes, so that drift of the GPU's clocks shows as a spread across windows, not as a ratio.
stage_lse() {
  require_build bench || return 1
  local csv="$OUTDIR/lse.csv" part="$OUTDIR/lse_part.csv" window mode rc failed=0
  if [ -z "$LSE_STEPS" ]; then  # the forward steps that write L, as their registrations say
    LSE_STEPS=$(ATTENTION_STEPS_LIBRARY="$BUILD_DIR/libattention_steps.so" PYTHONPATH="$repo_root/python" \
      "$PYTHON" -c 'import attention_steps as s; print(",".join(i.id for i in s.list_steps() if i.writes_log_sum_exp and not i.is_baseline and not i.is_backward))') ||
      { echo "could not list the steps that write L (set LSE_STEPS)"; return 1; }
  fi
  echo "## $LSE_STEPS at N = 197,577,1025, D = 64,128: without L, then with it; $LSE_WINDOWS windows"
  : > "$csv"
  for window in $(seq 1 "$LSE_WINDOWS"); do
    for mode in plain lse; do
      local flags=()
      [ "$mode" = lse ] && flags=(--log-sum-exp)
      rc=0
      timeout "$(limit 240)" "$BUILD_DIR/bench" --steps "$LSE_STEPS" --tokens 197,577,1025 \
        --head-dim 64,128 "${flags[@]}" --csv "$part" || rc=$?
      case $rc in
        0) ;;
        1) echo "bench: a result check FAILED (window $window, $mode)"; failed=1 ;;
        *) echo "bench failed (exit $rc, window $window, $mode)"; rm -f "$part"; return 1 ;;
      esac
      [ -s "$csv" ] || echo "$(head -n 1 "$part"),window" > "$csv"
      tail -n +2 "$part" | sed "s/\$/,$window/" >> "$csv"
      rm -f "$part"
    done
  done
  return "$failed"
}

stage_profile() {
  require_build || return 1
  local ncu
  ncu=$(find_tool ncu "${NCU:-}") || { echo "ncu not found (set NCU=/path/to/ncu)"; return 1; }
  timeout "$(limit 900)" "$PYTHON" scripts/ncu_profile.py --build-dir "$BUILD_DIR" --out "$OUTDIR" --ncu "$ncu" --tokens 577
}

# Whether $PYTHON imports MODULES (a Python import list) and torch sees a CUDA device; if not,
# says why in a stage's "skipped:" line (NAMED: how the line names the modules).
torch_with_gpu() {
  local modules=$1 named=$2
  if ! "$PYTHON" -c "import $modules" 2>/dev/null; then
    echo "skipped: $named with $PYTHON"
    return 1
  fi
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "skipped: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') sees no CUDA device"
    return 1
  fi
}

stage_pytorch() {
  torch_with_gpu torch "torch does not import" || return "$kSkipped"
  # The flash steps run beside PyTorch in the same process through the build's library, each
  # implementation timed in interleaved windows: the ratios of the README and chapter 10.
  local steps="" id part rc=0
  for id in v6 v7 v8; do [ -x "$BUILD_DIR/step${id#v}" ] && steps+=",$id"; done
  [ -f "$BUILD_DIR/libattention_steps.so" ] || steps=""
  local parts=(
    "--tokens 197,577,1025 --steps all$steps"
    "--tokens 4097 --batch 8 --heads 12 --head-dim 64 --steps sdpa_flash,sdpa_cudnn$steps"
    "--tokens 4097 --batch 8 --heads 16 --head-dim 128 --steps sdpa_flash,sdpa_cudnn$steps"
    "--tokens 257 --batch 32 --heads 16 --head-dim 80 --steps sdpa_flash,sdpa_cudnn$steps"
    "--tokens 1050 --batch 1 --heads 8 --head-dim 32 --steps sdpa_flash,sdpa_cudnn$steps"
  )
  : > "$OUTDIR/pytorch.csv"
  for part in "${parts[@]}"; do
    echo "## compare_pytorch.py $part"
    # shellcheck disable=SC2086  # $part is a list of flags
    ATTENTION_STEPS_LIBRARY="$BUILD_DIR/libattention_steps.so" timeout "$(limit 300)" \
      "$PYTHON" scripts/compare_pytorch.py $part --windows 5 --csv "$OUTDIR/pytorch_part.csv" \
      --info "$OUTDIR/pytorch_info.txt" || rc=$?
    if [ -s "$OUTDIR/pytorch_part.csv" ]; then
      if [ -s "$OUTDIR/pytorch.csv" ]; then tail -n +2 "$OUTDIR/pytorch_part.csv" >> "$OUTDIR/pytorch.csv"
      else cat "$OUTDIR/pytorch_part.csv" > "$OUTDIR/pytorch.csv"; fi
    fi
    rm -f "$OUTDIR/pytorch_part.csv"
  done
  return "$rc"
}

# The stages that use the PyTorch operator: torch and CUDA present, and the operator installed
# (once a run, by the first of them) into $site, a folder of this run that the end removes.
site="$OUTDIR/torch-site"
trap 'rm -rf "$site"' EXIT
with_operator() {
  torch_with_gpu "torch, torchvision" "torch and torchvision do not import" || return "$kSkipped"
  [ -f "$BUILD_DIR/libattention_steps.so" ] || { echo "no $BUILD_DIR/libattention_steps.so (build the attention_steps target)"; return 1; }
  [ -d "$site/attention_steps" ] && return 0
  rm -rf python/build python/*.egg-info  # a clean build: its time is the one to report
  echo "## pip install --no-build-isolation ./python (into $site)"
  local started=$(date +%s)
  ATTENTION_STEPS_BUILD_DIR="$BUILD_DIR" timeout "$(limit 300)" "$PYTHON" -m pip install \
    --no-build-isolation --no-deps --target "$site" ./python > "$OUTDIR/torch_op_build.log" 2>&1 ||
    { tail -n 30 "$OUTDIR/torch_op_build.log"; echo "the operator did not build"; rm -rf "$site"; return 1; }
  echo "built and installed in $(( $(date +%s) - started )) s"
  cp "$site"/attention_steps/_operator*.so python/attention_steps/  # for the vit stage (git ignores it)
  rm -rf python/build python/*.egg-info
  echo
}

stage_torch() {
  with_operator || return $?
  echo "## the operator's tests (tests/python/: test_torch_op.py, test_torch_bridge.py --gpu, the"
  echo "## backward's masks and views, SDPA's masks, packed sequences, the models' training steps)"
  local rc=0 tests=(test_torch_op.py "test_torch_bridge.py --gpu" test_backward_masks.py
                    test_backward_views.py test_sdpa_masks.py test_varlen.py)
  # One training step of timm's and transformers' models: where neither package is installed
  # every test of it skips, and a suite none of whose tests ran fails.
  if "$PYTHON" -c "import timm" 2> /dev/null || "$PYTHON" -c "import transformers" 2> /dev/null; then
    tests+=(test_models_training.py)
  else
    echo "test_models_training.py skipped: neither timm nor transformers imports"
  fi
  for test in "${tests[@]}"; do
    # shellcheck disable=SC2086  # the test's arguments
    PYTHONPATH="$site" timeout "$(limit 240)" "$PYTHON" -X faulthandler tests/python/$test \
      >> "$OUTDIR/torch_op_tests.log" 2>&1 || { echo "$test FAILED"; rc=1; }
  done
  grep -E "^(Ran|OK|FAILED)|(ERROR|FAIL):" "$OUTDIR/torch_op_tests.log" || true
  echo
  echo "## scripts/torch_op_bench.py"
  local extra=()
  [ -n "${TORCH_OP_ARGS:-}" ] && read -r -a extra <<< "$TORCH_OP_ARGS"
  local left=$(( deadline - $(date +%s) - 15 ))
  PYTHONPATH="$site" timeout "$(limit 600)" "$PYTHON" scripts/torch_op_bench.py \
    --csv "$OUTDIR/torch_op.csv" --budget-s "$(( left > 60 ? left - 60 : 0 ))" "${extra[@]}" || rc=1
  return "$rc"
}

stage_backward() {
  with_operator || return $?
  echo "## scripts/compare_backward.py: v9 and v10 beside SDPA's FlashAttention-2 and cuDNN backward"
  PYTHONPATH="$site" timeout "$(limit 300)" "$PYTHON" scripts/compare_backward.py \
    --csv "$OUTDIR/backward.csv" || return 1
  echo "## the same in bf16"
  PYTHONPATH="$site" timeout "$(limit 300)" "$PYTHON" scripts/compare_backward.py \
    --dtype bf16 --csv "$OUTDIR/backward_bf16.csv"
}

stage_training() {
  with_operator || return $?
  echo "## scripts/train_digits.py: a small ViT on the digits, stock and with the steps; vit_b_16 training steps"
  local extra=()
  [ -n "${TRAINING_ARGS:-}" ] && read -r -a extra <<< "$TRAINING_ARGS"
  PYTHONPATH="$site" timeout "$(limit 400)" "$PYTHON" scripts/train_digits.py --out-dir "$OUTDIR" \
    "${extra[@]}"
}

stage_distributed() {
  with_operator || return $?
  local gpus
  gpus=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
  echo "## tests/python/test_sequence_parallel.py: partial results merged with L, ring and"
  echo "## all-to-all attention on one GPU and across 2 and 4 ($gpus here)"
  PYTHONPATH="$site" timeout "$(limit 400)" "$PYTHON" -X faulthandler tests/python/test_sequence_parallel.py \
    > "$OUTDIR/sequence_parallel_tests.log" 2>&1
  local rc=$?
  grep -E "^(Ran|OK|FAILED)|(ERROR|FAIL):|skipped" "$OUTDIR/sequence_parallel_tests.log" || true
  (( rc == 0 )) || return 1
  if (( gpus < 4 )); then
    echo "skipped: the tests on $(( gpus < 2 ? 2 : 4 )) GPUs and more: $gpus GPU(s) here"
    return "$kPassedWithSkips"
  fi
}

stage_models() {
  with_operator || return $?
  echo "## scripts/models_end_to_end.py: ViT-H/14, SETR-Naive, DETR-R50 with step 8 against stock"
  local left=$(( deadline - $(date +%s) - 30 ))
  local budget=${MODELS_DEADLINE_S:-420}
  (( left < budget )) && budget=$left
  PYTHONPATH="$site" timeout "$(limit 480)" "$PYTHON" scripts/models_end_to_end.py --compiled \
    --deadline-s "$budget" --csv "$OUTDIR/models_end_to_end.csv"
}

stage_vit() {
  with_operator || return $?  # the bridge's tests and the script use the checkout's package
  local library="$BUILD_DIR/libattention_steps.so"
  [ -f "$library" ] || { echo "no $library (build the attention_steps target)"; return 1; }
  local left=$(( deadline - $(date +%s) ))
  if (( left < 90 )); then
    echo "skipped: ${left} s of TIME_LIMIT_S=$TIME_LIMIT_S left; the end-to-end run takes about 4 minutes (STAGES=vit runs it alone)"
    return "$kSkipped"
  fi
  echo "## the PyTorch bridge on this GPU: every step against SDPA, a side stream, a refusal"
  PYTHONPATH="$repo_root/python" ATTENTION_STEPS_LIBRARY="$library" timeout "$(limit 120)" \
    "$PYTHON" tests/python/test_torch_bridge.py --gpu 2>&1 | tail -n 25 ||
    { echo "the PyTorch bridge's GPU tests FAILED"; return 1; }
  echo
  echo "## whole ViTs (scripts/vit_end_to_end.py)"
  left=$(( deadline - $(date +%s) ))
  # The script skips, with the reason, the rows that would end past its deadline, and still
  # writes its CSVs; the deadline leaves it time to do so within this run's limit.
  local script_deadline=$(( left - 20 ))
  (( script_deadline > 225 )) && script_deadline=225
  local extra=()
  [ -n "${VIT_ARGS:-}" ] && read -r -a extra <<< "$VIT_ARGS"
  ATTENTION_STEPS_LIBRARY="$library" timeout "$(limit 330)" "$PYTHON" scripts/vit_end_to_end.py \
    --out-dir "$OUTDIR" --deadline-s "$script_deadline" "${extra[@]}"
}
