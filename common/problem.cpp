#include "problem.hpp"

namespace attn {

std::string Shape::str() const {
  return "B=" + std::to_string(batch) + " H=" + std::to_string(heads) +
         " N=" + std::to_string(tokens) + " D=" + std::to_string(head_dim);
}

int64_t vit_tokens(int64_t image, int64_t patch) {
  const int64_t side = image / patch;
  return side * side + 1;
}

}  // namespace attn
