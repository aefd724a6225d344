// The attention problem every step solves, O = softmax(Q K^T / sqrt(D)) V per (batch, head),
// and the counts the reports use. Q, K, V, O are 16-bit floats, fp16 unless the shape says bf16,
// laid out [B, H, N, D], row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {

// The element type of Q, K, V and O (and dO, dQ, dK, dV). fp16 keeps 11 significant bits in a
// narrow range (to 65504); bf16 keeps 8 bits in fp32's range, which is why training uses it.
enum class DType { fp16, bf16 };
std::string dtype_name(DType dtype);  // "fp16", "bf16": as --dtype takes it

// Causal attention: query i sees key j only where j <= i + diagonal. Where the diagonal starts
// is a convention: PyTorch's is_causal puts it at the top left (diagonal 0: query i sees keys
// 0..i), FlashAttention at the bottom right (diagonal N_k - N: the last query sees every key).
// With as many keys as queries the two agree. A query that sees no key (bottom right with
// N > N_k) gets O = 0 and L = -inf, as a row whose keys are all padding.
enum class Causal { none, top_left, bottom_right };
std::string causal_name(Causal causal);  // "none", "top-left", "bottom-right": as --causal-align
// The diagonal for N queries and N_k keys: the last key query i sees is i + diagonal.
constexpr int64_t causal_diagonal(Causal causal, int64_t tokens, int64_t kv_tokens) {
  return causal == Causal::bottom_right ? kv_tokens - tokens : 0;
}
// Its unit roundoff u: half the gap between 1 and the next number, 2^-11 and 2^-8.
constexpr double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? 0x1.0p-8 : 0x1.0p-11; }

// `tokens` (N) is the number of queries. Keys and values are as many (self-attention) unless
// kv_tokens says otherwise (cross-attention, as a DETR decoder's 100 queries attend to an image's
// 1050 positions): then Q and O are [B, H, N, D] and K and V [B, H, N_k, D]. key_padding: a
// [B, N_k] mask comes with the inputs, and the keys it marks get no weight (as PyTorch's
// key_padding_mask: images of different sizes padded to one, their padding marked). causal: a
// causal mask as well (Causal above), alone or with the padding.
struct Shape {
  int64_t batch = 32;
  int64_t heads = 12;
  int64_t tokens = 197;
  int64_t head_dim = 64;
  DType dtype = DType::fp16;
  int64_t kv_tokens = 0;  // N_k; 0 means N
  bool key_padding = false;
  Causal causal = Causal::none;
  std::vector<int64_t> lengths = {};  // packed sequences' lengths (see above); empty: none

  bool packed() const { return !lengths.empty(); }
  // Sequence b's queries (and keys, when packed): lengths[b], or N.
  int64_t length(int64_t b) const { return packed() ? lengths[std::size_t(b)] : tokens; }
  int64_t total_tokens() const;  // the queries of all sequences: sum of lengths, or B N
  int64_t keys() const { return kv_tokens > 0 ? kv_tokens : tokens; }  // N_k
  bool cross() const { return keys() != tokens; }
  int64_t diagonal() const { return causal_diagonal(causal, tokens, keys()); }
  // Whether query i sees key j under the causal mask (always, without one).
  bool sees(int64_t i, int64_t j) const { return causal == Causal::none || j <= i + diagonal(); }
  int64_t slices() const { return batch * heads; }                 // independent (b, h) problems
  int64_t elements() const { return slices() * tokens * head_dim; }  // of Q or O
  int64_t kv_elements() const { return slices() * keys() * head_dim; }  // of K or V
  // The (query, key) pairs of a slice whose score counts: N x N_k, or under a causal mask those
  // on or below the diagonal (about half at N = N_k, as FlashAttention counts them).
  double visible_pairs() const;
  // Two matrix products over those pairs per slice, D multiply-adds each, 2 FLOPs per one.
  // Packed sequences count each sequence's own pairs: the real tokens', never the padding's.
  double flops() const;
  // The fewest bytes any implementation must move: read Q, K, V and write O once, 2 bytes each
  // (of the real tokens, when packed).
  double min_bytes() const;
  std::string str() const;
};

// ViT token count for an image of `image` pixels cut into patch x patch squares, plus [CLS].
int64_t vit_tokens(int64_t image, int64_t patch);

}  // namespace attn
