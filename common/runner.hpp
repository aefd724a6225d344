// Runs one step on one set of inputs: upload, checked run, warm-up, timed runs.
//
// The checked run comes first, on an output poisoned with NaN, so an element the step never
// writes fails the check. Timed runs rotate over several copies of the inputs and output when
// one copy fits in L2: otherwise a small shape would be timed from cache, not from memory.
#pragma once

#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "check.hpp"
#include "ceilings.hpp"
#include "inputs.hpp"
#include "step.hpp"
#include "timing.hpp"

namespace attn {

struct RunConfig {
  int warmup = 10;
  int iters = 0;  // 0: automatic (timing.hpp)
  bool time = true;
};

struct RunResult {
  TimingStats timing;
  CheckResult check;
  std::vector<__half> output;  // the checked run's O, [B, H, N, D]
};

// Device memory one run of `step` on `shape` needs with `buffer_sets` rotating copies.
std::size_t device_bytes_needed(const StepInfo& step, const Shape& shape, int buffer_sets);

// Throws CudaError, saying how much is needed and how much is free, when one copy of the
// problem (and the step's workspace) does not fit in the GPU's free memory.
void ensure_fits(const StepInfo& step, const Shape& shape);

// reference may be nullptr (no check).
RunResult run_step(const StepInfo& step, const HostTensors& inputs, const Reference* reference,
                   const RunConfig& config);

}  // namespace attn
