#include "problem.hpp"

namespace attn {

std::string dtype_name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

// fp16 and self-attention, the defaults, are not named, so every existing line reads as before.
std::string Shape::str() const {
  return "B=" + std::to_string(batch) + " H=" + std::to_string(heads) +
         " N=" + std::to_string(tokens) + (cross() ? " Nk=" + std::to_string(keys()) : "") +
         " D=" + std::to_string(head_dim) + (dtype == DType::fp16 ? "" : " " + dtype_name(dtype)) +
         (key_padding ? " padded" : "");
}

int64_t vit_tokens(int64_t image, int64_t patch) {
  const int64_t side = image / patch;
  return side * side + 1;
}

}  // namespace attn
