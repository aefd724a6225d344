// The "eager" baseline: attention as a framework runs it op by op, with cuBLAS.
//   1. S = Q K^T / sqrt(D)   batched GEMM, S written to device memory (N x N per slice, fp16)
//   2. P = softmax(S)        one warp per row, reads S and writes P in place
//   3. O = P V               batched GEMM, reads P back
// S is N/D times larger than Q, K, V and O: at N = 1025, D = 64 the scores are 16x the
// inputs, written once and read twice. This is the memory wall the later steps take down.
//
// And its backward, "eager_backward" (chapter 15's eager row), as a framework's autograd runs
// it with P in device memory (dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO):
//   1. S = scale Q K^T         GEMM, fp32 scores        2. P = exp(S - L)     fp16, N x N
//   3. dV = P^T dO             GEMM                     4. dP = dO V^T        GEMM, fp32 (S's memory)
//   5. dS = P o (dP - D)       D_i = sum_j P_ij dP_ij, per row, dS over P in place
//   6. dQ = scale dS K         GEMM                     7. dK = scale dS^T Q  GEMM
// A framework saves P in the forward; the step contract hands a backward L instead, so P is
// rebuilt once (1, 2), and from there every product reads it, or dS, from device memory.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <cmath>
#include <map>
#include <mutex>

#include "cuda_check.hpp"
#include "step.hpp"

namespace {

constexpr int kWarpSize = 32;
constexpr int kRowsPerBlock = 8;  // one warp per row

// Row softmax in place on fp16 scores, math in fp32: max, then sum of exp, then normalise.
__global__ void softmax_rows(__half* scores, int64_t rows, int columns) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  __half* s = scores + row * columns;
  const int lane = threadIdx.x;

  float row_max = -INFINITY;
  for (int j = lane; j < columns; j += kWarpSize) row_max = fmaxf(row_max, __half2float(s[j]));
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, offset));
  }
  float row_sum = 0.0f;
  for (int j = lane; j < columns; j += kWarpSize) row_sum += __expf(__half2float(s[j]) - row_max);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, offset);
  }
  const float inverse_sum = 1.0f / row_sum;
  for (int j = lane; j < columns; j += kWarpSize) {
    s[j] = __float2half(__expf(__half2float(s[j]) - row_max) * inverse_sum);
  }
}

// P = exp(S - L) by rows: fp32 scores (already scaled) to fp16 probabilities.
__global__ void probabilities_from_log_sum_exp(const float* scores, const float* log_sum_exp,
                                               __half* probabilities, int64_t rows, int columns) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const float row_log_sum_exp = log_sum_exp[row];
  for (int j = threadIdx.x; j < columns; j += kWarpSize) {
    probabilities[row * columns + j] = __float2half(__expf(scores[row * columns + j] - row_log_sum_exp));
  }
}

// The softmax's backward by rows, in place: dS = P o (dP - D) over P, D_i = sum_j P_ij dP_ij.
__global__ void softmax_backward_rows(__half* probabilities, const float* d_p, int64_t rows,
                                      int columns) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  __half* p = probabilities + row * columns;
  const float* d_p_row = d_p + row * columns;
  float row_dot = 0.0f;
  for (int j = threadIdx.x; j < columns; j += kWarpSize) row_dot += __half2float(p[j]) * d_p_row[j];
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    row_dot += __shfl_xor_sync(0xffffffffu, row_dot, offset);
  }
  for (int j = threadIdx.x; j < columns; j += kWarpSize) {
    p[j] = __float2half(__half2float(p[j]) * (d_p_row[j] - row_dot));
  }
}

cublasHandle_t handle_for(cudaStream_t stream) {
  // One handle per device (a cuBLAS handle belongs to the device that was current when it was
  // made), created on first use there (before timing: the runner warms up first). Callers that
  // launch from several threads serialise the launches (capi/ does), since the stream is set
  // on the shared handle.
  static std::mutex mutex;
  static std::map<int, cublasHandle_t> handles;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  cublasHandle_t& handle = handles[device];
  if (handle == nullptr) CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  return handle;
}

std::size_t scores_bytes(const attn::Shape& shape) {
  return std::size_t(shape.slices()) * std::size_t(shape.tokens) * std::size_t(shape.tokens) *
         sizeof(__half);
}

