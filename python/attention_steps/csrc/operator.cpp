// torch.ops.attention_steps.attention: the steps as a PyTorch operator, registered with the
// dispatcher in C++ and calling the C ABI of capi/attention_steps.h (libattention_steps.so, built
// by CMake) directly. What the ctypes bridge paid in Python per call (checks, a device context,
// the stream lookup, three ctypes calls) and what broke CUDA graphs (CUDA queries about pointers
// and streams) is gone: torch already knows each tensor's device, so the launch is told so
// (pointers_checked_by_caller) and makes no CUDA call but the kernel's.
//
//   attention(Tensor q, Tensor k, Tensor v, str step, float? scale=None,
//             Tensor? key_padding_mask=None, bool return_log_sum_exp=False) -> (Tensor, Tensor)
//
// Functional: it allocates O and L (L: [B, H, N] fp32, each row's log-sum-exp, when asked; an
// empty tensor otherwise). A step that takes views reads q, k and v where they are (a packed
// projection's slices, a sequence-first projection) and writes O into [B, N, H, D] memory, or
// [N, B, H, D] when q is sequence-first (its tokens lie farther apart than its batches), returned
// as a [B, H, N, D] view: O keeps q's order of batch and tokens, so the out-projection reads it
// without a copy. python/attention_steps/torch_op.py states the same strides for torch.compile
// (its fake implementation).
//
// Autograd: a C++ autograd function saves Q, K, V, O, L and the key-padding mask; its backward
// runs attention_backward with the backward step the library chooses for the call on this GPU
// (attn_choose_step, told N_k, the mask and the causal alignment: v10 on Hopper, v9 elsewhere),
// which rebuilds P from L. attention_backward is an operator of its own, so torch.compile traces
// the backward too:
//
//   attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor log_sum_exp,
//                      str step, float? scale=None, bool deterministic=False, str? causal=None,
//                      Tensor? key_padding_mask=None) -> (Tensor dq, Tensor dk, Tensor dv)
//
// dQ is shaped like q, dK and dV like k and v ([B, H, N_k, D]), all contiguous. Packed sequences
// of different lengths (FlashAttention's varlen layout; attention_steps.varlen checks the prefix
// sums first, and registers the backward below as varlen_attention's autograd):
//
//   varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
//                    int max_seqlen_q, int max_seqlen_k, str step, str? causal=None,
//                    float? scale=None, bool return_log_sum_exp=False) -> (Tensor, Tensor)
//   varlen_attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o,
//                             Tensor log_sum_exp, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
//                             int max_seqlen_q, int max_seqlen_k, str step, str? causal=None,
//                             float? scale=None, bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv)
//
// return O [total_q, H, D] (contiguous) and L [H, total_q], and dQ, dK, dV like q, k, v. A backward step
// that takes views reads q, k, v, o and d_o where they lie, as the forward step read and wrote
// them (no copy in the training path); for the others they are copied to contiguous tensors.
#include <ATen/cuda/CUDAContext.h>
#include <Python.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "attention_steps.h"

