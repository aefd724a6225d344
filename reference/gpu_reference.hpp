// The GPU reference: attention for every (b, h) slice, so that every output element of every
// run is checked, not only the slices the CPU reference samples.
//
// Why this reference and not v0's kernel or cuBLAS: it must not share a step's weaknesses, and
// its own error must be far below the tolerance (check.hpp) on every input the tests use. v0
// rounds O to fp16 and sums in fp32; cuBLAS would round S to fp16 or need an N x N fp32 buffer,
// and its fp16 GEMMs accumulate in the tensor cores' own way. The stress inputs (scores in the
// hundreds) are the hard case: a score is a sum of D products of about 256 each, so an fp32 dot
// product is off by ~5e-3 before the 1/sqrt(D) scale, and exp() turns that into a relative error
// of ~6e-4 in P, a third of the 4u tolerance. So this kernel takes the fp16 inputs exactly,
// multiplies and accumulates in fp64 (scores, the row maximum, the exponentials, the row sum and
// P V), and rounds once, to fp32, at the end: its error is ~1e-7 relative, far below fp16's
// u = 4.9e-4. One warp per query row, plain loads: simple enough to trust at a glance, and fast
// enough (tens of milliseconds at the largest tested shapes on an H100).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "problem.hpp"

namespace attn {

// O = softmax(Q K^T / sqrt(D)) V for every slice of `shape` (its N queries, its N_k keys), from
// device [B, H, N, D] (Q) and [B, H, N_k, D] (K, V) contiguous
// tensors of shape.dtype (fp16, or bf16 behind the same pointer type, as AttentionArgs has them) into `out` (device, [B, H, N, D] fp32), on `stream`. Any N >= 1, D <= 256.
// `log_sum_exp` (device, [B, H, N] fp32, or nullptr) receives each row's L = log(sum_j exp(s_j)),
// s = q K^T / sqrt(D).
// `key_padding_mask` (device, [B, N_k] bytes, 1: padding; or nullptr): those keys get no
// weight, as do the keys past a row's causal diagonal (shape.causal), and a row with none left
// is O = 0, L = -inf, as in the CPU reference.
void launch_gpu_reference(const __half* q, const __half* k, const __half* v,
                          const uint8_t* key_padding_mask, float* out, float* log_sum_exp,
                          const Shape& shape, cudaStream_t stream);

constexpr int kGpuReferenceMaxHeadDim = 256;

// The backward's GPU reference, in the same way: dQ, dK and dV for every slice from device Q, dO
// ([B, H, N, D]), K and V ([B, H, N_k, D]) of shape.dtype, all arithmetic in fp64
// (backward_reference.hpp has the maths), and beside each gradient the bound on a correct
// kernel's error in it that the CPU reference gives (SliceGradients). `key_padding_mask` (device,
// [B, N_k] bytes, 1: padding; or nullptr) and shape.causal (either alignment) mask keys as in
// the forward: a masked pair has P = 0 and dS = 0, a row that sees no key has L = -inf and dQ = 0
// and adds nothing, a key no row sees has dK = dV = 0 (never a NaN). `row_stats` is device
// scratch of gpu_backward_reference_scratch_bytes(shape). Any N, N_k >= 1, D <= 256. Two
// kernels: one warp per query row (its L, D, their bounds and dQ), then one warp per key (dK
// and dV, over the N rows).
struct GpuGradients {  // device fp32: dQ and its bound [B, H, N, D], the others [B, H, N_k, D]
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* dq_bound = nullptr;
  float* dk_bound = nullptr;
  float* dv_bound = nullptr;
};
void launch_gpu_backward_reference(const __half* q, const __half* k, const __half* v,
                                   const __half* d_o, const uint8_t* key_padding_mask,
                                   const GpuGradients& out, double* row_stats, const Shape& shape,
                                   double scale, cudaStream_t stream);
std::size_t gpu_backward_reference_scratch_bytes(const Shape& shape);

}  // namespace attn