void launch_eager(const attn::AttentionArgs& args) {
  const int n = args.tokens, d = args.head_dim, slices = args.batch * args.heads;
  auto* scores = static_cast<__half*>(args.workspace);
  cublasHandle_t handle = handle_for(args.stream);
  const float scale = float(args.scale), one = 1.0f, zero = 0.0f;

  // cuBLAS is column-major: a row-major [N, D] matrix is a column-major D x N one. Row-major
  // S = Q K^T is column-major S^T = K Q^T, i.e. op(K^T)=T applied to the D x N "K^T" view.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, &scale, args.k, CUDA_R_16F, d, int64_t(n) * d,
      args.q, CUDA_R_16F, d, int64_t(n) * d, &zero, scores, CUDA_R_16F, n, int64_t(n) * n, slices,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));

  const int64_t rows = int64_t(slices) * n;
  softmax_rows<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), dim3(kWarpSize, kRowsPerBlock),
                 0, args.stream>>>(scores, rows, n);
  CUDA_CHECK_LAUNCH();

  // Row-major O = P V is column-major O^T = V^T P^T: V^T is the D x N view of V, P^T the
  // N x N view of P.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, d, n, n, &one, args.v, CUDA_R_16F, d, int64_t(n) * d,
      scores, CUDA_R_16F, n, int64_t(n) * n, &zero, args.o, CUDA_R_16F, d, int64_t(n) * d, slices,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// fp32 scores (reused for dP), then fp16 P (reused for dS).
std::size_t backward_scores_bytes(const attn::Shape& shape) {
  return std::size_t(shape.slices()) * std::size_t(shape.tokens) * std::size_t(shape.tokens) *
         (sizeof(float) + sizeof(__half));
}

void launch_eager_backward(const attn::BackwardArgs& args) {
  const int n = args.tokens, d = args.head_dim, slices = args.batch * args.heads;
  const int64_t square = int64_t(n) * n, matrix = int64_t(n) * d;
  auto* scores = static_cast<float*>(args.workspace);  // S, then dP
  auto* probabilities = reinterpret_cast<__half*>(scores + square * slices);  // P, then dS
  cublasHandle_t handle = handle_for(args.stream);
  const float scale = float(args.scale), one = 1.0f, zero = 0.0f;
  const int64_t rows = int64_t(slices) * n;
  const unsigned row_blocks = unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);

  // Row-major X [r, c] is column-major X^T, as in launch_eager. S = scale Q K^T (fp32).
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, &scale, args.k, CUDA_R_16F, d, matrix, args.q,
      CUDA_R_16F, d, matrix, &zero, scores, CUDA_R_32F, n, square, slices, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
  probabilities_from_log_sum_exp<<<row_blocks, dim3(kWarpSize, kRowsPerBlock), 0, args.stream>>>(
      scores, args.log_sum_exp, probabilities, rows, n);
  CUDA_CHECK_LAUNCH();
  // dV = P^T dO: column-major dV^T = dO^T P, P being the transpose of P's column-major view.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_T, d, n, n, &one, args.d_o, CUDA_R_16F, d, matrix,
      probabilities, CUDA_R_16F, n, square, &zero, args.dv, CUDA_R_16F, d, matrix, slices,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  // dP = dO V^T (fp32, over S), as S = Q K^T was.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, &one, args.v, CUDA_R_16F, d, matrix, args.d_o,
      CUDA_R_16F, d, matrix, &zero, scores, CUDA_R_32F, n, square, slices, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
  softmax_backward_rows<<<row_blocks, dim3(kWarpSize, kRowsPerBlock), 0, args.stream>>>(
      probabilities, scores, rows, n);
  CUDA_CHECK_LAUNCH();
  // dQ = scale dS K, as O = P V was; dK = scale dS^T Q, as dV = P^T dO was.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, d, n, n, &scale, args.k, CUDA_R_16F, d, matrix,
      probabilities, CUDA_R_16F, n, square, &zero, args.dq, CUDA_R_16F, d, matrix, slices,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_T, d, n, n, &scale, args.q, CUDA_R_16F, d, matrix,
      probabilities, CUDA_R_16F, n, square, &zero, args.dk, CUDA_R_16F, d, matrix, slices,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

ATTN_REGISTER_STEP(attn::baseline_info("eager",
                                       "cuBLAS eager baseline: GEMM -> softmax -> GEMM, N x N scores in device memory",
                                       launch_eager)
                       .serving({32, 64, 80, 128})
                       .with_workspace(scores_bytes))

// Its forward is v6 (which writes L) in the step programs and the suite, so it needs v6's GPUs;
// the C ABI takes L from any step that writes it.
ATTN_REGISTER_STEP(attn::backward_baseline_info("eager_backward",
                                                "cuBLAS eager backward: P and dS (N x N) in device memory, five GEMMs",
                                                launch_eager_backward)
                       .serving({32, 64, 80, 128})
                       .with_workspace(backward_scores_bytes)
                       .with_deterministic_mode()  // cuBLAS GEMMs and a softmax: no atomics
                       .built_for(80, 0, "v6"))
