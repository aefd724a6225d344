#include "problem.hpp"

#include <algorithm>

namespace attn {

std::string dtype_name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

std::string causal_name(Causal causal) {
  switch (causal) {
    case Causal::top_left: return "top-left";
    case Causal::bottom_right: return "bottom-right";
    default: return "none";
  }
}

// fp16 and self-attention, the defaults, are not named, so every existing line reads as before.
std::string Shape::str() const {
  std::string sizes = "B=" + std::to_string(batch) + " H=" + std::to_string(heads) + " N=" +
                      std::to_string(tokens);
  if (packed()) {  // "B=3 H=16 N=577 (lengths 197,577,50)"
    std::string list;
    for (std::size_t b = 0; b < lengths.size() && b < 8; ++b) list += (b ? "," : "") + std::to_string(lengths[b]);
    if (lengths.size() > 8) list += ",... " + std::to_string(total_tokens()) + " tokens";
    sizes += " (lengths " + list + ")";
  }
  return sizes + (cross() ? " Nk=" + std::to_string(keys()) : "") +
         " D=" + std::to_string(head_dim) + (dtype == DType::fp16 ? "" : " " + dtype_name(dtype)) +
         (key_padding ? " padded" : "") +
         (causal == Causal::none ? "" : causal == Causal::top_left ? " causal" : " causal-bottom-right");
}

int64_t Shape::total_tokens() const {
  if (!packed()) return batch * tokens;
  int64_t total = 0;
  for (int64_t length : lengths) total += length;
  return total;
}

namespace {

// The (query, key) pairs of a slice of n queries and nk keys whose score counts.
double pairs_seen(Causal causal, int64_t tokens, int64_t nk) {
  if (causal == Causal::none) return double(tokens) * double(nk);
  // Query i sees min(N_k, max(0, i + diagonal + 1)) keys: a sum of three pieces, rows that see
  // none, rows on the slope (an arithmetic series), rows that see all N_k.
  const int64_t d = causal_diagonal(causal, tokens, nk);
  const int64_t first_seeing = std::clamp<int64_t>(-d, 0, tokens);          // first with a key
  const int64_t first_full = std::clamp<int64_t>(nk - 1 - d, first_seeing, tokens);  // with all
  double pairs = 0.0;
  if (first_full > first_seeing) {  // rows [first_seeing, first_full) see i + d + 1 keys each
    const double a = double(first_seeing + d + 1), b = double(first_full - 1 + d + 1);
    pairs += (a + b) * double(first_full - first_seeing) / 2.0;
  }
  pairs += double(tokens - first_full) * double(nk);
  return pairs;
}

}  // namespace

double Shape::visible_pairs() const { return pairs_seen(causal, tokens, keys()); }

double Shape::flops() const {
  if (!packed()) return 4.0 * double(slices()) * visible_pairs() * double(head_dim);
  double pairs = 0.0;
  for (int64_t length : lengths) pairs += pairs_seen(causal, length, length);
  return 4.0 * double(heads) * pairs * double(head_dim);
}

double Shape::min_bytes() const {
  if (!packed()) return 2.0 * (2.0 * double(elements()) + 2.0 * double(kv_elements()));
  return 2.0 * 4.0 * double(total_tokens()) * double(heads) * double(head_dim);
}

int64_t vit_tokens(int64_t image, int64_t patch) {
  const int64_t side = image / patch;
  return side * side + 1;
}

}  // namespace attn
