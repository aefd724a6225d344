#include "gpu_reference.hpp"

#include <cuda_bf16.h>

#include <cmath>

#include "cuda_check.hpp"
#include "element_type.hpp"

namespace attn {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kColumnsPerLane = kGpuReferenceMaxHeadDim / kWarpSize;  // of O, per lane

// The inputs exactly, in fp64, whichever 16-bit type they are.
__device__ double to_double(__half value) { return double(__half2float(value)); }
__device__ double to_double(__nv_bfloat16 value) { return double(__bfloat162float(value)); }

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
template <typename Element>
__global__ void reference_attention_fp64(const Element* q, const Element* k, const Element* v,
                                         const uint8_t* padding, float* out, float* log_sum_exp,
                                         int64_t rows_total, int tokens, int kv_tokens, int heads,
                                         int head_dim, double scale) {
  __shared__ double q_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row_index = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row_index >= rows_total) return;  // the whole warp: nothing below synchronises the block
  const int64_t slice_offset = (row_index / tokens) * int64_t(kv_tokens) * head_dim;  // of K, V
  const Element* k_slice = k + slice_offset;
  const Element* v_slice = v + slice_offset;
  // The batch element's [N_k] padding row (1: no weight), or none.
  const uint8_t* key_padding =
      padding == nullptr ? nullptr : padding + (row_index / tokens / heads) * int64_t(kv_tokens);
  double* q_row = q_rows[warp];
  for (int c = lane; c < head_dim; c += kWarpSize) q_row[c] = to_double(q[row_index * head_dim + c]);
  __syncwarp();

  auto score = [&](int key) {
    if (key_padding != nullptr && key_padding[key] != 0) return -double(INFINITY);
    const Element* k_row = k_slice + int64_t(key) * head_dim;
    double dot = 0.0;
    for (int c = 0; c < head_dim; ++c) dot += q_row[c] * to_double(k_row[c]);
    return dot * scale;
  };

  double row_max = -INFINITY;
  for (int key = lane; key < kv_tokens; key += kWarpSize) row_max = fmax(row_max, score(key));
  row_max = warp_max(row_max);
  if (row_max == -INFINITY) {  // every key is padding: O = 0, L = -inf (cpu_reference.hpp)
    if (log_sum_exp != nullptr && lane == 0) log_sum_exp[row_index] = -INFINITY;
    for (int c = lane; c < head_dim; c += kWarpSize) out[row_index * head_dim + c] = 0.0f;
    return;
  }

