// What a step's launch code picks at run time, each in one place: the tile shape of a head dim
// from the step's tile table, and a kernel's compile-time variants from run-time flags.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace attn {

// A step's tile table: one tile type per head dim it serves, each with a `static constexpr int
// kHeadDim`. The registration's head dims, the launch and the shared-memory bytes all read it,
// so a head dim is served, or tuned, in one line.
template <typename... Shapes>
struct TileTable {
  static std::vector<int> head_dims() { return {Shapes::kHeadDim...}; }

  // Calls body(Shape{}) with the tile shape of this head dim.
  template <typename Body>
  static void with_shape(int64_t head_dim, Body&& body) {
    const bool found = ((head_dim == Shapes::kHeadDim && (body(Shapes{}), true)) || ...);
    // The harness refuses a head dim outside the registration's first, so this is a bug.
    if (!found) throw std::logic_error("no tile shape for head dim " + std::to_string(head_dim));
  }
};

// Calls body(std::bool_constant<flag>{}...) with each run-time flag as a compile-time one and
// returns what it returns: a kernel's variants picked in one place, e.g.
//   auto kernel = with_flags([](auto lse, auto masked) {
//     return my_kernel<decltype(lse)::value, decltype(masked)::value>;
//   }, args.log_sum_exp != nullptr, args.key_padding_mask != nullptr);
template <typename Body>
decltype(auto) with_flags(Body&& body) {
  return body();
}

template <typename Body, typename... Flags>
decltype(auto) with_flags(Body&& body, bool flag, Flags... flags) {
  if (flag) return with_flags([&](auto... rest) { return body(std::true_type{}, rest...); }, flags...);
  return with_flags([&](auto... rest) { return body(std::false_type{}, rest...); }, flags...);
}

}  // namespace attn