namespace {

// What the operator needs to know of a step, read once from the library.
struct StepFacts {
  bool takes_strides = false;
  bool uses_workspace = false;
  bool writes_log_sum_exp = false;
  bool is_backward = false;
};

// The library this operator was linked against must speak the header it was compiled with: the
// structs it fills (attn_launch_args, attn_backward_args) change with the version. Empty when it
// does, else the line to raise (PyInit__operator raises it as ImportError, the operator as
// RuntimeError).
std::string abi_mismatch() {
  const int loaded = attn_abi_version();
  if (loaded == ATTN_ABI_VERSION) return {};
  return "attention_steps: the operator was built against C ABI version " +
         std::to_string(ATTN_ABI_VERSION) + " (capi/attention_steps.h) but the library it loaded, "
         "libattention_steps.so, speaks version " + std::to_string(loaded) + "; rebuild both from "
         "one checkout (cmake --build build --target attention_steps, then pip install "
         "--no-build-isolation ./python)";
}

const std::unordered_map<std::string, StepFacts>& all_steps() {
  static const std::unordered_map<std::string, StepFacts> steps = [] {
    const std::string mismatch = abi_mismatch();
    TORCH_CHECK(mismatch.empty(), mismatch);
    std::unordered_map<std::string, StepFacts> found;
    for (int index = 0; index < attn_step_count(); ++index) {
      attn_step_info info{};
      if (attn_step_get(index, &info) != ATTN_OK) continue;
      found[info.id] = StepFacts{info.takes_strides != 0, info.uses_workspace != 0,
                                 info.writes_log_sum_exp != 0, info.is_backward != 0};
    }
    return found;
  }();
  return steps;
}

// The backward step autograd runs after the forward: the C ABI's choice (attn_choose_step) for
// this call on q's GPU, the one answer every layer gets. NotImplementedError, with each step's
// reason, where none serves it.
std::string backward_step_for(const at::Tensor& q, const at::Tensor& k, bool masked, int causal,
                              bool deterministic) {
  attn_call call{};
  call.backward = 1;
  call.batch = q.size(0);
  call.heads = q.size(1);
  call.tokens = q.size(2);
  call.head_dim = q.size(3);
  call.kv_tokens = k.size(2);
  call.dtype = q.scalar_type() == at::kBFloat16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_FP16;
  call.key_padding_mask = masked ? 1 : 0;
  call.causal = causal;
  call.deterministic = deterministic ? 1 : 0;
  const c10::cuda::CUDAGuard device_guard(q.device());
  char id[32] = {};
  char message[1024] = {};
  TORCH_CHECK_NOT_IMPLEMENTED(attn_choose_step(&call, id, sizeof id, message, sizeof message) == ATTN_OK,
                              "attention_steps: ", message, "; train with "
                              "torch.nn.functional.scaled_dot_product_attention");
  return id;
}

// "v6, v7, v8": the forward steps that write L, for messages.
std::string steps_writing_log_sum_exp() {
  std::string listed;
  for (int index = 0; index < attn_step_count(); ++index) {
    attn_step_info info{};
    if (attn_step_get(index, &info) == ATTN_OK && info.writes_log_sum_exp && !info.is_backward) {
      listed += (listed.empty() ? "" : ", ") + std::string(info.id);
    }
  }
  return listed;
}

const StepFacts& facts_of(const std::string& id) {
  const auto& steps = all_steps();
  const auto step = steps.find(id);
  if (step == steps.end()) {
    std::string known;
    for (int index = 0; index < attn_step_count(); ++index) {
      attn_step_info info{};
      if (attn_step_get(index, &info) == ATTN_OK) known += (known.empty() ? "" : ", ") + std::string(info.id);
    }
    TORCH_CHECK_VALUE(false, "attention_steps: unknown step '", id, "' (registered: ", known, ")");
  }
  return step->second;
}

// "[2, 65, 64]". Numbers go into the messages of failed checks as text made here
// (std::to_string), never streamed by the check itself: on the H100 machine (torch 2.11, Python
// 3.12, the operator built there) a check whose message streamed an integer crashed the process,
// twice (an IntArrayRef, then an int64_t), where every check that streamed only text, a dtype
// or a device raised its exception.
std::string shape_text(const at::Tensor& tensor) {
  std::string text = "[";
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) {
    text += (dim > 0 ? ", " : "") + std::to_string(tensor.size(dim));
  }
  return text + "]";
}

void check_tensor(const char* name, const at::Tensor& tensor, const at::Tensor& q) {
  TORCH_CHECK_VALUE(tensor.dim() == 4, "attention_steps: ", name,
                    " must have 4 dimensions [B, H, N, D]; it has shape ", shape_text(tensor));
  TORCH_CHECK_TYPE(tensor.scalar_type() == at::kHalf || tensor.scalar_type() == at::kBFloat16,
                   "attention_steps: ", name, " is ", tensor.scalar_type(),
                   "; the steps take torch.float16 and (some of them) torch.bfloat16");
  TORCH_CHECK_TYPE(tensor.scalar_type() == q.scalar_type(), "attention_steps: ", name, " is ",
                   tensor.scalar_type(), " and q is ", q.scalar_type(), "; give them one dtype");
  TORCH_CHECK_VALUE(tensor.is_cuda(), "attention_steps: ", name, " is on ", tensor.device(),
                    "; the steps run on CUDA tensors");
  TORCH_CHECK_VALUE(tensor.device() == q.device(), "attention_steps: q, k and v must be on one "
                    "device; ", name, " is on ", tensor.device(), ", q on ", q.device());
}

// The strides `tensors` share, for a step that reads views in place: rows of D contiguous,
// 16-byte aligned, and for each of batch, head and token one stride for every tensor whose
// dimension is longer than 1 (a dimension of size 1 has no meaningful stride: q of one token, the
// batch of 1; where all are of size 1, the first tensor's contiguous stride stands in), each a
// multiple of 8 elements and at least D, as the C ABI takes them. Nothing when they do not share
// one. q, k and v share one set (the forward's and the backward's qkv_strides); O and dO in the
// backward each have their own.
std::optional<attn_strides> shared_view_strides(std::initializer_list<const at::Tensor*> tensors) {
  const at::Tensor& first = **tensors.begin();
  const int64_t head_dim = first.size(3);
  for (const at::Tensor* tensor : tensors) {
    if (tensor->stride(3) != 1 && head_dim > 1) return std::nullopt;
    if (reinterpret_cast<std::uintptr_t>(tensor->data_ptr()) % 16 != 0) return std::nullopt;
  }
  const int64_t contiguous[3] = {first.size(1) * first.size(2) * head_dim, first.size(2) * head_dim,
                                 head_dim};
  int64_t shared[3];
  for (int dim = 0; dim < 3; ++dim) {
    std::optional<int64_t> stride;
    for (const at::Tensor* tensor : tensors) {
      if (tensor->size(dim) == 1) continue;
      if (stride && *stride != tensor->stride(dim)) return std::nullopt;
      stride = tensor->stride(dim);
    }
    shared[dim] = stride.value_or(contiguous[dim]);
    if (shared[dim] < head_dim || shared[dim] % 8 != 0) return std::nullopt;
  }
  return attn_strides{shared[0], shared[1], shared[2]};
}

