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
// projection's slices) and writes O into [B, N, H, D] memory, returned as its [B, H, N, D] view,
// so the out-projection reads it without a copy; python/attention_steps/torch_op.py states the
// same strides for torch.compile (its fake implementation).
//
// Autograd: a C++ autograd function saves O and L; its backward raises, in one line, until a
// backward step exists.
#include <ATen/cuda/CUDAContext.h>
#include <Python.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

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
};

const StepFacts& facts_of(const std::string& id) {
  static const std::unordered_map<std::string, StepFacts> steps = [] {
    std::unordered_map<std::string, StepFacts> found;
    for (int index = 0; index < attn_step_count(); ++index) {
      attn_step_info info{};
      if (attn_step_get(index, &info) != ATTN_OK) continue;
      found[info.id] = StepFacts{info.takes_strides != 0, info.uses_workspace != 0,
                                 info.writes_log_sum_exp != 0};
    }
    return found;
  }();
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

// "[2, 65, 64]". Written out, not streamed as sizes(): streaming an IntArrayRef into the
// message of a failed check crashed the process on the H100 machine (torch 2.11, Python 3.12).
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
  TORCH_CHECK_TYPE(tensor.scalar_type() == at::kHalf, "attention_steps: ", name, " is ",
                   tensor.scalar_type(), "; the steps take torch.float16 only (call .half())");
  TORCH_CHECK_VALUE(tensor.is_cuda(), "attention_steps: ", name, " is on ", tensor.device(),
                    "; the steps run on CUDA tensors");
  TORCH_CHECK_VALUE(tensor.device() == q.device(), "attention_steps: q, k and v must be on one "
                    "device; ", name, " is on ", tensor.device(), ", q on ", q.device());
}

// A view the steps that take strides read in place: rows of D contiguous, and strides the C ABI
// takes (multiples of 8 elements, at least D). A dimension of size 1 has no meaningful stride:
// the contiguous one stands in for it.
std::optional<attn_strides> view_strides(const at::Tensor& tensor) {
  if (tensor.stride(3) != 1 && tensor.size(3) > 1) return std::nullopt;
  if (reinterpret_cast<std::uintptr_t>(tensor.data_ptr()) % 16 != 0) return std::nullopt;
  const int64_t head_dim = tensor.size(3);
  const int64_t contiguous[3] = {tensor.size(1) * tensor.size(2) * head_dim,
                                 tensor.size(2) * head_dim, head_dim};
  int64_t strides[3];
  for (int dim = 0; dim < 3; ++dim) {
    strides[dim] = tensor.size(dim) == 1 ? contiguous[dim] : tensor.stride(dim);
    if (strides[dim] < head_dim || strides[dim] % 8 != 0) return std::nullopt;
  }
  return attn_strides{strides[0], strides[1], strides[2]};
}

bool same(const attn_strides& a, const attn_strides& b) {
  return a.batch == b.batch && a.head == b.head && a.token == b.token;
}

