// Where a work tile's sequence lies: in a batch of sequences of one length, tensors
// [B, H, N, D], sequence b is batch element b; in a batch of sequences of different lengths packed
// one after another (FlashAttention's varlen layout, step.hpp's PackedSequences), tensors
// [total, H, D], sequence b is rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1.
//
// A kernel walks work tiles of (sequence, head, row tile) either way; the span of the tile's
// sequence tells it where the tensor maps find its rows (row coordinate and batch coordinate),
// how many queries and keys it has (the mask policy's kv_tokens and diagonal, and the rows an
// epilogue may write), and nothing else changes: a packed sequence is one more mask, whose keys
// stop at its own length, and one more bound on the rows written.
#pragma once

#include <cstdint>

#include "policies/mask.cuh"

namespace policies {

struct SequenceSpan {
  int q_start;   // its first query row in the tensors' row coordinate: 0, or cu_seqlens_q[b]
  int kv_start;  // its first key: 0, or cu_seqlens_k[b]
  int tokens;    // its queries
  int kv_tokens;  // its keys
  int batch;     // the tensors' batch coordinate: b, or 0 when packed
};

template <bool kPacked>
struct Sequences;

// Sequences of one length: every span is the batch element's whole slice, and every sequence
// has the launch's mask.
template <>
struct Sequences<false> {
  __host__ __device__ __forceinline__ SequenceSpan of(int b, int tokens, int kv_tokens) const {
    return {0, 0, tokens, kv_tokens, b};
  }
  template <bool kCausal>
  __host__ __device__ __forceinline__ Mask<kCausal> mask(const SequenceSpan&,
                                                         const Mask<kCausal>& launch_mask) const {
    return launch_mask;
  }
};

// Packed sequences: the prefix sums say where each begins, and its length (the walk over them,
// PackedScheduler, is policies/tile_scheduler.cuh's).
template <>
struct Sequences<true> {
  const int32_t* cu_seqlens_q;  // [B + 1] on the device
  const int32_t* cu_seqlens_k;
  bool bottom_right;  // where a causal diagonal starts (problem.hpp's Causal)
  __device__ __forceinline__ SequenceSpan of(int b, int, int) const {
    const int q_start = __ldg(cu_seqlens_q + b), kv_start = __ldg(cu_seqlens_k + b);
    return {q_start, kv_start, __ldg(cu_seqlens_q + b + 1) - q_start,
            __ldg(cu_seqlens_k + b + 1) - kv_start, 0};
  }
  // The sequence's own mask: its keys, and under a causal mask its own diagonal (0 at the top
  // left, N_k - N at the bottom right, with N and N_k the sequence's lengths).
  template <bool kCausal>
  __host__ __device__ __forceinline__ Mask<kCausal> mask(const SequenceSpan& span,
                                                         const Mask<kCausal>&) const {
    return {span.kv_tokens, bottom_right ? span.kv_tokens - span.tokens : 0};
  }
};

}  // namespace policies
