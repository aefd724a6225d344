// The step contract. Every step is one .cu file that holds its kernel(s), one launch function
// with the signature below, and one ATTN_REGISTER_STEP line that says what it serves. The
// harness (parsing, data, reference, timing, checking, reporting) finds it in the registry,
// so a step file holds nothing but its idea.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "problem.hpp"

namespace attn {

// Element strides of a [B, H, N, D] tensor whose rows of D values are contiguous: between
// batches, between heads and between tokens. All zero, the default, means contiguous.
struct TensorStrides {
  int64_t batch = 0, head = 0, token = 0;
  bool contiguous() const { return batch == 0 && head == 0 && token == 0; }
};

// The strides in use: contiguous ones (H*N*D, N*D, D) when none are given.
inline TensorStrides actual_strides(TensorStrides given, int64_t heads, int64_t tokens,
                                    int64_t head_dim) {
  if (!given.contiguous()) return given;
  return {heads * tokens * head_dim, tokens * head_dim, head_dim};
}

// Sequences of different lengths packed one after another (Shape::lengths), FlashAttention's
// varlen layout: Q and O are [total_tokens, H, D], K and V [total_kv_tokens, H, D], row r of
// sequence b lies at row cu_seqlens_q[b] + r (of K and V: cu_seqlens_k[b] + r), and each sequence
// attends within itself. cu_seqlens_q and cu_seqlens_k are device int32 prefix sums of the
// lengths, [batch + 1], starting at 0. The strides (AttentionArgs) then give the token and head
// strides of these tensors; all zero means contiguous, (H D, D).
struct PackedSequences {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int total_tokens = 0;     // rows of Q and O
  int total_kv_tokens = 0;  // rows of K and V
  bool packed() const { return cu_seqlens_q != nullptr; }
};

// What a launch gets: device pointers to [B, H, N, D] tensors and the sizes. The pointers are
// typed for fp16, the tutorial's type; with dtype bf16 (a step whose StepInfo lists it) they
// point at __nv_bfloat16 data, and the step reads them as such.
struct AttentionArgs {
  const __half* q = nullptr;
  const __half* k = nullptr;
  const __half* v = nullptr;
  __half* o = nullptr;
  DType dtype = DType::fp16;
  // [B, N_k] bytes, 1 where a key is padding and gets no weight, or nullptr (none), for a step
  // whose StepInfo says takes_key_padding_mask. A row with no key left: O = 0, L = -inf.
  const uint8_t* key_padding_mask = nullptr;
  // A causal mask (problem.hpp), for a step whose StepInfo says takes_causal: query i sees key j
  // only where j <= i + causal_diagonal(causal, tokens, kv_tokens).
  Causal causal = Causal::none;
  // [B, H, N] fp32, or nullptr: each row's L = log(sum_j exp(s_j)) of its scaled scores
  // s = q K^T / sqrt(D), what a backward pass needs to rebuild P. Written by a step whose StepInfo
  // says writes_log_sum_exp when not null; the inference path leaves it null and pays nothing.
  // For packed sequences, [H, total_tokens].
  float* log_sum_exp = nullptr;
  // Packed sequences, for a step whose StepInfo says takes_packed_sequences: then batch is the
  // number of sequences, tokens and kv_tokens the longest query and key lengths.
  PackedSequences sequences;
  int batch = 0;
  int heads = 0;
  int tokens = 0;
  int kv_tokens = 0;  // keys and values per slice, N_k: K and V are [B, H, N_k, D]; = tokens but
                      // for a step whose StepInfo says takes_kv_tokens (cross-attention)
  int head_dim = 0;
  // The factor on the scores, s = scale * q K^T: 1/sqrt(D) as the harness sets it (attention_args),
  // another value when a caller asks (the C ABI's and PyTorch's `scale`). Every step honours it.
  double scale = 0.0;
  void* workspace = nullptr;  // workspace_bytes(shape) bytes, when the step asks for any
  cudaStream_t stream = nullptr;
  // Views instead of contiguous tensors (Q, K and V sliced out of one packed projection, O
  // written straight into [B, N, H*D]), for a step whose StepInfo says takes_strides.
  TensorStrides qkv_strides;  // shared by Q, K and V
  TensorStrides o_strides;
  // A testing aid: a step with persistent blocks (one per SM, each walking several work tiles)
  // launches at most this many, so that tests see every block run several tiles on any GPU.
  // 0: no cap (ATTN_TEST_PERSISTENT_BLOCKS sets it for the step executables and the bench).
  int max_persistent_blocks = 0;
};

// The arguments of a launch on contiguous tensors (no views), the harness's and the C ABI's.
inline AttentionArgs attention_args(const Shape& shape, const __half* q, const __half* k,
                                    const __half* v, __half* o, void* workspace,
                                    cudaStream_t stream) {
  AttentionArgs args;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.batch = int(shape.batch);
  args.heads = int(shape.heads);
  args.tokens = int(shape.tokens);
  args.kv_tokens = int(shape.keys());
  args.head_dim = int(shape.head_dim);
  args.dtype = shape.dtype;
  args.causal = shape.causal;
  args.scale = 1.0 / std::sqrt(double(shape.head_dim));
  args.workspace = workspace;
  args.stream = stream;
  return args;
}

// What a backward step gets: the forward's inputs and outputs, dO, and where dQ, dK and dV go,
// [B, H, N, D] fp16 (contiguous; K, V, dK and dV [B, H, N_k, D]); L is the forward's
// log-sum-exp, [B, H, N] fp32. With S = scale Q K^T and P = exp(S - L): dV = P^T dO,
// dS = P o (dO V^T - D) with D_i = dO_i . O_i, dQ = scale dS K, dK = scale dS^T Q
// (reference/backward_reference.hpp).
struct BackwardArgs {
  const __half* q = nullptr;
  const __half* k = nullptr;
  const __half* v = nullptr;
  const __half* o = nullptr;
  const __half* d_o = nullptr;
  const float* log_sum_exp = nullptr;
  __half* dq = nullptr;
  __half* dk = nullptr;
  __half* dv = nullptr;
  int batch = 0;
  int heads = 0;
  int tokens = 0;
  int kv_tokens = 0;  // N_k, as in AttentionArgs: K, V, dK and dV are [B, H, N_k, D]; = tokens
                      // but for a step whose StepInfo says takes_kv_tokens
  int head_dim = 0;
  DType dtype = DType::fp16;  // as in AttentionArgs: bf16 data behind the fp16-typed pointers
  double scale = 0.0;         // 1/sqrt(D) as the harness sets it
  void* workspace = nullptr;  // workspace_bytes(shape) bytes
  cudaStream_t stream = nullptr;
  // No atomics, no sum whose order depends on which block comes first: the same bits on every
  // run (slower; step 9 computes dQ in a pass of its own).
  bool deterministic = false;
  // The forward's causal mask (AttentionArgs), for a step whose StepInfo says takes_causal: P is
  // 0 above the diagonal, so are those entries of dS, and the tiles there are skipped.
  Causal causal = Causal::none;
  // The forward's key-padding mask (AttentionArgs), [B, N_k] bytes or nullptr, for a step whose
  // StepInfo says takes_key_padding_mask: a padded key gets P = 0, so dK = dV = 0 for it and it
  // adds nothing to dQ; a row that sees no key (L = -inf) gets dQ = 0 and adds nothing.
  const uint8_t* key_padding_mask = nullptr;
  // Views instead of contiguous tensors, for a step whose StepInfo says takes_strides: Q, K and V
  // as the forward read them (one packed projection), O as the forward wrote it, dO as autograd
  // hands it over. dQ, dK and dV are always contiguous.
  TensorStrides qkv_strides;  // shared by Q, K and V
  TensorStrides o_strides;
  TensorStrides d_o_strides;
  // Packed sequences, as in AttentionArgs, for a step whose StepInfo says takes_packed_sequences:
  // Q, O, dO and dQ are [total_tokens, H, D], K, V, dK and dV [total_kv_tokens, H, D] (dQ, dK
  // and dV contiguous), L [H, total_tokens]; batch is the number of sequences, tokens and
  // kv_tokens the longest lengths, and no key-padding mask is given.
  PackedSequences sequences;
};

// Where a backward launch's tensors lie (contiguous [B, H, N, D], L [B, H, N]).
struct BackwardTensors {
  const __half* q;
  const __half* k;
  const __half* v;
  const __half* o;
  const __half* d_o;
  const float* log_sum_exp;
  __half* dq;
  __half* dk;
  __half* dv;
};

// The arguments of a backward launch, the harness's and the C ABI's, as attention_args is the
// forward's: the shape's sizes, dtype and causal mask; scale 1/sqrt(D) unless one (> 0) is given.
inline BackwardArgs backward_args(const Shape& shape, const BackwardTensors& tensors,
                                  void* workspace, cudaStream_t stream, bool deterministic,
                                  double scale = 0.0) {
  BackwardArgs args;
  args.q = tensors.q;
  args.k = tensors.k;
  args.v = tensors.v;
  args.o = tensors.o;
  args.d_o = tensors.d_o;
  args.log_sum_exp = tensors.log_sum_exp;
  args.dq = tensors.dq;
  args.dk = tensors.dk;
  args.dv = tensors.dv;
  args.batch = int(shape.batch);
  args.heads = int(shape.heads);
  args.tokens = int(shape.tokens);
  args.kv_tokens = int(shape.keys());
  args.head_dim = int(shape.head_dim);
  args.dtype = shape.dtype;
  args.scale = scale > 0.0 ? scale : 1.0 / std::sqrt(double(shape.head_dim));
  args.workspace = workspace;
  args.stream = stream;
  args.deterministic = deterministic;
  args.causal = shape.causal;
  return args;
}

// The tiles a step cuts the sequence into at a head dim: along the queries (rows of a block or of
// a warpgroup's share) and along the keys (a K/V tile, or the keys a block owns in a backward).
// Sizes at an exact multiple of a tile, or one short of or past one, are where a tail mask or a
// tile count goes wrong; the GPU suite tests N = k x tile and k x tile +- 1 for each of them.
struct TileSizes {
  std::vector<int> rows, keys;
};
using TileSizesFn = TileSizes (*)(int head_dim);

using LaunchFn = void (*)(const AttentionArgs&);
using BackwardLaunchFn = void (*)(const BackwardArgs&);
using WorkspaceFn = std::size_t (*)(const Shape&);
using SharedBytesFn = std::size_t (*)(const Shape&);
// The checked build of the Hopper pipeline (steps/hopper/checked.cuh): the first protocol rule
// broken since the last call, as one line, or nothing.
using PipelineReportFn = std::optional<std::string> (*)();

// Shared-memory limits are searched up to this N; a step whose needs still fit there serves any N.
constexpr int64_t kLargestTokensProbed = int64_t(1) << 30;

// What a GPU allows, read off it once by the harness (open_device) and judged by refuses().
struct DeviceLimits {
  std::string name;
  int compute_capability = 0;             // 10 * major + minor: 90 on an H100
  std::size_t shared_bytes_per_block = 0;  // the opt-in limit of dynamic shared memory per block
};

// The opt-in shared memory per block of the GPUs students have, with their compute capabilities
// (0 ends the list): the columns of `bench --gpu-table`, README's "Which GPU do I need".
struct SharedBudget {
  std::size_t bytes;
  const char* label;     // "99 KB"
  const char* gpus;      // "RTX 30xx/40xx/50xx, A10, L4"
  int capabilities[4];  // of those GPUs: 86, 89, 120
};
inline constexpr SharedBudget kSharedBudgets[] = {
    {65536, "64 KB", "T4, RTX 20xx", {75, 0}},
    {101376, "99 KB", "RTX 30xx/40xx/50xx, A10, L4", {86, 89, 120, 0}},
    {166912, "163 KB", "A100", {80, 0}},
    {232448, "227 KB", "H100, H200", {90, 0}},
};

// A backward step computes dQ, dK and dV (launch_backward) after the forward step it names
// (forward_step) wrote O and L; it has no forward launch of its own. A backward baseline is one
// that is not a step (eager_backward): measured beside the steps, never chosen to serve.
enum class StepKind { step, baseline, backward, backward_baseline };
inline bool is_backward(StepKind kind) {
  return kind == StepKind::backward || kind == StepKind::backward_baseline;
}
inline bool is_baseline(StepKind kind) {
  return kind == StepKind::baseline || kind == StepKind::backward_baseline;
}

struct StepInfo {
  std::string id;                  // "v0", "v1", ... (given by CMake), or a baseline's name
  std::string title;               // one line: the idea of the step
  std::vector<int> head_dims;      // the head dims it serves
  // The GPUs whose instructions it uses: 75 (any GPU CUDA 13 builds for), 80 (cp.async,
  // mma.sync.m16n8k16), 90 (TMA, wgmma). max 0: every newer GPU too; 90: Hopper alone
  // (sm_90a code runs on compute capability 9.0 and nothing else).
  int min_compute_capability = 75;
  int max_compute_capability = 0;
  SharedBytesFn shared_bytes = nullptr;  // dynamic shared memory per block at a shape; nullptr: none
  LaunchFn launch = nullptr;
  WorkspaceFn workspace_bytes = nullptr;  // scratch the launch needs; nullptr means none
  StepKind kind = StepKind::step;
  bool takes_strides = false;  // reads and writes strided views (AttentionArgs, BackwardArgs), not only contiguous
  PipelineReportFn pipeline_report = nullptr;  // set by steps built with the checked pipeline
  bool writes_log_sum_exp = false;  // fills AttentionArgs::log_sum_exp when asked
  BackwardLaunchFn launch_backward = nullptr;  // a backward step's launch (kind backward)
  std::string forward_step = "";  // a backward step's forward: the step that writes its O and L
  std::vector<DType> dtypes = {DType::fp16};  // the element types it takes (AttentionArgs::dtype)
  bool takes_kv_tokens = false;  // serves N_k != N (cross-attention: AttentionArgs::kv_tokens)
  bool takes_key_padding_mask = false;  // honours AttentionArgs::key_padding_mask
  bool takes_causal = false;  // honours AttentionArgs::causal (or BackwardArgs::causal), both alignments
  bool takes_packed_sequences = false;  // honours AttentionArgs::sequences (or BackwardArgs::sequences): varlen batches
  TileSizesFn tile_sizes = nullptr;  // nullptr: no tiles along N (one thread per output, v0)
  // A backward step with a deterministic mode (BackwardArgs::deterministic).
  bool has_deterministic_mode = false;

