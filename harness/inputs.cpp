#include "inputs.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

namespace attn {
namespace {

// splitmix64: a fast, well-mixed 64-bit hash; good enough for test data.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double unit_open(uint64_t bits) {  // uniform in (0, 1), never 0 so log() is finite
  return (double(bits >> 11) + 0.5) * 0x1.0p-53;
}

void fill(std::vector<__half>& tensor, DType dtype, uint64_t seed, uint64_t stream, double scale,
          double mean = 0.0) {
  parallel_for(int64_t(tensor.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      tensor[i] = to_dtype(float(mean + scale * normal_sample(seed, stream, uint64_t(i))), dtype);
    }
  });
}

// Q, K and V of `shape`, sized, values to be filled.
HostTensors sized_inputs(const Shape& shape) {
  HostTensors inputs;
  inputs.shape = shape;
  inputs.q.resize(std::size_t(shape.elements()));
  inputs.k.resize(std::size_t(shape.kv_elements()));
  inputs.v.resize(std::size_t(shape.kv_elements()));
  if (shape.packed()) {  // the references see sequence b as batch element b, padded past its length
    inputs.key_padding_mask.resize(std::size_t(shape.batch * shape.keys()));
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t j = 0; j < shape.keys(); ++j) {
        inputs.key_padding_mask[std::size_t(b * shape.keys() + j)] = j >= shape.length(b) ? 1 : 0;
      }
    }
  }
  if (shape.key_padding) {
    const int64_t keys = shape.keys();
    const int64_t columns = int64_t(std::ceil(std::sqrt(double(keys))));
    const int64_t rows = (keys + columns - 1) / columns;
    inputs.key_padding_mask.resize(std::size_t(shape.batch * keys));
    for (int64_t b = 0; b < shape.batch; ++b) {
      const int64_t kept_columns = std::max<int64_t>(1, columns - 1 - b % 3);
      const int64_t kept_rows = std::max<int64_t>(1, rows - (b + 1) % 2);
      for (int64_t j = 0; j < keys; ++j) {
        inputs.key_padding_mask[std::size_t(b * keys + j)] =
            (j % columns >= kept_columns || j / columns >= kept_rows) ? 1 : 0;
      }
    }
  }
  return inputs;
}

}  // namespace

__half to_dtype(float value, DType dtype) {
  if (dtype == DType::bf16) value = __bfloat162float(__float2bfloat16(value));
  return __float2half(value);
}

float normal_sample(uint64_t seed, uint64_t stream, uint64_t index) {
  // Box-Muller on two hashed uniforms.
  const uint64_t key = mix(seed ^ mix(stream + 0x51ed2701ull)) ^ index;
  const double u1 = unit_open(mix(key)), u2 = unit_open(mix(key ^ 0xd1b54a32d192ed03ull));
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

HostTensors make_inputs(const Shape& shape, uint64_t seed, double qk_scale) {
  HostTensors inputs = sized_inputs(shape);
  fill(inputs.q, shape.dtype, seed, 1, qk_scale);
  fill(inputs.k, shape.dtype, seed, 2, qk_scale);
  fill(inputs.v, shape.dtype, seed, 3, 1.0);
  return inputs;
}

HostTensors make_key_mask_probe_inputs(const Shape& shape, uint64_t seed) {
  HostTensors inputs = sized_inputs(shape);
  fill(inputs.q, shape.dtype, seed, 1, 0.5, 2.0);
  fill(inputs.k, shape.dtype, seed, 2, 0.5, -2.0);
  fill(inputs.v, shape.dtype, seed, 3, 0.5, 1.0);
  return inputs;
}

std::vector<__half> make_output_gradient(const Shape& shape, uint64_t seed) {
  std::vector<__half> d_o(std::size_t(shape.elements()));
  parallel_for(int64_t(d_o.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Packed sequences: a row past its sequence's end is no output, and has no gradient.
      const int64_t row = i / shape.head_dim % shape.tokens, slice = i / (shape.head_dim * shape.tokens);
      const bool output = row < shape.length(slice / shape.heads);
      d_o[i] = output ? to_dtype(normal_sample(seed, 4, uint64_t(i)), shape.dtype) : __float2half(0.0f);
    }
  });
  return d_o;
}

}  // namespace attn
