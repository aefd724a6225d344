// The helpers step 6 introduced and the later steps keep: fp16 (or bf16) pairs for the A operand of a
// tensor-core product (P packed from the S accumulators), 2^x in one instruction, and a row's
// log-sum-exp from what the online softmax keeps. steps/ampere/ holds the device code of the
// mma.sync generation that several steps share (steps 6 and 9, and steps/hopper/ for the packing).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fragment_math {

__device__ __forceinline__ uint32_t pack_half2(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// The same for either 16-bit type (Element: __half or __nv_bfloat16), rounding to nearest.
template <typename Element>
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    return pack_half2(low, high);
  }
}

// One value of Element from a float, and a packed pair of them back to floats.
template <typename Element>
__device__ __forceinline__ Element from_float(float value) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __float2bfloat16(value);
  } else {
    return __float2half(value);
  }
}
template <typename Element>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  }
}

// ex2.approx: one special-function instruction; exp(x) is fast_exp2(x * log2(e)), with log2(e)
// folded into the softmax's scale.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// L = log(sum_j exp(s_j)) of one row, s = q K^T / sqrt(D), from the online softmax's state:
// row_max in raw score units (before the scale) and row_sum = sum_j 2^((raw_j - row_max) *
// scale_log2), the whole row's. L = ln 2 * (row_max * scale_log2 + log2(row_sum)). Once per row,
// so the accurate log2f, not an approximation.
__device__ __forceinline__ float log_sum_exp(float row_max, float row_sum, float scale_log2) {
  constexpr float kLn2 = 0.693147180559945309f;
  return kLn2 * fmaf(row_max, scale_log2, log2f(row_sum));
}

}  // namespace fragment_math