  // Keys in chunks of 32: lane l computes p for key chunk + l, then every lane adds each of the
  // chunk's 32 p_j v_j to its columns of O.
  double o_acc[kColumnsPerLane] = {};
  double row_sum = 0.0;
  for (int chunk = 0; chunk < kv_tokens; chunk += kWarpSize) {
    const int key = chunk + lane;
    const double p = key < kv_tokens ? exp(score(key) - row_max) : 0.0;
    row_sum += p;
    const int chunk_keys = min(kWarpSize, kv_tokens - chunk);
    for (int j = 0; j < chunk_keys; ++j) {
      const double p_j = __shfl_sync(0xffffffffu, p, j);
      const Element* v_row = v_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) o_acc[i] += p_j * to_double(v_row[c]);
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

// ---- The backward --------------------------------------------------------------------------

// A row of Q or dO (or K or V) into a warp's fp64 scratch.
template <typename Element>
__device__ void load_row(double* row, const Element* source, int head_dim, int lane) {
  for (int c = lane; c < head_dim; c += kWarpSize) row[c] = to_double(source[c]);
  __syncwarp();
}

template <typename Element>
__device__ double dot_with(const double* row, const Element* other, int head_dim) {
  double dot = 0.0;
  for (int c = 0; c < head_dim; ++c) dot += row[c] * to_double(other[c]);
  return dot;
}

// One warp per query row i: L_i = log sum_j exp(s_ij), D_i = sum_j P_ij dP_ij (from P and dP, not
// from an O: the reference depends on Q, K, V and dO alone), and dQ_i = scale sum_j dS_ij K_j.
// Lane l takes keys l, l + 32, ... for the scalars, columns l, l + 32, ... for dQ.
template <typename Element>
__global__ void reference_backward_rows_fp64(const Element* q, const Element* k, const Element* v,
                                             const Element* d_o, float* dq, double* row_stats,
                                             int64_t rows_total, int tokens, int head_dim,
                                             double scale) {
  __shared__ double q_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  __shared__ double d_o_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row_index = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row_index >= rows_total) return;
  const int64_t slice_offset = (row_index / tokens) * int64_t(tokens) * head_dim;
  const Element* k_slice = k + slice_offset;
  const Element* v_slice = v + slice_offset;
  double* q_row = q_rows[warp];
  double* d_o_row = d_o_rows[warp];
  load_row(q_row, q + row_index * head_dim, head_dim, lane);
  load_row(d_o_row, d_o + row_index * head_dim, head_dim, lane);
  // __dmul_rn: never fused into the subtraction that follows, so a score computed twice is the
  // same number and, at N = 1, P is exactly 1 and dS exactly 0 (dQ and dK vanish, as they must).
  auto score = [&](int key) { return __dmul_rn(scale, dot_with(q_row, k_slice + int64_t(key) * head_dim, head_dim)); };
  auto d_p = [&](int key) { return dot_with(d_o_row, v_slice + int64_t(key) * head_dim, head_dim); };

  double row_max = -INFINITY;
  for (int key = lane; key < tokens; key += kWarpSize) row_max = fmax(row_max, score(key));
  row_max = warp_max(row_max);
  double row_sum = 0.0;
  for (int key = lane; key < tokens; key += kWarpSize) row_sum += exp(score(key) - row_max);
  const double log_sum_exp = row_max + log(warp_sum(row_sum));
  double row_dot = 0.0;
  for (int key = lane; key < tokens; key += kWarpSize) row_dot += exp(score(key) - log_sum_exp) * d_p(key);
  row_dot = warp_sum(row_dot);

  double dq_acc[kColumnsPerLane] = {};
  for (int chunk = 0; chunk < tokens; chunk += kWarpSize) {
    const int key = chunk + lane;
    const double d_s = key < tokens ? exp(score(key) - log_sum_exp) * (d_p(key) - row_dot) : 0.0;
    const int chunk_keys = min(kWarpSize, tokens - chunk);
    for (int j = 0; j < chunk_keys; ++j) {
      const double d_s_j = __shfl_sync(0xffffffffu, d_s, j);
      const Element* k_row = k_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) dq_acc[i] += d_s_j * to_double(k_row[c]);
      }
    }
  }
  if (lane == 0) {
    row_stats[2 * row_index] = log_sum_exp;
    row_stats[2 * row_index + 1] = row_dot;
  }
  for (int i = 0; i < kColumnsPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < head_dim) dq[row_index * head_dim + c] = float(scale * dq_acc[i]);
  }
}

// One warp per key j, after the row kernel: dV_j = sum_i P_ij dO_i and dK_j = scale sum_i dS_ij Q_i,
// with P_ij = exp(s_ij - L_i) and dS_ij = P_ij (dP_ij - D_i). Lane l takes rows l, l + 32, ...
template <typename Element>
__global__ void reference_backward_keys_fp64(const Element* q, const Element* k, const Element* v,
                                             const Element* d_o, const double* row_stats, float* dk,
                                             float* dv, int64_t rows_total, int tokens,
                                             int head_dim, double scale) {
  __shared__ double k_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  __shared__ double v_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t key_index = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (key_index >= rows_total) return;
  const int64_t slice_row0 = (key_index / tokens) * int64_t(tokens);
  const Element* q_slice = q + slice_row0 * head_dim;
  const Element* d_o_slice = d_o + slice_row0 * head_dim;
  double* k_row = k_rows[warp];
  double* v_row = v_rows[warp];
  load_row(k_row, k + key_index * head_dim, head_dim, lane);
  load_row(v_row, v + key_index * head_dim, head_dim, lane);

  double dk_acc[kColumnsPerLane] = {}, dv_acc[kColumnsPerLane] = {};
  for (int chunk = 0; chunk < tokens; chunk += kWarpSize) {
    const int row = chunk + lane;
    double p = 0.0, d_s = 0.0;
    if (row < tokens) {
      const double log_sum_exp = row_stats[2 * (slice_row0 + row)];
      const double row_dot = row_stats[2 * (slice_row0 + row) + 1];
      p = exp(__dmul_rn(scale, dot_with(k_row, q_slice + int64_t(row) * head_dim, head_dim)) - log_sum_exp);
      d_s = p * (dot_with(v_row, d_o_slice + int64_t(row) * head_dim, head_dim) - row_dot);
    }
    const int chunk_rows = min(kWarpSize, tokens - chunk);
    for (int j = 0; j < chunk_rows; ++j) {
      const double p_j = __shfl_sync(0xffffffffu, p, j);
      const double d_s_j = __shfl_sync(0xffffffffu, d_s, j);
      const Element* q_row = q_slice + int64_t(chunk + j) * head_dim;
      const Element* d_o_row = d_o_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) {
          dv_acc[i] += p_j * to_double(d_o_row[c]);
          dk_acc[i] += d_s_j * to_double(q_row[c]);
        }
      }
    }
  }
  for (int i = 0; i < kColumnsPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < head_dim) {
      dk[key_index * head_dim + c] = float(scale * dk_acc[i]);
      dv[key_index * head_dim + c] = float(dv_acc[i]);
    }
  }
}