// The scratch memory step `id` needs at this shape, from torch's caching allocator (stream-
// ordered like the tensors, and capture-safe), into the call's workspace fields; an undefined
// tensor when it needs none. The tensor must outlive the launch's queuing.
template <typename Call>
at::Tensor workspace_for(const std::string& id, const at::Tensor& q, Call& call) {
  size_t bytes = 0;
  if (attn_workspace_bytes(id.c_str(), q.size(0), q.size(1), q.size(2), q.size(3), &bytes, nullptr,
                           0) != ATTN_OK || bytes == 0) {
    return {};
  }
  at::Tensor workspace = at::empty({int64_t(bytes)}, q.options().dtype(at::kByte));
  call.workspace = workspace.data_ptr();
  call.workspace_bytes = bytes;
  return workspace;
}

// The C ABI's name for the tensors' element type (check_tensor allowed only these two).
int dtype_of(const at::Tensor& tensor) {
  return tensor.scalar_type() == at::kBFloat16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_FP16;
}

// The causal argument ("top-left", "bottom-right" or none) as the C ABI's ATTN_CAUSAL_*.
int causal_of(const std::optional<c10::string_view>& causal) {
  if (!causal.has_value()) return ATTN_CAUSAL_NONE;
  if (*causal == "top-left") return ATTN_CAUSAL_TOP_LEFT;
  if (*causal == "bottom-right") return ATTN_CAUSAL_BOTTOM_RIGHT;
  TORCH_CHECK_VALUE(false, "attention_steps: causal is '", std::string(*causal),
                    "'; it must be None, 'top-left' (as is_causal=True) or 'bottom-right'");
  return ATTN_CAUSAL_NONE;
}

// The key-padding mask as the C ABI takes it: [B, N_k] bool (True: padding), contiguous, on q's
// device; an undefined tensor when there is none.
at::Tensor padding_bytes(const std::optional<at::Tensor>& key_padding_mask, const at::Tensor& q,
                         const at::Tensor& k) {
  if (!key_padding_mask.has_value() || !key_padding_mask->defined()) return {};
  const at::Tensor& mask = *key_padding_mask;
  TORCH_CHECK_TYPE(mask.scalar_type() == at::kBool, "attention_steps: key_padding_mask is ",
                   mask.scalar_type(), "; it must be torch.bool (True: padding)");
  TORCH_CHECK_VALUE(mask.dim() == 2 && mask.size(0) == q.size(0) && mask.size(1) == k.size(2),
                    "attention_steps: key_padding_mask must be [B, N_k] = [",
                    std::to_string(q.size(0)), ", ", std::to_string(k.size(2)), "]; it has shape ",
                    shape_text(mask));
  TORCH_CHECK_VALUE(mask.device() == q.device(), "attention_steps: key_padding_mask is on ",
                    mask.device(), ", q on ", q.device());
  return mask.contiguous();
}

// Where no launch is needed: no query (nothing to write), or no key at all (every row sees none:
// O = 0 and L = -inf). Returns whether the call is answered.
bool answered_without_launch(const at::Tensor& o, const at::Tensor& log_sum_exp, int64_t queries,
                             int64_t keys) {
  if (queries == 0) return true;
  if (keys > 0) return false;
  o.zero_();
  log_sum_exp.fill_(-std::numeric_limits<float>::infinity());
  return true;
}

// The launch's tensors and the fields every call fills alike: torch's stream of q's device, whose
// tensors the library need not check (pointers_checked_by_caller), and q's dtype.
attn_launch_args launch_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& o, const at::Tensor& log_sum_exp,
                             bool return_log_sum_exp, std::optional<double> scale) {
  attn_launch_args call{};
  call.q = q.data_ptr();
  call.k = k.data_ptr();
  call.v = v.data_ptr();
  call.o = o.data_ptr();
  call.log_sum_exp = return_log_sum_exp ? log_sum_exp.data_ptr() : nullptr;
  call.scale = scale.value_or(0.0);
  call.stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  call.pointers_checked_by_caller = 1;
  call.dtype = dtype_of(q);
  return call;
}

// A refusal as ValueError, any other failure as RuntimeError, with the library's line.
void check_status(int status, const char* message) {
  TORCH_CHECK_VALUE(status != ATTN_REFUSED, "attention_steps: ", message);
  TORCH_CHECK(status == ATTN_OK, "attention_steps: ", message);
}

