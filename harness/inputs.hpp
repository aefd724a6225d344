// Seeded random inputs on the host. Every element is a pure function of (seed, tensor, index),
// so the values do not depend on how many threads draw them, and never zeros: unwritten or
// mis-indexed outputs cannot hide behind them.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "host_tensors.hpp"
#include "problem.hpp"

namespace attn {

// `value` rounded to `dtype`, in an fp16 container (see HostTensors, reference/host_tensors.hpp).
__half to_dtype(float value, DType dtype);

// Standard normal Q, K, V. qk_scale multiplies Q and K: the stress case uses 16, which puts
// the scores q.k / sqrt(D) at a standard deviation of 256, so the largest reach ~1000 and a
// softmax that forgets to subtract the row maximum overflows.
constexpr double kStressScale = 16.0;
// Large but not extreme scores: 4 puts them at a standard deviation of 16. With a few keys, a row's
// L is then often far below 0, and P = exp(s - L) of a zero score (a key past N, whose K row a
// kernel loads as zeros) overflows fp16: the tests at tails and tile sizes use these inputs.
constexpr double kLargeScoreScale = 4.0;
HostTensors make_inputs(const Shape& shape, uint64_t seed, double qk_scale = 1.0);

// Inputs that expose a kernel that gives weight to a key past N (a mask off by one). Every real
// score is strongly negative: each component of Q is about +2 and of K about -2 (normal, standard
// deviation 0.5), so q.k / sqrt(D) is about -4 sqrt(D) (-32 at D = 64). A key past N scores 0
// (a zero row: TMA's fill, or zeros a kernel loads), so one such key outweighs the whole row by
// e^32, and V, of mean 1 here, is replaced by that key's row in O. A correct kernel's O is about
// 1; a leaking one's is far from it, whatever the tolerance.
HostTensors make_key_mask_probe_inputs(const Shape& shape, uint64_t seed);

// The same generator, for tests that need one value.
float normal_sample(uint64_t seed, uint64_t stream, uint64_t index);

// dO of the standard test inputs: standard normal, from its own stream of the seed; for packed
// sequences (held padded, [B, H, N, D]) 0 on the rows past each sequence's end.
std::vector<__half> make_output_gradient(const Shape& shape, uint64_t seed);

}  // namespace attn
