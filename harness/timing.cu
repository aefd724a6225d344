#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "cuda_check.hpp"
#include "options.hpp"
#include "timing.hpp"

namespace attn {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return 0.5 * (upper + *std::max_element(values.begin(), values.begin() + mid));
}

TimingStats summarize(const std::vector<double>& durations_us, int warmup) {
  TimingStats stats;
  stats.iters = int(durations_us.size());
  stats.warmup = warmup;
  if (durations_us.empty()) return stats;
  stats.median_us = median(durations_us);
  stats.min_us = *std::min_element(durations_us.begin(), durations_us.end());
  stats.max_us = *std::max_element(durations_us.begin(), durations_us.end());
  return stats;
}

void synchronize_within(cudaStream_t stream, double limit_seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) CUDA_CHECK(status);
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > limit_seconds) {
      throw GpuHang("the GPU work did not finish within " + std::to_string(int(limit_seconds)) +
                    " s: a kernel that never ends (a barrier no thread completes?)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

namespace {

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Holds the stream for `nanoseconds` on one thread. Enqueued before the timed runs, it keeps
// the GPU busy while the host queues them all, so each run starts the moment the previous one
// ends: without it a short kernel's start event can fire while the host is still submitting
// the launch, and the submission time is counted as kernel time.
__global__ void hold_stream(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

constexpr double kTimedRunsLimitSeconds = 600;  // the slowest step's timed runs take a minute

std::vector<double> timed_runs(const std::function<void(int)>& launch, cudaStream_t stream,
                               int first, int count) {
  std::vector<Event> starts(count), stops(count);
  constexpr uint64_t kHoldPerRunNs = 20000, kMaxHoldNs = 50000000;  // 20 us a run, at most 50 ms
  hold_stream<<<1, 1, 0, stream>>>(std::min(kMaxHoldNs, kHoldPerRunNs * uint64_t(count)));
  CUDA_CHECK_LAUNCH();
  for (int i = 0; i < count; ++i) {
    CUDA_CHECK(cudaEventRecord(starts[i].get(), stream));
    launch(first + i);
    CUDA_CHECK(cudaEventRecord(stops[i].get(), stream));
  }
  synchronize_within(stream, kTimedRunsLimitSeconds);
  std::vector<double> durations(count);
  for (int i = 0; i < count; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, starts[i].get(), stops[i].get()));
    durations[i] = 1000.0 * ms;
  }
  return durations;
}

}  // namespace

TimingStats time_launches(const std::function<void(int)>& launch, cudaStream_t stream, int warmup,
                          int iters) {
  int run = 0;
  if (iters == 0) {
    // One timed probe after the warm-up sets the count for the budget.
    for (; run < warmup; ++run) launch(run);
    const double probe_us = timed_runs(launch, stream, run++, 1).front();
    iters = int(std::clamp(std::floor(kAutoSeconds * 1e6 / std::max(probe_us, 1.0)), 5.0,
                           double(kAutoIters)));
  } else {
    for (; run < warmup; ++run) launch(run);
  }
  return summarize(timed_runs(launch, stream, run, iters), warmup);
}

}  // namespace attn
