#include "gpu_reference.hpp"

#include <cmath>

#include "cuda_check.hpp"

namespace attn {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kColumnsPerLane = kGpuReferenceMaxHeadDim / kWarpSize;  // of O, per lane

__device__ double warp_max(double value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmax(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}
__device__ double warp_sum(double value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// One warp per query row (row_index = slice * N + row). Lane l takes keys l, l + 32, ... for
// the scores and columns l, l + 32, ... of O.
__global__ void reference_attention_fp64(const __half* q, const __half* k, const __half* v,
                                         float* out, float* log_sum_exp, int64_t rows_total,
                                         int tokens, int head_dim, double scale) {
  __shared__ double q_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row_index = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row_index >= rows_total) return;  // the whole warp: nothing below synchronises the block
  const int64_t slice_offset = (row_index / tokens) * int64_t(tokens) * head_dim;
  const __half* k_slice = k + slice_offset;
  const __half* v_slice = v + slice_offset;
  double* q_row = q_rows[warp];
  for (int c = lane; c < head_dim; c += kWarpSize) {
    q_row[c] = double(__half2float(q[row_index * head_dim + c]));
  }
  __syncwarp();

  auto score = [&](int key) {
    const __half* k_row = k_slice + int64_t(key) * head_dim;
    double dot = 0.0;
    for (int c = 0; c < head_dim; ++c) dot += q_row[c] * double(__half2float(k_row[c]));
    return dot * scale;
  };

  double row_max = -INFINITY;
  for (int key = lane; key < tokens; key += kWarpSize) row_max = fmax(row_max, score(key));
  row_max = warp_max(row_max);

  // Keys in chunks of 32: lane l computes p for key chunk + l, then every lane adds each of the
  // chunk's 32 p_j v_j to its columns of O.
  double o_acc[kColumnsPerLane] = {};
  double row_sum = 0.0;
  for (int chunk = 0; chunk < tokens; chunk += kWarpSize) {
    const int key = chunk + lane;
    const double p = key < tokens ? exp(score(key) - row_max) : 0.0;
    row_sum += p;
    const int chunk_keys = min(kWarpSize, tokens - chunk);
    for (int j = 0; j < chunk_keys; ++j) {
      const double p_j = __shfl_sync(0xffffffffu, p, j);
      const __half* v_row = v_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) o_acc[i] += p_j * double(__half2float(v_row[c]));
      }
    }
  }
  row_sum = warp_sum(row_sum);
  if (log_sum_exp != nullptr && lane == 0) log_sum_exp[row_index] = float(row_max + log(row_sum));
  for (int i = 0; i < kColumnsPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < head_dim) out[row_index * head_dim + c] = float(o_acc[i] / row_sum);
  }
}

}  // namespace

void launch_gpu_reference(const __half* q, const __half* k, const __half* v, float* out,
                          float* log_sum_exp, const Shape& shape, cudaStream_t stream) {
  if (shape.head_dim > kGpuReferenceMaxHeadDim) {
    throw CudaError("the GPU reference serves head dims up to " +
                    std::to_string(kGpuReferenceMaxHeadDim) + ", not " +
                    std::to_string(shape.head_dim));
  }
  const int64_t rows_total = shape.slices() * shape.tokens;
  const int64_t blocks = (rows_total + kWarpsPerBlock - 1) / kWarpsPerBlock;
  reference_attention_fp64<<<unsigned(blocks), kWarpsPerBlock * kWarpSize, 0, stream>>>(
      q, k, v, out, log_sum_exp, rows_total, int(shape.tokens), int(shape.head_dim),
      1.0 / std::sqrt(double(shape.head_dim)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn
