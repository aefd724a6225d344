// The step contract. Every step is one .cu file that holds its kernel(s), one launch function
// with the signature below, and one ATTN_REGISTER_STEP line that says what it serves. The
// harness (parsing, data, reference, timing, checking, reporting) finds it in the registry,
// so a step file holds nothing but its idea.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "problem.hpp"

namespace attn {

// What a launch gets: device pointers to [B, H, N, D] fp16 tensors and the sizes.
struct AttentionArgs {
  const __half* q = nullptr;
  const __half* k = nullptr;
  const __half* v = nullptr;
  __half* o = nullptr;
  int batch = 0;
  int heads = 0;
  int tokens = 0;
  int head_dim = 0;
  void* workspace = nullptr;  // workspace_bytes(shape) bytes, when the step asks for any
  cudaStream_t stream = nullptr;
};

using LaunchFn = void (*)(const AttentionArgs&);
using WorkspaceFn = std::size_t (*)(const Shape&);

enum class StepKind { step, baseline };

struct StepInfo {
  std::string id;                  // "v0", "v1", ... (given by CMake), or a baseline's name
  std::string title;               // one line: the idea of the step
  std::vector<int> head_dims;      // the head dims it serves
  int max_tokens = 0;              // largest N it serves; 0 means any N
  LaunchFn launch = nullptr;
  WorkspaceFn workspace_bytes = nullptr;  // scratch the launch needs; nullptr means none
  StepKind kind = StepKind::step;

  // Why this step refuses the shape, in one line that names the flag; nothing if it serves it.
  std::optional<std::string> refuses(const Shape& shape) const;
  std::size_t workspace_for(const Shape& shape) const {
    return workspace_bytes ? workspace_bytes(shape) : 0;
  }
};

// The registry, filled before main() by the ATTN_REGISTER_STEP lines of the linked steps,
// sorted by id (v0 < v1 < ... < v10, then the baselines).
bool register_step(StepInfo info);
const std::vector<StepInfo>& registered_steps();
const StepInfo* find_step(const std::string& id);

}  // namespace attn

// ATTN_STEP_ID is set per step by CMake's add_step(), so a step file never names itself.
#define ATTN_REGISTER_STEP(...)                                          \
  namespace {                                                            \
  const bool attn_step_registered_ = ::attn::register_step(__VA_ARGS__); \
  }