std::tuple<at::Tensor, at::Tensor> attention_kernel(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, c10::string_view step,
                                                  std::optional<double> scale,
                                                  const std::optional<at::Tensor>& key_padding_mask,
                                                  bool return_log_sum_exp,
                                                  std::optional<c10::string_view> causal) {
  const std::string id(step);
  const StepFacts& facts = facts_of(id);
  check_tensor("q", q, q);
  check_tensor("k", k, q);
  check_tensor("v", v, q);
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2), head_dim = q.size(3);
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "attention_steps: k and v must have one shape; got ",
                    shape_text(k), " and ", shape_text(v));
  TORCH_CHECK_VALUE(k.size(0) == batch && k.size(1) == heads && k.size(3) == head_dim,
                    "attention_steps: q ", shape_text(q), " and k ", shape_text(k),
                    " must agree in B, H and D");
  TORCH_CHECK_VALUE(!scale.has_value() || *scale > 0.0, "attention_steps: scale must be "
                    "positive; got ", std::to_string(scale.value_or(0.0)));
  TORCH_CHECK_VALUE(!return_log_sum_exp || facts.writes_log_sum_exp, "attention_steps: ", id,
                    " does not write L (the log-sum-exp); steps that do: ", steps_writing_log_sum_exp());

  const c10::cuda::CUDAGuard device_guard(q.device());
  // Views in place for a step that takes them, when q, k and v share strides; contiguous
  // copies otherwise (no copy at all for tensors that already are).
  const std::optional<attn_strides> strides =
      facts.takes_strides ? shared_view_strides({&q, &k, &v}) : std::nullopt;
  const at::Tensor q_in = strides ? q : q.contiguous();
  const at::Tensor k_in = strides ? k : k.contiguous();
  const at::Tensor v_in = strides ? v : v.contiguous();
  // O keeps q's order of batch and tokens for a step that writes views (the rule the fake
  // implementation in torch_op.py repeats): sequence-first when q's tokens lie farther apart than
  // its batches, as the heads of an [N, B, E] projection do.
  const bool sequence_first = batch > 1 && tokens > 1 && q.stride(2) > q.stride(0);
  const at::Tensor o =
      !facts.takes_strides ? at::empty({batch, heads, tokens, head_dim}, q.options())
      : sequence_first     ? at::empty({tokens, batch, heads, head_dim}, q.options()).permute({1, 2, 0, 3})
                           : at::empty({batch, tokens, heads, head_dim}, q.options()).transpose(1, 2);
  const at::Tensor log_sum_exp =
      at::empty(return_log_sum_exp ? at::IntArrayRef{batch, heads, tokens} : at::IntArrayRef{0},
                q.options().dtype(at::kFloat));
  if (answered_without_launch(o, log_sum_exp, q.numel(), k.numel())) return {o, log_sum_exp};

  attn_launch_args call = launch_args(q_in, k_in, v_in, o, log_sum_exp, return_log_sum_exp, scale);
  call.batch = batch;
  call.heads = heads;
  call.tokens = tokens;
  call.head_dim = head_dim;
  call.kv_tokens = k.size(2);
  const at::Tensor padding = padding_bytes(key_padding_mask, q, k);
  if (padding.defined()) call.key_padding_mask = padding.data_ptr();
  if (strides) call.qkv_strides = *strides;
  if (facts.takes_strides) call.o_strides = attn_strides{o.stride(0), o.stride(1), o.stride(2)};
  call.causal = causal_of(causal);
  const at::Tensor workspace = facts.uses_workspace ? workspace_for(id, q, call) : at::Tensor();
  char message[1024];
  check_status(attn_launch(id.c_str(), &call, message, sizeof message), message);
  return {o, log_sum_exp};
}

// varlen_attention: packed sequences of different lengths, FlashAttention's varlen layout. q and
// O are [total_q, H, D], k and v [total_k, H, D]; cu_seqlens_q and cu_seqlens_k are int32
// [S + 1] prefix sums on q's device, max_seqlen_q and max_seqlen_k the longest lengths. Returns
// O (contiguous) and L ([H, total_q] fp32, when return_log_sum_exp). The prefix sums are not read
// here (that would synchronise): attention_steps.varlen_attention checks them first.
void check_packed(const char* name, const at::Tensor& tensor, const at::Tensor& q) {
  TORCH_CHECK_VALUE(tensor.dim() == 3, "attention_steps: ", name,
                    " must have 3 dimensions [total, H, D] (packed sequences); it has shape ",
                    shape_text(tensor));
  TORCH_CHECK_TYPE(tensor.scalar_type() == at::kHalf || tensor.scalar_type() == at::kBFloat16,
                   "attention_steps: ", name, " is ", tensor.scalar_type(),
                   "; the steps take torch.float16 and torch.bfloat16");
  TORCH_CHECK_TYPE(tensor.scalar_type() == q.scalar_type(), "attention_steps: ", name, " is ",
                   tensor.scalar_type(), " and q is ", q.scalar_type(), "; give them one dtype");
  TORCH_CHECK_VALUE(tensor.is_cuda() && tensor.device() == q.device(), "attention_steps: ", name,
                    " is on ", tensor.device(), "; q, k and v must be CUDA tensors of one device");
}

