// The problem on the host, as the references read it: Q, K, V and the key-padding mask (the
// harness draws them: harness/inputs.hpp), and the loop the references and the harness split
// across the machine's cores.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "problem.hpp"

namespace attn {

// Q, K and V on the host, [B, H, N, D] each, in fp16 containers whatever shape.dtype says: the
// values are drawn in the shape's dtype, and a bf16 value (8 significant bits) is an fp16 value
// exactly as long as it lies in fp16's range, as every drawn value does (|x| < 200). The harness
// converts them to bf16 on the way to the GPU; the references read the same numbers.
struct HostTensors {
  Shape shape;
  std::vector<__half> q, k, v;  // Q [B, H, N, D]; K and V [B, H, N_k, D]
  // [B, N_k], 1 where a key is padding (it gets no weight), with Shape::key_padding, or past its
  // sequence's end for packed sequences (Shape::lengths); else empty.
  // Drawn as a DETR batch pads its images: the keys are a grid of ceil(sqrt(N_k)) columns, and
  // batch element b keeps a top-left block of it, smaller for some b, so the valid keys are not a
  // prefix. Every batch element keeps key 0.
  std::vector<uint8_t> key_padding_mask;
};

// Runs body(begin, end) over [0, count) split across the machine's cores.
template <typename Body>
void parallel_for(int64_t count, Body body);

}  // namespace attn

#include "parallel_for.inl"