  // The registration names each fact it sets, starting from step_info() or one of its siblings
  // below (C++17 has no designated initializers):
  //   ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID, "title", launch_flash)
  //                          .serving(TileTable::head_dims(), {DType::fp16, DType::bf16})
  //                          .with_shared_bytes(shared_bytes_needed).with_tiles(tile_sizes)
  //                          .writing_log_sum_exp().taking_causal())
  // The GPUs it runs on and a backward step's forward are not among them: the step folder's
  // step.cmake declares those, for the build and for this registration alike (ATTN_REGISTER_STEP).
  StepInfo serving(std::vector<int> dims, std::vector<DType> types = {DType::fp16}) && {
    head_dims = std::move(dims);
    dtypes = std::move(types);
    return std::move(*this);
  }
  StepInfo with_shared_bytes(SharedBytesFn bytes) && {
    shared_bytes = bytes;
    return std::move(*this);
  }
  StepInfo with_workspace(WorkspaceFn bytes) && {
    workspace_bytes = bytes;
    return std::move(*this);
  }
  StepInfo with_tiles(TileSizesFn sizes) && {
    tile_sizes = sizes;
    return std::move(*this);
  }
  StepInfo with_pipeline_report(PipelineReportFn report) && {
    pipeline_report = report;
    return std::move(*this);
  }
  StepInfo taking_strides() && {
    takes_strides = true;
    return std::move(*this);
  }
  StepInfo writing_log_sum_exp() && {
    writes_log_sum_exp = true;
    return std::move(*this);
  }
  StepInfo taking_kv_tokens() && {
    takes_kv_tokens = true;
    return std::move(*this);
  }
  StepInfo taking_key_padding_mask() && {
    takes_key_padding_mask = true;
    return std::move(*this);
  }
  StepInfo taking_causal() && {
    takes_causal = true;
    return std::move(*this);
  }
  StepInfo taking_packed_sequences() && {
    takes_packed_sequences = true;
    return std::move(*this);
  }
  StepInfo with_deterministic_mode() && {
    has_deterministic_mode = true;
    return std::move(*this);
  }
  // From the build (ATTN_REGISTER_STEP): the compute capability range and a backward's forward.
  StepInfo built_for(int min_capability, int max_capability, std::string forward) && {
    min_compute_capability = min_capability;
    max_compute_capability = max_capability;
    forward_step = std::move(forward);
    return std::move(*this);
  }
  TileSizes tiles(int head_dim) const { return tile_sizes ? tile_sizes(head_dim) : TileSizes{}; }

  // Why this step refuses the shape on any GPU (a head dim or a dtype it does not serve), in one
  // line that names the flag; nothing if it serves it.
  std::optional<std::string> refuses(const Shape& shape) const;
  // Why it cannot run on this GPU at all (its compute capability), or nothing.
  std::optional<std::string> refuses_device(const DeviceLimits& device) const;
  // Everything: the shape, the GPU, and the shared memory the shape needs against its limit.
  std::optional<std::string> refuses(const Shape& shape, const DeviceLimits& device) const;
  // The largest N served at head dim D within `shared_budget` bytes per block: nullopt when
  // every N fits, 0 when none does. Shared memory grows with N or not at all.
  std::optional<int64_t> max_tokens(int64_t head_dim, std::size_t shared_budget) const;
  // Its compute capability range for people and for bench --list: "7.5+", "9.0" (that one
  // alone), "8.0-8.9".
  std::string compute_capability_range() const;
  std::size_t shared_bytes_for(const Shape& shape) const {
    return shared_bytes ? shared_bytes(shape) : 0;
  }
  std::size_t workspace_for(const Shape& shape) const {
    return workspace_bytes ? workspace_bytes(shape) : 0;
  }
};

// Where a registration starts: a forward step, a backward step (launch_backward; its forward from
// step.cmake), a baseline measured beside the steps (never chosen to serve a call), a backward one.
inline StepInfo step_info(std::string id, std::string title, LaunchFn launch) {
  StepInfo info;
  info.id = std::move(id);
  info.title = std::move(title);
  info.launch = launch;
  return info;
}
inline StepInfo backward_step_info(std::string id, std::string title, BackwardLaunchFn launch) {
  StepInfo info;
  info.id = std::move(id);
  info.title = std::move(title);
  info.kind = StepKind::backward;
  info.launch_backward = launch;
  return info;
}
inline StepInfo baseline_info(std::string id, std::string title, LaunchFn launch) {
  StepInfo info = step_info(std::move(id), std::move(title), launch);
  info.kind = StepKind::baseline;
  return info;
}
inline StepInfo backward_baseline_info(std::string id, std::string title, BackwardLaunchFn launch) {
  StepInfo info = backward_step_info(std::move(id), std::move(title), launch);
  info.kind = StepKind::backward_baseline;
  return info;
}

// 90 -> "9.0".
std::string compute_capability_text(int value);
// {64, 128} -> "64, 128" with ", ", "64,128" with ",".
std::string join_numbers(const std::vector<int>& values, const std::string& separator);
// {fp16, bf16} -> "fp16, bf16".
std::string dtype_names(const std::vector<DType>& dtypes);

// The registry, filled before main() by the ATTN_REGISTER_STEP lines of the linked steps,
// sorted by id (v0 < v1 < ... < v10, then the baselines).
bool register_step(StepInfo info);
const std::vector<StepInfo>& registered_steps();
const StepInfo* find_step(const std::string& id);

}  // namespace attn

// ATTN_STEP_ID is set per step by CMake's add_step(), so a step file never names itself; so are
// the facts of the step folder's step.cmake (ATTN_STEP_MIN_CC, ATTN_STEP_MAX_CC,
// ATTN_STEP_FORWARD), which the registration takes from here. Code built outside a step folder
// (the baselines) keeps StepInfo's defaults. The variable's name carries the line, so one file
// may register two (the eager forward and backward).
#ifdef ATTN_STEP_MIN_CC
#define ATTN_STEP_BUILT_FOR(...) (__VA_ARGS__).built_for(ATTN_STEP_MIN_CC, ATTN_STEP_MAX_CC, ATTN_STEP_FORWARD)
#else
#define ATTN_STEP_BUILT_FOR(...) (__VA_ARGS__)
#endif
#define ATTN_CONCAT_INNER(a, b) a##b
#define ATTN_CONCAT(a, b) ATTN_CONCAT_INNER(a, b)
#define ATTN_REGISTER_STEP(...)                                                              \
  namespace {                                                                                \
  const bool ATTN_CONCAT(attn_step_registered_, __LINE__) =                                  \
      ::attn::register_step(ATTN_STEP_BUILT_FOR(__VA_ARGS__));                              \
  }