void check_prefix_sums(const char* name, const at::Tensor& sums, const at::Tensor& q) {
  TORCH_CHECK_TYPE(sums.scalar_type() == at::kInt, "attention_steps: ", name, " is ",
                   sums.scalar_type(), "; it must be torch.int32");
  TORCH_CHECK_VALUE(sums.dim() == 1 && sums.size(0) >= 2, "attention_steps: ", name,
                    " must be [S + 1] prefix sums of S >= 1 lengths; it has shape ", shape_text(sums));
  TORCH_CHECK_VALUE(sums.device() == q.device(), "attention_steps: ", name, " is on ", sums.device(),
                    ", q on ", q.device(), "; the prefix sums go on q's GPU");
}

std::tuple<at::Tensor, at::Tensor> varlen_attention_kernel(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, c10::string_view step,
    std::optional<c10::string_view> causal, std::optional<double> scale, bool return_log_sum_exp) {
  const std::string id(step);
  const StepFacts& facts = facts_of(id);
  check_packed("q", q, q);
  check_packed("k", k, q);
  check_packed("v", v, q);
  check_prefix_sums("cu_seqlens_q", cu_seqlens_q, q);
  check_prefix_sums("cu_seqlens_k", cu_seqlens_k, q);
  TORCH_CHECK_VALUE(cu_seqlens_q.size(0) == cu_seqlens_k.size(0), "attention_steps: cu_seqlens_q ",
                    shape_text(cu_seqlens_q), " and cu_seqlens_k ", shape_text(cu_seqlens_k),
                    " must count the same sequences");
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "attention_steps: k and v must have one shape; got ",
                    shape_text(k), " and ", shape_text(v));
  TORCH_CHECK_VALUE(k.size(1) == q.size(1) && k.size(2) == q.size(2), "attention_steps: q ",
                    shape_text(q), " and k ", shape_text(k), " must agree in H and D");
  TORCH_CHECK_VALUE(!scale.has_value() || *scale > 0.0, "attention_steps: scale must be "
                    "positive; got ", std::to_string(scale.value_or(0.0)));
  TORCH_CHECK_VALUE(!return_log_sum_exp || facts.writes_log_sum_exp, "attention_steps: ", id,
                    " does not write L (the log-sum-exp); steps that do: ", steps_writing_log_sum_exp());
  const int64_t total = q.size(0), kv_total = k.size(0), heads = q.size(1), head_dim = q.size(2);
  const c10::cuda::CUDAGuard device_guard(q.device());
  // Rows of D contiguous and 16-byte aligned, one token and head stride for q, k and v (else
  // contiguous copies); O contiguous.
  auto in_place = [&](const at::Tensor& t) {
    return t.stride(2) == 1 && t.stride(0) == q.stride(0) && t.stride(1) == q.stride(1) &&
           reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 &&
           t.stride(1) % 8 == 0 && t.stride(0) >= head_dim && t.stride(1) >= head_dim;
  };
  const bool views = facts.takes_strides && in_place(q) && in_place(k) && in_place(v);
  const at::Tensor q_in = views ? q : q.contiguous();
  const at::Tensor k_in = views ? k : k.contiguous();
  const at::Tensor v_in = views ? v : v.contiguous();
  const at::Tensor o = at::empty({total, heads, head_dim}, q.options());
  const at::Tensor log_sum_exp = at::empty(return_log_sum_exp ? at::IntArrayRef{heads, total} : at::IntArrayRef{0},
                                           q.options().dtype(at::kFloat));
  if (answered_without_launch(o, log_sum_exp, total, kv_total)) return {o, log_sum_exp};
  attn_launch_args call = launch_args(q_in, k_in, v_in, o, log_sum_exp, return_log_sum_exp, scale);
  call.batch = cu_seqlens_q.size(0) - 1;
  call.heads = heads;
  call.tokens = max_seqlen_q;
  call.kv_tokens = max_seqlen_k;
  call.head_dim = head_dim;
  call.cu_seqlens_q = cu_seqlens_q.data_ptr();
  call.cu_seqlens_k = cu_seqlens_k.data_ptr();
  call.total_tokens = total;
  call.total_kv_tokens = kv_total;
  call.qkv_strides = attn_strides{0, q_in.stride(1), q_in.stride(0)};
  call.causal = causal_of(causal);
  char message[1024];
  check_status(attn_launch(id.c_str(), &call, message, sizeof message), message);
  return {o, log_sum_exp};
}

