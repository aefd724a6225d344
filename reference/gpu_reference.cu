#include "gpu_reference.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backward_reference.hpp"
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
                                         int head_dim, double scale, bool causal, int diagonal) {
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

  // The last key this row sees: every key, or the causal diagonal's (problem.hpp).
  const int64_t last_key = causal ? int64_t(row_index % tokens) + diagonal : int64_t(kv_tokens);
  auto score = [&](int key) {
    if (key_padding != nullptr && key_padding[key] != 0) return -double(INFINITY);
    if (key > last_key) return -double(INFINITY);
    const Element* k_row = k_slice + int64_t(key) * head_dim;
    double dot = 0.0;
    for (int c = 0; c < head_dim; ++c) dot += q_row[c] * to_double(k_row[c]);
    return dot * scale;
  };

  double row_max = -INFINITY;
  for (int key = lane; key < kv_tokens; key += kWarpSize) row_max = fmax(row_max, score(key));
  row_max = warp_max(row_max);
  if (row_max == -INFINITY) {  // every key is masked: O = 0, L = -inf (cpu_reference.hpp)
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
template <typename Element>
__device__ double abs_dot_with(const double* row, const Element* other, int head_dim) {
  double dot = 0.0;
  for (int c = 0; c < head_dim; ++c) dot += fabs(row[c] * to_double(other[c]));
  return dot;
}

// The rounding of a correct kernel (backward_reference.hpp's Rounding), as plain numbers;
// longest_sum is n, the longer of N and N_k (the length of the longest sum).
struct ErrorModel {
  double u, tau, stored_tau, fp32, longest_sum, head_dim;
};
// Row i's statistics, kept between the two kernels.
struct RowStats {
  double log_sum_exp, row_dot, row_dot_error, sigma_max;
};

// Which keys a query row sees: those up to its causal diagonal (problem.hpp, either alignment)
// that its batch element does not pad. Both kernels ask this one predicate, so a (row, key) pair
// counts in both or in neither.
struct KeyMask {
  const uint8_t* padding;  // [B, N_k] bytes, 1: padding; or nullptr
  int heads, kv_tokens;
  bool causal;
  int64_t diagonal;  // Shape::diagonal()
  __device__ bool sees(int64_t slice, int row, int key) const {
    if (causal && key > row + diagonal) return false;
    return padding == nullptr || padding[(slice / heads) * kv_tokens + key] == 0;
  }
};

// One warp per query row i: L_i = log sum_j exp(s_ij), D_i = sum_j P_ij dP_ij (from P and dP, not
// from an O: the reference depends on Q, K, V and dO alone), and dQ_i = scale sum_j dS_ij K_j;
// for the bounds, O_i, max_j sigma_ij and D_i's error bound. Lane l takes keys l, l + 32, ...
// for the scalars, columns l, l + 32, ... for O and dQ.
template <typename Element>
__global__ void reference_backward_rows_fp64(const Element* q, const Element* k, const Element* v,
                                             const Element* d_o, float* dq, float* dq_bound,
                                             RowStats* row_stats, int64_t rows_total, int tokens,
                                             int kv_tokens, int head_dim, double scale,
                                             ErrorModel error, KeyMask mask) {
  __shared__ double q_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  __shared__ double d_o_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row_index = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row_index >= rows_total) return;
  const int64_t slice = row_index / tokens;
  const int row = int(row_index % tokens);
  const int64_t kv_slice_offset = slice * int64_t(kv_tokens) * head_dim;  // K and V: N_k rows
  const Element* k_slice = k + kv_slice_offset;
  const Element* v_slice = v + kv_slice_offset;
  double* q_row = q_rows[warp];
  double* d_o_row = d_o_rows[warp];
  load_row(q_row, q + row_index * head_dim, head_dim, lane);
  load_row(d_o_row, d_o + row_index * head_dim, head_dim, lane);
  // __dmul_rn: never fused into the subtraction that follows, so a score computed twice is the
  // same number and, where a row sees one key, P is exactly 1 and dS exactly 0 (dQ and dK
  // vanish, as they must). A key the row does not see scores -inf and gets P = 0 (not exp of its
  // score less L: a row that sees no key has L = -inf too), so its dS is 0.
  auto sees = [&](int key) { return mask.sees(slice, row, key); };
  auto score = [&](int key) {
    if (!sees(key)) return -double(INFINITY);
    return __dmul_rn(scale, dot_with(q_row, k_slice + int64_t(key) * head_dim, head_dim));
  };
  auto sigma = [&](int key) { return scale * abs_dot_with(q_row, k_slice + int64_t(key) * head_dim, head_dim); };
  auto d_p = [&](int key) { return dot_with(d_o_row, v_slice + int64_t(key) * head_dim, head_dim); };

  double row_max = -INFINITY, sigma_max = 0.0;
  for (int key = lane; key < kv_tokens; key += kWarpSize) {
    row_max = fmax(row_max, score(key));
    sigma_max = fmax(sigma_max, sigma(key));
  }
  row_max = warp_max(row_max);
  sigma_max = warp_max(sigma_max);
  double row_sum = 0.0;
  for (int key = lane; key < kv_tokens; key += kWarpSize) {
    if (sees(key)) row_sum += exp(score(key) - row_max);
  }
  row_sum = warp_sum(row_sum);
  // A row that sees no key: L = -inf (the forward references'), and every P below is 0, so D_i,
  // dQ_i and this row's share of dK and dV are 0.
  const double log_sum_exp = row_max == -INFINITY ? -INFINITY : row_max + log(row_sum);
  auto probability = [&](int key) { return sees(key) ? exp(score(key) - log_sum_exp) : 0.0; };
  double row_dot = 0.0;
  for (int key = lane; key < kv_tokens; key += kWarpSize) row_dot += probability(key) * d_p(key);
  row_dot = warp_sum(row_dot);
  // P's relative error for key j; P's error rounded to 16 bits; that per unit it multiplies in a
  // sum of n terms.
  auto rho = [&](int key) { return error.head_dim * error.fp32 * (sigma(key) + sigma_max); };
  auto p_error = [&](int key, double p) { return p * (rho(key) + error.u) + error.tau; };
  auto rounded_p_error = [&](int key, double p) { return p_error(key, p) + error.longest_sum * error.fp32 * p; };

  // O_i and its bound (the forward's rounding), then D_i's bound.
  double o_acc[kColumnsPerLane] = {}, o_error[kColumnsPerLane] = {};
  for (int chunk = 0; chunk < kv_tokens; chunk += kWarpSize) {
    const int key = chunk + lane;
    const double p = key < kv_tokens ? probability(key) : 0.0;
    const double w = key < kv_tokens ? rounded_p_error(key, p) : 0.0;
    const int chunk_keys = min(kWarpSize, kv_tokens - chunk);
    for (int j = 0; j < chunk_keys; ++j) {
      const double p_j = __shfl_sync(0xffffffffu, p, j), w_j = __shfl_sync(0xffffffffu, w, j);
      const Element* v_row = v_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) {
          o_acc[i] += p_j * to_double(v_row[c]);
          o_error[i] += w_j * fabs(to_double(v_row[c]));
        }
      }
    }
  }
  double row_dot_error = 0.0;
  for (int i = 0; i < kColumnsPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < head_dim) {
      const double o_bound = o_error[i] + error.u * fabs(o_acc[i]) + error.tau;
      row_dot_error += fabs(d_o_row[c]) * (o_bound + error.head_dim * error.fp32 * fabs(o_acc[i]));
    }
  }
  row_dot_error = warp_sum(row_dot_error);

  double dq_acc[kColumnsPerLane] = {}, dq_error[kColumnsPerLane] = {};
  for (int chunk = 0; chunk < kv_tokens; chunk += kWarpSize) {
    const int key = chunk + lane;
    double d_s = 0.0, d_s_error = 0.0;
    if (key < kv_tokens) {
      const double p = probability(key);
      const double d_p_minus_d = d_p(key) - row_dot;
      d_s = p * d_p_minus_d;
      const double d_p_error = error.head_dim * error.fp32 *
                               abs_dot_with(d_o_row, v_slice + int64_t(key) * head_dim, head_dim);
      d_s_error = p_error(key, p) * fabs(d_p_minus_d) + p * (d_p_error + row_dot_error) +
                  (error.u + error.longest_sum * error.fp32) * fabs(d_s) + error.tau;
    }
    const int chunk_keys = min(kWarpSize, kv_tokens - chunk);
    for (int j = 0; j < chunk_keys; ++j) {
      const double d_s_j = __shfl_sync(0xffffffffu, d_s, j);
      const double d_s_error_j = __shfl_sync(0xffffffffu, d_s_error, j);
      const Element* k_row = k_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) {
          dq_acc[i] += d_s_j * to_double(k_row[c]);
          dq_error[i] += d_s_error_j * fabs(to_double(k_row[c]));
        }
      }
    }
  }
  if (lane == 0) row_stats[row_index] = {log_sum_exp, row_dot, row_dot_error, sigma_max};
  for (int i = 0; i < kColumnsPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < head_dim) {
      const double value = scale * dq_acc[i];
      dq[row_index * head_dim + c] = float(value);
      dq_bound[row_index * head_dim + c] = float(scale * dq_error[i] + error.u * fabs(value) + error.stored_tau);
    }
  }
}

