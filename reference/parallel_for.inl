// parallel_for: a fixed split of [0, count) over std::thread, enough for the CPU reference and
// input generation (no pool, no dependencies).
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

namespace attn {

template <typename Body>
void parallel_for(int64_t count, Body body) {
  const int64_t workers = std::max<int64_t>(
      1, std::min<int64_t>(count, std::max(1u, std::thread::hardware_concurrency())));
  if (workers == 1) {
    body(int64_t{0}, count);
    return;
  }
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t begin = count * w / workers, end = count * (w + 1) / workers;
    threads.emplace_back([=] { body(begin, end); });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace attn
