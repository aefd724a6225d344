// Seeded random inputs on the host. Every element is a pure function of (seed, tensor, index),
// so the values do not depend on how many threads draw them, and never zeros: unwritten or
// mis-indexed outputs cannot hide behind them.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "problem.hpp"

namespace attn {

struct HostTensors {
  Shape shape;
  std::vector<__half> q, k, v;  // [B, H, N, D] each
};

// Standard normal Q, K, V. qk_scale multiplies Q and K: the stress case uses 16, which puts
// the scores q.k / sqrt(D) at a standard deviation of 256, so the largest reach ~1000 and a
// softmax that forgets to subtract the row maximum overflows.
constexpr double kStressScale = 16.0;
HostTensors make_inputs(const Shape& shape, uint64_t seed, double qk_scale = 1.0);

// The same generator, for tests that need one value.
float normal_sample(uint64_t seed, uint64_t stream, uint64_t index);

// Runs body(begin, end) over [0, count) split across the machine's cores.
template <typename Body>
void parallel_for(int64_t count, Body body);

}  // namespace attn

#include "parallel_for.inl"
