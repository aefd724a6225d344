// The "eager" baseline: attention as a framework runs it op by op, with cuBLAS.
//   1. S = Q K^T / sqrt(D)   batched GEMM, S written to device memory (N x N per slice, fp16)
//   2. P = softmax(S)        one warp per row, reads S and writes P in place
//   3. O = P V               batched GEMM, reads P back
// S is N/D times larger than Q, K, V and O: at N = 1025, D = 64 the scores are 16x the
// inputs, written once and read twice. This is the memory wall the later steps take down.
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

ATTN_REGISTER_STEP(attn::StepInfo{"eager",
                                  "cuBLAS eager baseline: GEMM -> softmax -> GEMM, N x N scores in device memory",
                                  {32, 64, 80, 128},
                                  75,
                                  0,
                                  nullptr,
                                  launch_eager,
                                  scores_bytes,
                                  attn::StepKind::baseline})