// One warp per key j (key_index = slice * N_k + j), after the row kernel: dV_j = sum_i P_ij dO_i
// and dK_j = scale sum_i dS_ij Q_i over the N query rows, with P_ij = exp(s_ij - L_i) and
// dS_ij = P_ij (dP_ij - D_i), and their bounds. Lane l takes rows l, l + 32, ... A row that does
// not see key j adds nothing (a padded key, one past every row's diagonal: dK_j = dV_j = 0).
template <typename Element>
__global__ void reference_backward_keys_fp64(const Element* q, const Element* k, const Element* v,
                                             const Element* d_o, const RowStats* row_stats,
                                             GpuGradients out, int64_t keys_total, int tokens,
                                             int kv_tokens, int head_dim, double scale,
                                             ErrorModel error, KeyMask mask) {
  __shared__ double k_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  __shared__ double v_rows[kWarpsPerBlock][kGpuReferenceMaxHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t key_index = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (key_index >= keys_total) return;
  const int64_t slice = key_index / kv_tokens;
  const int key = int(key_index % kv_tokens);
  const int64_t slice_row0 = slice * int64_t(tokens);  // of Q, dO and the row statistics
  const Element* q_slice = q + slice_row0 * head_dim;
  const Element* d_o_slice = d_o + slice_row0 * head_dim;
  double* k_row = k_rows[warp];
  double* v_row = v_rows[warp];
  load_row(k_row, k + key_index * head_dim, head_dim, lane);
  load_row(v_row, v + key_index * head_dim, head_dim, lane);

  double dk_acc[kColumnsPerLane] = {}, dv_acc[kColumnsPerLane] = {};
  double dk_error[kColumnsPerLane] = {}, dv_error[kColumnsPerLane] = {};
  for (int chunk = 0; chunk < tokens; chunk += kWarpSize) {
    const int row = chunk + lane;
    double p = 0.0, d_s = 0.0, w = 0.0, d_s_error = 0.0;
    if (row < tokens && mask.sees(slice, row, key)) {  // so L_i is finite: the row sees a key
      const RowStats stats = row_stats[slice_row0 + row];
      const Element* q_row = q_slice + int64_t(row) * head_dim;
      const Element* d_o_row = d_o_slice + int64_t(row) * head_dim;
      p = exp(__dmul_rn(scale, dot_with(k_row, q_row, head_dim)) - stats.log_sum_exp);
      const double d_p_minus_d = dot_with(v_row, d_o_row, head_dim) - stats.row_dot;
      d_s = p * d_p_minus_d;
      const double rho = error.head_dim * error.fp32 * (scale * abs_dot_with(k_row, q_row, head_dim) + stats.sigma_max);
      const double p_error = p * (rho + error.u) + error.tau;
      w = p_error + error.longest_sum * error.fp32 * p;
      const double d_p_error = error.head_dim * error.fp32 * abs_dot_with(v_row, d_o_row, head_dim);
      d_s_error = p_error * fabs(d_p_minus_d) + p * (d_p_error + stats.row_dot_error) +
                  (error.u + error.longest_sum * error.fp32) * fabs(d_s) + error.tau;
    }
    const int chunk_rows = min(kWarpSize, tokens - chunk);
    for (int j = 0; j < chunk_rows; ++j) {
      const double p_j = __shfl_sync(0xffffffffu, p, j);
      const double d_s_j = __shfl_sync(0xffffffffu, d_s, j);
      const double w_j = __shfl_sync(0xffffffffu, w, j);
      const double d_s_error_j = __shfl_sync(0xffffffffu, d_s_error, j);
      const Element* q_row = q_slice + int64_t(chunk + j) * head_dim;
      const Element* d_o_row = d_o_slice + int64_t(chunk + j) * head_dim;
      for (int i = 0; i < kColumnsPerLane; ++i) {
        const int c = lane + i * kWarpSize;
        if (c < head_dim) {
          const double d_o_value = to_double(d_o_row[c]), q_value = to_double(q_row[c]);
          dv_acc[i] += p_j * d_o_value;
          dk_acc[i] += d_s_j * q_value;
          dv_error[i] += w_j * fabs(d_o_value);
          dk_error[i] += d_s_error_j * fabs(q_value);
        }
      }
    }
  }
  for (int i = 0; i < kColumnsPerLane; ++i) {
    const int c = lane + i * kWarpSize;
    if (c < head_dim) {
      const int64_t at = key_index * head_dim + c;
      const double dk_value = scale * dk_acc[i];
      out.dk[at] = float(dk_value);
      out.dv[at] = float(dv_acc[i]);
      out.dk_bound[at] = float(scale * dk_error[i] + error.u * fabs(dk_value) + error.stored_tau);
      out.dv_bound[at] = float(dv_error[i] + error.u * fabs(dv_acc[i]) + error.stored_tau);
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
  return std::size_t(shape.slices() * shape.tokens) * sizeof(RowStats);
}

void launch_gpu_backward_reference(const __half* q, const __half* k, const __half* v,
                                   const __half* d_o, const uint8_t* key_padding_mask,
                                   const GpuGradients& out, double* row_stats, const Shape& shape,
                                   double scale, cudaStream_t stream) {
  check_head_dim(shape);
  const int64_t rows_total = shape.slices() * shape.tokens, keys_total = shape.slices() * shape.keys();
  const Rounding rounding = rounding_of(shape.dtype);
  const ErrorModel error{rounding.u, rounding.tau, rounding.stored_tau, rounding.fp32,
                         double(std::max(shape.tokens, shape.keys())), double(shape.head_dim)};
  const KeyMask mask{key_padding_mask, int(shape.heads), int(shape.keys()),
                     shape.causal != Causal::none, shape.diagonal()};
  auto* stats = reinterpret_cast<RowStats*>(row_stats);
  auto blocks_for = [](int64_t warps) { return unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); };
  with_element_type(shape.dtype, [&](auto element) {
    using Element = decltype(element);
    const auto* q_in = reinterpret_cast<const Element*>(q);
    const auto* k_in = reinterpret_cast<const Element*>(k);
    const auto* v_in = reinterpret_cast<const Element*>(v);
    const auto* d_o_in = reinterpret_cast<const Element*>(d_o);
    reference_backward_rows_fp64<<<blocks_for(rows_total), kWarpsPerBlock * kWarpSize, 0, stream>>>(
        q_in, k_in, v_in, d_o_in, out.dq, out.dq_bound, stats, rows_total, int(shape.tokens),
        int(shape.keys()), int(shape.head_dim), scale, error, mask);
    CUDA_CHECK_LAUNCH();
    reference_backward_keys_fp64<<<blocks_for(keys_total), kWarpsPerBlock * kWarpSize, 0, stream>>>(
        q_in, k_in, v_in, d_o_in, stats, out, keys_total, int(shape.tokens), int(shape.keys()),
        int(shape.head_dim), scale, error, mask);
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
        1.0 / std::sqrt(double(shape.head_dim)), shape.causal != Causal::none, int(shape.diagonal()));
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attn
