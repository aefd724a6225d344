// Timing with CUDA events: W untimed warm-up runs, then I timed runs, each bracketed by its
// own pair of events; median, min and max of the I durations.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace attn {

struct TimingStats {
  double median_us = 0, min_us = 0, max_us = 0;
  int iters = 0, warmup = 0;
  int buffer_sets = 1;  // input/output copies rotated between runs (see runner.hpp)
};

// Median of a sample (the mean of the middle two for an even count).
double median(std::vector<double> values);
TimingStats summarize(const std::vector<double>& durations_us, int warmup);

// Waits for the work queued on `stream`, at most `limit_seconds`: a kernel that never ends (a
// deadlock: a barrier no one completes) becomes a GpuHang that says so, not a hang.
void synchronize_within(cudaStream_t stream, double limit_seconds);

// Runs launch(i) for i = 0, 1, ... on `stream`: `warmup` times untimed, then `iters` times
// timed. iters == 0 picks the count: up to kAutoIters runs within about kAutoSeconds.
TimingStats time_launches(const std::function<void(int)>& launch, cudaStream_t stream, int warmup,
                          int iters);

}  // namespace attn