// What every backward call says: the tensors as the step will read them (q, k, v, o, d_o, L), the
// gradients it writes, the options, and q's device's current stream (its pointers vouched for).
attn_backward_args backward_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& o, const at::Tensor& d_o,
                                 const at::Tensor& log_sum_exp, const at::Tensor& dq,
                                 const at::Tensor& dk, const at::Tensor& dv,
                                 std::optional<double> scale, bool deterministic,
                                 std::optional<c10::string_view> causal) {
  attn_backward_args call{};
  call.q = q.data_ptr();
  call.k = k.data_ptr();
  call.v = v.data_ptr();
  call.o = o.data_ptr();
  call.d_o = d_o.data_ptr();
  call.log_sum_exp = log_sum_exp.data_ptr();
  call.dq = dq.data_ptr();
  call.dk = dk.data_ptr();
  call.dv = dv.data_ptr();
  call.scale = scale.value_or(0.0);
  call.stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  call.pointers_checked_by_caller = 1;
  call.deterministic = deterministic ? 1 : 0;
  call.dtype = dtype_of(q);
  call.causal = causal_of(causal);
  return call;
}

// varlen_attention_backward: dQ, dK, dV of packed sequences by backward step `step`, from dO and
// what varlen_attention returned (O and L [H, total_q]); dQ like q, dK and dV like k and v, all
// contiguous [total, H, D]. The workspace is the library's, stream-ordered (its size depends on
// the totals and the number of sequences, which attn_workspace_bytes does not take).
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_backward_kernel(
    const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& o, const at::Tensor& log_sum_exp, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, c10::string_view step,
    std::optional<c10::string_view> causal, std::optional<double> scale, bool deterministic) {
  const std::string id(step);
  const StepFacts& facts = facts_of(id);
  TORCH_CHECK_VALUE(facts.is_backward, "attention_steps: ", id, " is not a backward step");
  for (const auto& [name, tensor] : {std::pair<const char*, const at::Tensor*>{"d_o", &d_o},
                                     {"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}}) {
    check_packed(name, *tensor, q);
  }
  check_prefix_sums("cu_seqlens_q", cu_seqlens_q, q);
  check_prefix_sums("cu_seqlens_k", cu_seqlens_k, q);
  TORCH_CHECK_VALUE(o.sizes() == q.sizes() && d_o.sizes() == q.sizes() && k.sizes() == v.sizes() &&
                        k.size(1) == q.size(1) && k.size(2) == q.size(2),
                    "attention_steps: the packed backward takes q, o and d_o [total_q, H, D] and k, "
                    "v [total_k, H, D]; got ", shape_text(q), ", ", shape_text(o), ", ",
                    shape_text(d_o), ", ", shape_text(k), " and ", shape_text(v));
  TORCH_CHECK_VALUE(log_sum_exp.scalar_type() == at::kFloat && log_sum_exp.numel() == q.size(0) * q.size(1),
                    "attention_steps: the packed backward needs L, fp32 [H, total_q], from "
                    "varlen_attention");
  const c10::cuda::CUDAGuard device_guard(q.device());
  const int64_t total = q.size(0), kv_total = k.size(0);
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
             dv = at::empty(v.sizes(), v.options());
  if (total == 0 || kv_total == 0) return {dq.zero_(), dk.zero_(), dv.zero_()};  // nothing to compute
  // Rows of D contiguous and 16-byte aligned for the step's views; else contiguous copies.
  auto qualifies = [&](const at::Tensor& t) {
    return facts.takes_strides && t.stride(2) == 1 && reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0 &&
           t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(0) >= q.size(2) && t.stride(1) >= q.size(2);
  };
  const bool qkv_views = qualifies(q) && qualifies(k) && qualifies(v) && k.strides() == q.strides() &&
                         v.strides() == q.strides();
  const at::Tensor q_in = qkv_views ? q : q.contiguous(), k_in = qkv_views ? k : k.contiguous(),
                   v_in = qkv_views ? v : v.contiguous(), o_in = qualifies(o) ? o : o.contiguous(),
                   d_o_in = qualifies(d_o) ? d_o : d_o.contiguous(), lse_in = log_sum_exp.contiguous();
  attn_backward_args call = backward_call(q_in, k_in, v_in, o_in, d_o_in, lse_in, dq, dk, dv, scale,
                                          deterministic, causal);
  call.batch = cu_seqlens_q.size(0) - 1;
  call.heads = q.size(1);
  call.tokens = std::max<int64_t>(max_seqlen_q, 1);
  call.kv_tokens = std::max<int64_t>(max_seqlen_k, 1);
  call.head_dim = q.size(2);
  call.qkv_strides = attn_strides{0, q_in.stride(1), q_in.stride(0)};
  call.o_strides = attn_strides{0, o_in.stride(1), o_in.stride(0)};
  call.d_o_strides = attn_strides{0, d_o_in.stride(1), d_o_in.stride(0)};
  call.cu_seqlens_q = cu_seqlens_q.data_ptr();
  call.cu_seqlens_k = cu_seqlens_k.data_ptr();
  call.total_tokens = total;
  call.total_kv_tokens = kv_total;
  char message[1024];
  check_status(attn_launch_backward(id.c_str(), &call, message, sizeof message), message);
  return {dq, dk, dv};
}

// attention_backward: dQ, dK, dV by backward step `step` from dO and what the forward saved
// (its masks included). dQ like q, dK and dV like k and v: [B, H, N_k, D] in cross-attention.
// Which steps serve N_k != N or a mask is the library's to say: a step that does not refuses
// with its reason (ValueError).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_kernel(
    const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& o, const at::Tensor& log_sum_exp, c10::string_view step,
    std::optional<double> scale, bool deterministic, std::optional<c10::string_view> causal,
    const std::optional<at::Tensor>& key_padding_mask) {
  const std::string id(step);
  const StepFacts& facts = facts_of(id);
  TORCH_CHECK_VALUE(facts.is_backward, "attention_steps: ", id, " is not a backward step");
  for (const auto& [name, tensor] : {std::pair<const char*, const at::Tensor*>{"d_o", &d_o},
                                     {"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}}) {
    check_tensor(name, *tensor, q);
  }
  TORCH_CHECK_VALUE(o.sizes() == q.sizes() && d_o.sizes() == q.sizes(),
                    "attention_steps: the backward takes q, o and d_o of one shape; got ",
                    shape_text(q), ", ", shape_text(o), " and ", shape_text(d_o));
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                        k.size(3) == q.size(3),
                    "attention_steps: the backward takes k and v of one shape [B, H, N_k, D], "
                    "agreeing with q ", shape_text(q), " in B, H and D; got ", shape_text(k),
                    " and ", shape_text(v));
  TORCH_CHECK_VALUE(log_sum_exp.scalar_type() == at::kFloat && log_sum_exp.numel() == q.numel() / q.size(3),
                    "attention_steps: the backward needs L, fp32 [B, H, N], from a forward run "
                    "with return_log_sum_exp=True");
  const c10::cuda::CUDAGuard device_guard(q.device());
  const at::Tensor padding = padding_bytes(key_padding_mask, q, k);
  // dQ, dK and dV contiguous, whatever the inputs' strides (empty_like would keep a view's).
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
             dv = at::empty(v.sizes(), v.options());
  if (q.numel() == 0 || k.numel() == 0) {  // nothing to compute: no row, or no key to see
    return {dq.zero_(), dk.zero_(), dv.zero_()};
  }
  // A step that takes views reads the forward's where they lie (q, k and v sliced from a packed
  // projection or a sequence-first one, O as the forward wrote it) and dO as autograd hands it
  // over: q, k and v when they share strides, O and dO each when its own qualify. What does not
  // qualify, and everything for a step that reads contiguous tensors only, is copied (no copy at
  // all for tensors that already are contiguous).
  const std::optional<attn_strides> qkv_strides =
      facts.takes_strides ? shared_view_strides({&q, &k, &v}) : std::nullopt;
  const std::optional<attn_strides> o_strides =
      facts.takes_strides ? shared_view_strides({&o}) : std::nullopt;
  const std::optional<attn_strides> d_o_strides =
      facts.takes_strides ? shared_view_strides({&d_o}) : std::nullopt;
  const at::Tensor q_in = qkv_strides ? q : q.contiguous(), k_in = qkv_strides ? k : k.contiguous(),
                   v_in = qkv_strides ? v : v.contiguous(), o_in = o_strides ? o : o.contiguous(),
                   d_o_in = d_o_strides ? d_o : d_o.contiguous(), lse_in = log_sum_exp.contiguous();
  attn_backward_args call = backward_call(q_in, k_in, v_in, o_in, d_o_in, lse_in, dq, dk, dv, scale,
                                          deterministic, causal);
  call.batch = q.size(0);
  call.heads = q.size(1);
  call.tokens = q.size(2);
  call.head_dim = q.size(3);
  call.kv_tokens = k.size(2);
  call.key_padding_mask = padding.defined() ? padding.data_ptr() : nullptr;
  if (qkv_strides) call.qkv_strides = *qkv_strides;
  if (o_strides) call.o_strides = *o_strides;
  if (d_o_strides) call.d_o_strides = *d_o_strides;
  // Sized by attn_workspace_bytes, which knows N and not N_k: the backward steps' scratch (dQ's
  // fp32 sum and a row's D) grows with the queries alone. Were a step to need more for N_k, the
  // library would refuse the launch naming the bytes, never run short.
  const at::Tensor workspace = workspace_for(id, q, call);
  char message[1024];
  check_status(attn_launch_backward(id.c_str(), &call, message, sizeof message), message);
  return {dq, dk, dv};
}

// The autograd kernel: saves what a backward needs (Q, K, V, O, L and the key-padding mask); its
// backward runs the backward step the library chooses for the call (its N_k, mask and causal
// alignment included), or says in one line why none can.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const std::string& step,
                                                std::optional<double> scale,
                                                const std::optional<at::Tensor>& key_padding_mask,
                                                bool return_log_sum_exp,
                                                const std::optional<std::string>& causal) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("attention_steps::attention", "")
                               .typed<decltype(attention_kernel)>();
    const std::optional<c10::string_view> causal_view =
        causal ? std::optional<c10::string_view>(*causal) : std::nullopt;
    auto [o, log_sum_exp] =
        op.call(q, k, v, step, scale, key_padding_mask, return_log_sum_exp, causal_view);
    // The mask, or an undefined tensor (saved and given back as such): the backward needs it.
    const at::Tensor mask = key_padding_mask.has_value() ? *key_padding_mask : at::Tensor();
    context->save_for_backward({q, k, v, o, log_sum_exp, mask});
    context->saved_data["step"] = step;
    context->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    context->saved_data["causal"] = causal ? c10::IValue(*causal) : c10::IValue();
    context->mark_non_differentiable({log_sum_exp});
    return {o, log_sum_exp};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto saved = context->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4],
                     &mask = saved[5];
    const std::string step = context->saved_data["step"].toStringRef();
    const c10::IValue& causal = context->saved_data["causal"];
    // torch.use_deterministic_algorithms(True) asks for the same bits on every run.
    const bool deterministic = at::globalContext().deterministicAlgorithms();
    const std::string backward = backward_step_for(
        q, k, mask.defined(),
        causal.isNone() ? ATTN_CAUSAL_NONE : causal_of(c10::string_view(causal.toStringRef())),
        deterministic);
    TORCH_CHECK_NOT_IMPLEMENTED(lse.numel() > 0, "attention_steps: the forward (", step,
                                ") kept no L; call it with return_log_sum_exp=True, as "
                                "attention_steps.attention does when a gradient is needed");
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("attention_steps::attention_backward", "")
                               .typed<decltype(attention_backward_kernel)>();
    const c10::IValue& scale = context->saved_data["scale"];
    auto [dq, dk, dv] = op.call(grads[0], q, k, v, o, lse, backward,
                                scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()),
                                deterministic,
                                causal.isNone() ? std::nullopt
                                                : std::optional<c10::string_view>(causal.toStringRef()),
                                mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> attention_autograd(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, c10::string_view step,
                                                      std::optional<double> scale,
                                                      const std::optional<at::Tensor>& key_padding_mask,
                                                      bool return_log_sum_exp,
                                                      std::optional<c10::string_view> causal) {
  auto outputs = AttentionFunction::apply(
      q, k, v, std::string(step), scale, key_padding_mask, return_log_sum_exp,
      causal ? std::optional<std::string>(std::string(*causal)) : std::nullopt);
  return {outputs[0], outputs[1]};
}

}  // namespace