void check_head_dim(const Shape& shape) {
  if (shape.head_dim > kGpuReferenceMaxHeadDim) {
    throw CudaError("the GPU reference serves head dims up to " +
                    std::to_string(kGpuReferenceMaxHeadDim) + ", not " +
                    std::to_string(shape.head_dim));
  }
}

}  // namespace

std::size_t gpu_backward_reference_scratch_bytes(const Shape& shape) {
  return 2 * std::size_t(shape.slices() * shape.tokens) * sizeof(double);
}

void launch_gpu_backward_reference(const __half* q, const __half* k, const __half* v,
                                   const __half* d_o, float* dq, float* dk, float* dv,
                                   double* row_stats, const Shape& shape, double scale,
                                   cudaStream_t stream) {
  check_head_dim(shape);
  if (shape.cross()) throw CudaError("the GPU backward reference serves self-attention (N_k = N) only");
  const int64_t rows_total = shape.slices() * shape.tokens;
  const unsigned blocks = unsigned((rows_total + kWarpsPerBlock - 1) / kWarpsPerBlock);
  with_element_type(shape.dtype, [&](auto element) {
    using Element = decltype(element);
    const auto* q_in = reinterpret_cast<const Element*>(q);
    const auto* k_in = reinterpret_cast<const Element*>(k);
    const auto* v_in = reinterpret_cast<const Element*>(v);
    const auto* d_o_in = reinterpret_cast<const Element*>(d_o);
    reference_backward_rows_fp64<<<blocks, kWarpsPerBlock * kWarpSize, 0, stream>>>(
        q_in, k_in, v_in, d_o_in, dq, row_stats, rows_total, int(shape.tokens),
        int(shape.head_dim), scale);
    CUDA_CHECK_LAUNCH();
    reference_backward_keys_fp64<<<blocks, kWarpsPerBlock * kWarpSize, 0, stream>>>(
        q_in, k_in, v_in, d_o_in, row_stats, dk, dv, rows_total, int(shape.tokens),
        int(shape.head_dim), scale);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_gpu_reference(const __half* q, const __half* k, const __half* v,
                          const uint8_t* key_padding_mask, float* out, float* log_sum_exp,
                          const Shape& shape, cudaStream_t stream) {
  check_head_dim(shape);
  const int64_t rows_total = shape.slices() * shape.tokens;
  const int64_t blocks = (rows_total + kWarpsPerBlock - 1) / kWarpsPerBlock;
  with_element_type(shape.dtype, [&](auto element) {
    using Element = decltype(element);
    reference_attention_fp64<<<unsigned(blocks), kWarpsPerBlock * kWarpSize, 0, stream>>>(
        reinterpret_cast<const Element*>(q), reinterpret_cast<const Element*>(k),
        reinterpret_cast<const Element*>(v), key_padding_mask, out, log_sum_exp, rows_total,
        int(shape.tokens), int(shape.keys()), int(shape.heads), int(shape.head_dim),
        1.0 / std::sqrt(double(shape.head_dim)));
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attn
