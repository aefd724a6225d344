// Two helpers step 6 introduced and the later steps keep: fp16 pairs for the A operand of a
// tensor-core product (P packed from the S accumulators), and 2^x in one instruction.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace fragment_math {

__device__ __forceinline__ uint32_t pack_half2(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// ex2.approx: one special-function instruction; exp(x) is fast_exp2(x * log2(e)), with log2(e)
// folded into the softmax's scale.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fragment_math