TORCH_LIBRARY(attention_steps, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, str step, float? scale=None, "
        "Tensor? key_padding_mask=None, bool return_log_sum_exp=False, str? causal=None) -> "
        "(Tensor, Tensor)");
  m.def("attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, "
        "Tensor log_sum_exp, str step, float? scale=None, bool deterministic=False, "
        "str? causal=None, Tensor? key_padding_mask=None) -> (Tensor, Tensor, Tensor)");
  m.def("varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, str step, str? causal=None, float? scale=None, "
        "bool return_log_sum_exp=False) -> (Tensor, Tensor)");
  m.def("varlen_attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, "
        "Tensor log_sum_exp, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
        "int max_seqlen_k, str step, str? causal=None, float? scale=None, "
        "bool deterministic=False) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attention_steps, CUDA, m) {
  m.impl("attention", &attention_kernel);
  m.impl("attention_backward", &attention_backward_kernel);
  m.impl("varlen_attention", &varlen_attention_kernel);
  m.impl("varlen_attention_backward", &varlen_attention_backward_kernel);
}

// On CPU tensors the same function, for its checks: "q is on cpu; the steps run on CUDA tensors"
// rather than the dispatcher's "could not run with arguments from the 'CPU' backend".
TORCH_LIBRARY_IMPL(attention_steps, CPU, m) { m.impl("attention", &attention_kernel); }

TORCH_LIBRARY_IMPL(attention_steps, Autograd, m) { m.impl("attention", &attention_autograd); }

// A Python module with nothing in it: importing attention_steps._operator loads this library,
// whose static initialisers above register the operator.
// It refuses to import (ImportError, with the line of abi_mismatch) when the library it loaded
// speaks another C ABI version than the header it was compiled with.
extern "C" PyObject* PyInit__operator(void) {
  const std::string mismatch = abi_mismatch();
  if (!mismatch.empty()) {
    PyErr_SetString(PyExc_ImportError, mismatch.c_str());
    return nullptr;
  }
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_operator", nullptr, -1, nullptr,
                               nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