std::tuple<at::Tensor, at::Tensor> attention_kernel(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, c10::string_view step,
                                                  std::optional<double> scale,
                                                  const std::optional<at::Tensor>& key_padding_mask,
                                                  bool return_log_sum_exp) {
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
                    "positive; got ", scale.value_or(0.0));
  TORCH_CHECK_VALUE(!return_log_sum_exp || facts.writes_log_sum_exp, "attention_steps: ", id,
                    " does not write L (the log-sum-exp); steps that do: v6, v7, v8");

  const c10::cuda::CUDAGuard device_guard(q.device());
  // Views in place for a step that takes them, when q, k and v share strides; contiguous
  // copies otherwise (no copy at all for tensors that already are).
  std::optional<attn_strides> strides;
  if (facts.takes_strides) {
    const auto q_strides = view_strides(q), k_strides = view_strides(k), v_strides = view_strides(v);
    if (q_strides && k_strides && v_strides && same(*q_strides, *k_strides) &&
        same(*q_strides, *v_strides)) {
      strides = q_strides;
    }
  }
  const at::Tensor q_in = strides ? q : q.contiguous();
  const at::Tensor k_in = strides ? k : k.contiguous();
  const at::Tensor v_in = strides ? v : v.contiguous();
  const at::Tensor o = facts.takes_strides
                           ? at::empty({batch, tokens, heads, head_dim}, q.options()).transpose(1, 2)
                           : at::empty({batch, heads, tokens, head_dim}, q.options());
  const at::Tensor log_sum_exp =
      at::empty(return_log_sum_exp ? at::IntArrayRef{batch, heads, tokens} : at::IntArrayRef{0},
                q.options().dtype(at::kFloat));
  if (q.numel() == 0 || k.numel() == 0) return {o, log_sum_exp};  // nothing to compute

  attn_launch_args call{};
  call.q = q_in.data_ptr();
  call.k = k_in.data_ptr();
  call.v = v_in.data_ptr();
  call.o = o.data_ptr();
  call.log_sum_exp = return_log_sum_exp ? log_sum_exp.data_ptr() : nullptr;
  call.batch = batch;
  call.heads = heads;
  call.tokens = tokens;
  call.head_dim = head_dim;
  call.kv_tokens = k.size(2);
  call.key_padding_mask =
      key_padding_mask.has_value() && key_padding_mask->defined() ? key_padding_mask->data_ptr() : nullptr;
  if (strides) call.qkv_strides = *strides;
  if (facts.takes_strides) call.o_strides = attn_strides{tokens * heads * head_dim, head_dim, heads * head_dim};
  call.scale = scale.value_or(0.0);
  call.stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  call.pointers_checked_by_caller = 1;  // torch tensors of this device, torch's stream
  at::Tensor workspace;
  if (facts.uses_workspace) {
    size_t bytes = 0;
    if (attn_workspace_bytes(id.c_str(), batch, heads, tokens, head_dim, &bytes, nullptr, 0) == ATTN_OK &&
        bytes > 0) {
      // From torch's caching allocator: stream-ordered like the tensors, and capture-safe.
      workspace = at::empty({int64_t(bytes)}, q.options().dtype(at::kByte));
      call.workspace = workspace.data_ptr();
      call.workspace_bytes = bytes;
    }
  }
  char message[1024];
  const int status = attn_launch(id.c_str(), &call, message, sizeof message);
  TORCH_CHECK_VALUE(status != ATTN_REFUSED, "attention_steps: ", message);
  TORCH_CHECK(status == ATTN_OK, "attention_steps: ", message);
  return {o, log_sum_exp};
}

// The autograd kernel: saves what a backward needs (Q, K, V, O and L) and, until a backward step
// exists, refuses in backward rather than returning zeros.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const std::string& step,
                                                std::optional<double> scale,
                                                const std::optional<at::Tensor>& key_padding_mask,
                                                bool return_log_sum_exp) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("attention_steps::attention", "")
                               .typed<decltype(attention_kernel)>();
    auto [o, log_sum_exp] = op.call(q, k, v, step, scale, key_padding_mask, return_log_sum_exp);
    context->save_for_backward({q, k, v, o, log_sum_exp});
    context->saved_data["step"] = step;
    context->mark_non_differentiable({log_sum_exp});
    return {o, log_sum_exp};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "attention_steps: step ",
                                context->saved_data["step"].toStringRef(),
                                " has no backward yet; train with "
                                "torch.nn.functional.scaled_dot_product_attention");
  }
};

std::tuple<at::Tensor, at::Tensor> attention_autograd(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, c10::string_view step,
                                                      std::optional<double> scale,
                                                      const std::optional<at::Tensor>& key_padding_mask,
                                                      bool return_log_sum_exp) {
  auto outputs = AttentionFunction::apply(q, k, v, std::string(step), scale, key_padding_mask,
                                          return_log_sum_exp);
  return {outputs[0], outputs[1]};
}

}  // namespace

TORCH_LIBRARY(attention_steps, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, str step, float? scale=None, "
        "Tensor? key_padding_mask=None, bool return_log_sum_exp=False) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attention_steps, CUDA, m) { m.impl("attention", &attention_kernel); }

// On CPU tensors the same function, for its checks: "q is on cpu; the steps run on CUDA tensors"
// rather than the dispatcher's "could not run with arguments from the 'CPU' backend".
TORCH_LIBRARY_IMPL(attention_steps, CPU, m) { m.impl("attention", &attention_kernel); }

TORCH_LIBRARY_IMPL(attention_steps, Autograd, m) { m.impl("attention", &attention_autograd); }

// A Python module with nothing in it: importing attention_steps._operator loads this library,
// whose static initialisers above register the operator.
extern "C" PyObject* PyInit__operator(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_operator", nullptr, -1, nullptr,
                               nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
