// Step v0: naive attention. One thread computes one output element o[b, h, i, c].
//
// The thread walks the whole row i of scores twice: once for the row maximum (the softmax is
// computed stably, exp(s - max)), once to accumulate the exponentials and their weighted sum
// of V's column c. Everything is fp32 in registers; nothing is shared. Each score is
// recomputed by all D threads of a row, twice: about 2*D times the FLOPs the problem needs,
// and every Q, K, V element is fetched from global memory (or cache) over and over.
// It is correct for any N and D, which makes it the yardstick for every later step. The keys and
// values may be fewer or more than the queries (cross-attention: N_k keys, AttentionArgs::kv_tokens),
// and a key-padding mask may take keys out of every row of a batch element (padded(j)); a row left
// with no key is O = 0. The mask has a kernel of its own (kMasked), as in steps 6 and 8, so the
// unmasked kernel pays nothing for it. Under a causal mask (kCausal) row i walks only the keys
// it sees, 0 .. i + diagonal: the mask policy (policies/mask.cuh) gives the row its key range.
#include <cuda_fp16.h>

#include <cmath>

#include "cuda_check.hpp"
#include "dispatch.hpp"
#include "policies/mask.cuh"
#include "step.hpp"

namespace {

constexpr int kThreadsPerBlock = 256;

template <bool kMasked, bool kCausal>
__global__ void naive_attention_kernel(const __half* q, const __half* k, const __half* v,
                                       __half* o, const uint8_t* key_padding, int64_t total,
                                       int heads, int tokens, policies::Mask<kCausal> mask,
                                       int head_dim, float scale) {
  const int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  // index = ((slice * N) + row) * D + column, matching the [B, H, N, D] layout of O.
  const int column = int(index % head_dim);
  const int64_t row_index = index / head_dim;  // slice * N + row
  const int kv_tokens = mask.kv_tokens;
  const int key_end = mask.key_end(int(row_index % tokens), 1);  // the keys this row sees: [0, key_end)
  const int64_t slice_offset = (row_index / tokens) * int64_t(kv_tokens) * head_dim;  // K's, V's
  const __half* q_row = q + row_index * head_dim;
  const __half* k_slice = k + slice_offset;
  const __half* v_slice = v + slice_offset;
  // Key j of this row's batch element is padding ([B, N_k] bytes, 1: padding; no mask: none is).
  const uint8_t* padding_row =
      kMasked ? key_padding + (row_index / tokens / heads) * kv_tokens : nullptr;
  auto padded = [&](int j) { return kMasked && padding_row[j] != 0; };

  // BEGIN EXERCISE: o[index] = softmax(q_row . K^T * scale) . V[:, column] over the keys j < key_end not padded(j), stable, fp32 (none left: 0)
  auto score = [&](int j) {
    float dot = 0.0f;
    for (int c = 0; c < head_dim; ++c) {
      dot += __half2float(q_row[c]) * __half2float(k_slice[int64_t(j) * head_dim + c]);
    }
    return dot * scale;
  };

  float row_max = -INFINITY;
  for (int j = 0; j < key_end; ++j) {
    if (!padded(j)) row_max = fmaxf(row_max, score(j));
  }

  float row_sum = 0.0f, weighted = 0.0f;
  for (int j = 0; j < key_end; ++j) {
    if (padded(j)) continue;  // no weight at all, not a small one
    const float p = expf(score(j) - row_max);
    row_sum += p;
    weighted += p * __half2float(v_slice[int64_t(j) * head_dim + column]);
  }
  o[index] = __float2half(row_sum > 0.0f ? weighted / row_sum : 0.0f);  // no key left: O = 0
  // END EXERCISE
}

void launch_naive(const attn::AttentionArgs& args) {
  const int64_t total = int64_t(args.batch) * args.heads * args.tokens * args.head_dim;
  const float scale = float(args.scale);
  const unsigned blocks = unsigned((total + kThreadsPerBlock - 1) / kThreadsPerBlock);
  const int diagonal = int(attn::causal_diagonal(args.causal, args.tokens, args.kv_tokens));
  attn::with_flags(
      [&](auto masked, auto causal) {
        constexpr bool kCausal = decltype(causal)::value;
        naive_attention_kernel<decltype(masked)::value, kCausal><<<blocks, kThreadsPerBlock, 0, args.stream>>>(
            args.q, args.k, args.v, args.o, args.key_padding_mask, total, args.heads, args.tokens,
            policies::Mask<kCausal>{args.kv_tokens, diagonal}, args.head_dim, scale);
      },
      args.key_padding_mask != nullptr, args.causal != attn::Causal::none);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID, "naive: one thread per output element", launch_naive)
                       .serving({32, 64, 80, 128})
                       .taking_kv_tokens()
                       .taking_key_padding_mask()
                       .taking_causal())
