// Runs one step on one set of inputs: upload, checked run, warm-up, timed runs.
//
// The checked run comes first, on an output poisoned with NaN, so an element the step never
// writes fails the check; the GPU reference then checks every slice, and a Hopper step built
// with the checked pipeline reports the first protocol rule it broke (a failed check too). Timed runs rotate over several copies of the inputs and output when
// one copy fits in L2: otherwise a small shape would be timed from cache, not from memory.
#pragma once

#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "check.hpp"
#include "backward_reference.hpp"
#include "ceilings.hpp"
#include "inputs.hpp"
#include "step.hpp"
#include "timing.hpp"

namespace attn {

struct RunConfig {
  int warmup = 10;
  int iters = 0;  // 0: automatic (timing.hpp)
  bool time = true;
  // With a reference: also check every element of every slice against the GPU reference.
  bool check_all_slices = true;
  int max_persistent_blocks = 0;  // AttentionArgs::max_persistent_blocks (a testing aid)
  // The timed runs write L too, as a training forward does (bench --log-sum-exp); only for a
  // step that writes_log_sum_exp. The checked run writes and checks L either way.
  bool timed_log_sum_exp = false;
  // A backward step runs in its deterministic mode (BackwardArgs::deterministic).
  bool deterministic = false;
};

struct RunResult {
  TimingStats timing;
  CheckResult check;
  std::vector<__half> output;  // the checked run's O, [B, H, N, D]
};

// "1.50 GiB": how the harness and the C ABI write sizes of memory.
std::string gibibytes(double bytes);

// Device memory one run of `step` on `shape` needs with `buffer_sets` rotating copies, and the
// GPU reference's fp32 output when `check_all_slices`.
std::size_t device_bytes_needed(const StepInfo& step, const Shape& shape, int buffer_sets,
                                bool check_all_slices = true);

// Throws CudaError, saying how much is needed and how much is free, when one copy of the
// problem (and the step's workspace) does not fit in the GPU's free memory.
void ensure_fits(const StepInfo& step, const Shape& shape, bool check_all_slices = true);

// When a run of this process hung (GpuHang), ends the process at once with `status`, output
// flushed: the kernel still occupies the GPU, and the CUDA runtime's teardown at a normal exit
// would wait for it. Otherwise returns.
void exit_if_gpu_hung(int status);

// A backward step (StepKind::backward): its forward step (StepInfo::forward_step, which the
// program must link) writes O and L from the inputs, then the checked run of the backward on dQ,
// dK and dV poisoned with NaN, checked against `reference` (nullptr: no check), then the timed
// runs of the backward alone, on the same O and L. Both passes get the inputs' key-padding mask.
struct BackwardRunResult {
  TimingStats timing;
  CheckResult check;
  // The checked run's gradients (when there is a reference): dQ [B, H, N, D], dK and dV
  // [B, H, N_k, D].
  std::vector<__half> dq, dk, dv;
};
BackwardRunResult run_backward_step(const StepInfo& step, const HostTensors& inputs,
                                    const std::vector<__half>& d_o,
                                    const BackwardReference* reference, const RunConfig& config);

// reference may be nullptr (no check).
RunResult run_step(const StepInfo& step, const HostTensors& inputs, const Reference* reference,
                   const RunConfig& config);

}  // namespace attn
