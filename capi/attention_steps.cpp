// The C ABI of attention_steps.h over the step registry of contract/step.hpp. Nothing here knows a
// kernel: the steps' own object files register themselves when the library loads, and every
// function below only reads StepInfo, judges a call with StepInfo::refuses against the current
// GPU's limits (describe_device, read once per device), and calls StepInfo::launch.
//
// Errors travel as C++ exceptions inside (Refused -> ATTN_REFUSED, attn::CudaError ->
// ATTN_CUDA_ERROR) and stop at guarded(), the one place that turns them into a status and one
// line of text: nothing crosses the ABI, nothing aborts.
#include "attention_steps.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ceilings.hpp"
#include "cuda_check.hpp"
#include "runner.hpp"
#include "step.hpp"

namespace {

// A call the library will not run: a bad argument or a shape the step does not serve here.
struct Refused {
  std::string why;
};

void write_message(char* message, std::size_t size, const std::string& text) {
  if (message == nullptr || size == 0) return;
  const std::size_t count = std::min(text.size(), size - 1);
  for (std::size_t i = 0; i < count; ++i) {
    message[i] = (text[i] == '\n' || text[i] == '\r') ? ' ' : text[i];  // one line
  }
  message[count] = '\0';
}

// Runs body(); its outcome becomes the status and the message. Never throws.
template <typename Body>
int guarded(char* message, std::size_t size, Body&& body) noexcept {
  try {
    try {
      body();
      write_message(message, size, "ok");
      return ATTN_OK;
    } catch (const Refused& refused) {
      write_message(message, size, refused.why);
      return ATTN_REFUSED;
    } catch (const attn::CudaError& error) {
      write_message(message, size, error.what());
      return ATTN_CUDA_ERROR;
    } catch (const std::bad_alloc&) {
      write_message(message, size, "out of host memory");
      return ATTN_CUDA_ERROR;
    } catch (const std::exception& error) {
      write_message(message, size, std::string("internal error: ") + error.what());
      return ATTN_CUDA_ERROR;
    } catch (...) {
      write_message(message, size, "internal error: an unknown exception");
      return ATTN_CUDA_ERROR;
    }
  } catch (...) {  // writing the message itself failed (out of memory building the string)
    return ATTN_CUDA_ERROR;
  }
}

const attn::StepInfo& step_named(const char* id) {
  if (id == nullptr) throw Refused{"no step id given (NULL)"};
  if (const attn::StepInfo* step = attn::find_step(id)) return *step;
  std::string known;
  for (const attn::StepInfo& step : attn::registered_steps()) {
    known += (known.empty() ? "" : ", ") + step.id;
  }
  throw Refused{"unknown step '" + std::string(id) + "' (registered: " + known + ")"};
}

// The sizes of a call, checked the way the step executables check their flags, plus what the
// launch functions assume: every size fits an int (AttentionArgs), so does B * H, and the
// byte count of one tensor fits in 64 bits.
attn::Shape shape_of(int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"batch", batch}, {"heads", heads}, {"tokens", tokens}, {"head_dim", head_dim}};
  for (const auto& [name, value] : sizes) {
    if (value < 1) {
      throw Refused{std::string(name) + " " + std::to_string(value) +
                    ": every size must be at least 1"};
    }
    if (value > INT_MAX) {
      throw Refused{std::string(name) + " " + std::to_string(value) + ": larger than " +
                    std::to_string(INT_MAX) + ", the largest size a step takes"};
    }
  }
  if (batch * heads > INT_MAX) {
    throw Refused{"batch * heads = " + std::to_string(batch * heads) + ": larger than " +
                  std::to_string(INT_MAX)};
  }
  int64_t bytes = sizeof(__half);
  for (int64_t factor : {batch, heads, tokens, head_dim}) {
    if (bytes > INT64_MAX / factor) {
      throw Refused{"shape [" + std::to_string(batch) + ", " + std::to_string(heads) + ", " +
                    std::to_string(tokens) + ", " + std::to_string(head_dim) +
                    "]: its byte count overflows 64 bits"};
    }
    bytes *= factor;
  }
  return attn::Shape{batch, heads, tokens, head_dim};
}

// N_k as a call gives it (kv_tokens; 0 is handled by the caller: as many as the queries),
// checked as shape_of checks N, with K's byte count too.
int64_t keys_of(int64_t kv_tokens, int64_t batch, int64_t heads, int64_t head_dim) {
  if (kv_tokens < 0) {
    throw Refused{"kv_tokens " + std::to_string(kv_tokens) +
                  ": it must be at least 1 (0 means as many keys as tokens)"};
  }
  try {
    return shape_of(batch, heads, kv_tokens, head_dim).tokens;
  } catch (const Refused& refused) {
    throw Refused{"kv_tokens: " + refused.why};
  }
}

// `shape` with the element type a call names (ATTN_DTYPE_*); any other value is refused.
attn::Shape with_dtype(attn::Shape shape, int dtype) {
  if (dtype != ATTN_DTYPE_FP16 && dtype != ATTN_DTYPE_BF16) {
    throw Refused{"dtype " + std::to_string(dtype) + " is neither ATTN_DTYPE_FP16 (0) nor "
                  "ATTN_DTYPE_BF16 (1)"};
  }
  shape.dtype = dtype == ATTN_DTYPE_BF16 ? attn::DType::bf16 : attn::DType::fp16;
  return shape;
}

// The calling thread's current device, or CudaError "no CUDA device found (...)", the line the
// step executables print.
int current_device() {
  attn::require_cuda_device();
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// What refuses() judges against, read once per device (describe_device selects nothing).
attn::DeviceLimits limits_of(int device) {
  static std::mutex mutex;
  static std::map<int, attn::DeviceLimits> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found == known.end()) {
    found = known.emplace(device, attn::describe_device(device).limits()).first;
  }
  return found->second;
}

// A GPU of compute capability `capability` as refuses() judges one: its usual opt-in shared memory
// per block (kSharedBudgets, the table of bench --gpu-table), no GPU needed.
attn::DeviceLimits limits_of_capability(int capability) {
  std::string known;
  for (const attn::SharedBudget& budget : attn::kSharedBudgets) {
    for (int each : budget.capabilities) {
      if (each == 0) break;
      if (each == capability) {
        return {"a GPU of compute capability " + attn::compute_capability_text(capability) + " (" +
                    budget.gpus + ")",
                capability, budget.bytes};
      }
      known += (known.empty() ? "" : ", ") + std::to_string(each);
    }
  }
  throw Refused{"compute_capability " + std::to_string(capability) + ": not a GPU this library "
                "knows the shared memory of (" + known + "; 0: the current GPU)"};
}

std::string address(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

// Device (or managed) memory of `device`, 16-byte aligned: the steps load 16 bytes at a time.
// With query_cuda false only the first two: the caller vouched for the rest.
void check_pointer(const char* name, const void* pointer, int device, bool query_cuda) {
  if (pointer == nullptr) throw Refused{std::string(name) + " is NULL"};
  if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) {
    throw Refused{std::string(name) + " (" + address(pointer) +
                  ") is not 16-byte aligned; the steps load 16 bytes at a time"};
  }
  if (!query_cuda) return;
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Refused{std::string(name) + " (" + address(pointer) + ") is not CUDA memory (" +
                  cudaGetErrorString(status) + ")"};
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    throw Refused{std::string(name) + " (" + address(pointer) +
                  ") is not device memory (host memory?); the steps read and write GPU memory"};
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device) {
    throw Refused{std::string(name) + " is memory of device " + std::to_string(attributes.device) +
                  ", but the current device is " + std::to_string(device)};
  }
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Bytes from a [B, H, N, D] view's first element to one past its last.
std::size_t span_bytes(const attn::Shape& shape, const attn::TensorStrides& strides) {
  return std::size_t((shape.batch - 1) * strides.batch + (shape.heads - 1) * strides.head +
                     (shape.tokens - 1) * strides.token + shape.head_dim) * sizeof(__half);
}

// The bytes a tensor of `rows` tokens a slice spans with `given` strides (zero: contiguous, with
// `rows` rows a slice): Q, O and dO have N rows, K and V N_k, all with the shape's B, H and D.
std::size_t strided_bytes(const attn::Shape& shape, const attn::TensorStrides& given, int64_t rows) {
  attn::Shape each = shape;
  each.tokens = rows;
  each.kv_tokens = 0;
  return span_bytes(each, attn::actual_strides(given, shape.heads, rows, shape.head_dim));
}

// Everything a launch needs, judged before anything is queued. Returns the device.
// With query_cuda false (attn_launch_args::pointers_checked_by_caller) the caller has vouched
// for the pointers' and the stream's device: only the arithmetic checks run.
// The current device, once the step serves the shape there and no CUDA error from earlier work
// is pending (a launch's own check would report it: say so now, launch nothing, and clear it so
// it is reported once).
int device_for_launch(const attn::StepInfo& step, const attn::Shape& shape) {
  if (auto reason = step.refuses(shape)) throw Refused{*reason};
  const int device = current_device();
  if (auto reason = step.refuses(shape, limits_of(device))) throw Refused{*reason};
  if (const cudaError_t pending = cudaPeekAtLastError(); pending != cudaSuccess) {
    cudaGetLastError();
    throw attn::CudaError(std::string("a CUDA error from earlier work was pending on this "
                                      "thread, so nothing was launched: ") +
                          cudaGetErrorName(pending) + " (" + cudaGetErrorString(pending) + ")");
  }
  return device;
}

void check_scale(double scale) {
  if (!(scale >= 0.0) || !std::isfinite(scale)) {
    throw Refused{"scale " + std::to_string(scale) +
                  ": it must be finite and positive (0 means 1/sqrt(head_dim))"};
  }
}

// Calls run(workspace) with the scratch `step` needs at `shape`: none; the caller's (`given`,
// checked: large enough, device memory, overlapping none of `tensors`, each `tensor_bytes`
// long); or, when none is given, memory allocated and freed in the stream's order, so the call
// stays asynchronous (and can be captured into a graph). A GPU without memory pools gets
// cudaMalloc and a synchronisation.
template <typename Run>
void with_workspace(const attn::StepInfo& step, const attn::Shape& shape, int device, void* given,
                    std::size_t given_bytes, bool query_cuda, void* stream,
                    std::initializer_list<const void*> tensors, std::size_t tensor_bytes,
                    Run&& run) {
  const std::size_t needed = step.workspace_for(shape);
  if (needed == 0) return run(nullptr);
  if (given != nullptr) {
    if (given_bytes < needed) {
      throw Refused{step.id + " needs " + std::to_string(needed) +
                    " bytes of workspace at this shape; " + std::to_string(given_bytes) +
                    " given"};
    }
    check_pointer("workspace", given, device, query_cuda);
    for (const void* tensor : tensors) {
      if (overlaps(given, needed, tensor, tensor_bytes)) {
        throw Refused{"the workspace overlaps q, k, v or o"};
      }
    }
    return run(given);
  }
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  int pools = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
  void* workspace = nullptr;
  const cudaError_t status = pools ? cudaMallocAsync(&workspace, needed, cuda_stream)
                                   : cudaMalloc(&workspace, needed);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw attn::CudaError(step.id + " needs " + attn::gibibytes(double(needed)) +
                          " of workspace at this shape and could not get it (" +
                          cudaGetErrorString(status) + ")");
  }
  struct Release {  // frees the workspace on every path out, launch failure included
    void* pointer;
    cudaStream_t stream;
    bool pools;
    ~Release() {
      if (pools) {
        cudaFreeAsync(pointer, stream);
      } else {
        cudaStreamSynchronize(stream);
        cudaFree(pointer);
      }
    }
  } release{workspace, cuda_stream, pools != 0};
  run(workspace);
}

int check_run(const attn::StepInfo& step, const attn::Shape& shape, const void* q, const void* k,
              const void* v, const void* o, void* stream, const attn::TensorStrides& qkv_strides,
              const attn::TensorStrides& o_strides, const void* log_sum_exp, bool query_cuda) {
  const int device = device_for_launch(step, shape);
  for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"q", q}, {"k", k},
                                       {"v", v}, {"o", o}}) {
    check_pointer(name, pointer, device, query_cuda);
  }
  const std::size_t input_bytes = strided_bytes(shape, qkv_strides, shape.tokens);
  const std::size_t kv_bytes = strided_bytes(shape, qkv_strides, shape.keys());  // N_k rows a slice
  const std::size_t output_bytes = strided_bytes(shape, o_strides, shape.tokens);
  for (const auto& [name, input, bytes] :
       {std::tuple<const char*, const void*, std::size_t>{"q", q, input_bytes}, {"k", k, kv_bytes},
        {"v", v, kv_bytes}}) {
    if (overlaps(o, output_bytes, input, bytes)) {
      throw Refused{std::string("o overlaps ") + name +
                    ": the output must not share memory with an input"};
    }
  }
  if (log_sum_exp != nullptr) {
    check_pointer("log_sum_exp", log_sum_exp, device, query_cuda);
    const std::size_t rows_bytes = std::size_t(shape.slices() * shape.tokens) * sizeof(float);
    for (const auto& [name, tensor, bytes] :
         {std::tuple<const char*, const void*, std::size_t>{"q", q, input_bytes},
          {"k", k, kv_bytes}, {"v", v, kv_bytes}, {"o", o, output_bytes}}) {
      if (overlaps(log_sum_exp, rows_bytes, tensor, bytes)) {
        throw Refused{std::string("log_sum_exp overlaps ") + name +
                      ": L must not share memory with an input or O"};
      }
    }
  }
#if CUDART_VERSION >= 12080
  if (!query_cuda) return device;
  // cudaStreamGetDevice is one of the calls a stream capture forbids: made on a capturing
  // stream, it invalidates the capture (CUDA graphs). A capturing stream goes unchecked.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) {
    cudaGetLastError();  // the legacy stream while another thread captures: leave it unchecked
    return device;
  }
  if (capture != cudaStreamCaptureStatusNone) return device;
  int stream_device = device;
  CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &stream_device));
  if (stream_device != device) {
    throw Refused{"the stream belongs to device " + std::to_string(stream_device) +
                  ", but the current device is " + std::to_string(device)};
  }
#endif
  return device;
}

attn::AttentionArgs args_for(const attn::Shape& shape, const void* q, const void* k,
                             const void* v, void* o, void* workspace, void* stream) {
  return attn::attention_args(shape, static_cast<const __half*>(q), static_cast<const __half*>(k),
                              static_cast<const __half*>(v), static_cast<__half*>(o), workspace,
                              static_cast<cudaStream_t>(stream));
}

// Queues the step. A baseline keeps per-process library state (eager: a cuBLAS handle whose
// stream is set per launch), so its launches are queued one thread at a time.
void launch(const attn::StepInfo& step, const attn::AttentionArgs& args) {
  static std::mutex baseline_mutex;
  std::unique_lock<std::mutex> lock(baseline_mutex, std::defer_lock);
  if (attn::is_baseline(step.kind)) lock.lock();
  step.launch(args);
  CUDA_CHECK_LAUNCH();
}


}  // namespace

extern "C" {

int attn_abi_version(void) { return ATTN_ABI_VERSION; }

int attn_step_count(void) {
  int count = 0;
  guarded(nullptr, 0, [&] { count = int(attn::registered_steps().size()); });
  return count;
}

int attn_step_get(int index, attn_step_info* info) {
  return guarded(nullptr, 0, [&] {
    const auto& steps = attn::registered_steps();
    if (info == nullptr) throw Refused{"info is NULL"};
    if (index < 0 || std::size_t(index) >= steps.size()) {
      throw Refused{"index " + std::to_string(index) + " is out of range"};
    }
    const attn::StepInfo& step = steps[std::size_t(index)];
    *info = attn_step_info{};
    info->id = step.id.c_str();
    info->title = step.title.c_str();
    info->is_baseline = attn::is_baseline(step.kind) ? 1 : 0;
    info->head_dim_count = int(std::min<std::size_t>(step.head_dims.size(), ATTN_MAX_HEAD_DIMS));
    for (int i = 0; i < info->head_dim_count; ++i) info->head_dims[i] = step.head_dims[std::size_t(i)];
    info->min_compute_capability = step.min_compute_capability;
    info->max_compute_capability = step.max_compute_capability;
    info->uses_shared_memory = step.shared_bytes != nullptr ? 1 : 0;
    info->uses_workspace = step.workspace_bytes != nullptr ? 1 : 0;
    info->takes_strides = step.takes_strides ? 1 : 0;
    info->writes_log_sum_exp = step.writes_log_sum_exp ? 1 : 0;
    info->is_backward = attn::is_backward(step.kind) ? 1 : 0;
    info->takes_bf16 = std::find(step.dtypes.begin(), step.dtypes.end(), attn::DType::bf16) !=
                               step.dtypes.end() ? 1 : 0;
    info->takes_kv_tokens = step.takes_kv_tokens ? 1 : 0;
    info->takes_key_padding_mask = step.takes_key_padding_mask ? 1 : 0;
    info->takes_causal = step.takes_causal ? 1 : 0;
    info->takes_packed_sequences = step.takes_packed_sequences ? 1 : 0;
  });
}

int attn_device(int* device, char* name, std::size_t name_size, int* compute_capability,
                std::size_t* shared_bytes_per_block, char* message, std::size_t message_size) {
  return guarded(message, message_size, [&] {
    const int current = current_device();
    const attn::DeviceLimits limits = limits_of(current);
    if (device != nullptr) *device = current;
    write_message(name, name_size, limits.name);
    if (compute_capability != nullptr) *compute_capability = limits.compute_capability;
    if (shared_bytes_per_block != nullptr) *shared_bytes_per_block = limits.shared_bytes_per_block;
  });
}

int attn_shared_bytes(const char* id, int64_t tokens, int64_t head_dim, std::size_t* bytes,
                      char* message, std::size_t message_size) {
  return guarded(message, message_size, [&] {
    const attn::StepInfo& step = step_named(id);
    const attn::Shape shape = shape_of(1, 1, tokens, head_dim);
    if (auto reason = step.refuses(shape)) throw Refused{*reason};
    if (bytes == nullptr) throw Refused{"bytes is NULL"};
    *bytes = step.shared_bytes_for(shape);
  });
}

int attn_max_tokens(const char* id, int64_t head_dim, int64_t* max_tokens, char* message,
                    std::size_t message_size) {
  return guarded(message, message_size, [&] {
    const attn::StepInfo& step = step_named(id);
    const attn::Shape smallest = shape_of(1, 1, 1, head_dim);
    if (auto reason = step.refuses(smallest)) throw Refused{*reason};
    if (max_tokens == nullptr) throw Refused{"max_tokens is NULL"};
    const attn::DeviceLimits limits = limits_of(current_device());
    if (auto reason = step.refuses(smallest, limits)) throw Refused{*reason};  // not even N = 1
    const std::optional<int64_t> largest = step.max_tokens(head_dim, limits.shared_bytes_per_block);
    *max_tokens = largest ? *largest : -1;
  });
}

int attn_check(const char* id, int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
               char* message, std::size_t message_size) {
  return guarded(message, message_size, [&] {
    const attn::StepInfo& step = step_named(id);
    const attn::Shape shape = shape_of(batch, heads, tokens, head_dim);
    if (auto reason = step.refuses(shape)) throw Refused{*reason};
    if (auto reason = step.refuses(shape, limits_of(current_device()))) throw Refused{*reason};
  });
}

int attn_workspace_bytes(const char* id, int64_t batch, int64_t heads, int64_t tokens,
                         int64_t head_dim, std::size_t* bytes, char* message,
                         std::size_t message_size) {
  return guarded(message, message_size, [&] {
    const attn::StepInfo& step = step_named(id);
    const attn::Shape shape = shape_of(batch, heads, tokens, head_dim);
    if (auto reason = step.refuses(shape)) throw Refused{*reason};
    if (bytes == nullptr) throw Refused{"bytes is NULL"};
    *bytes = step.workspace_for(shape);
  });
}

}  // extern "C"

namespace {

// The contiguous strides of the shape given explicitly are no strides at all: every step takes
// those. Others must keep every row of D values 16-byte aligned.
attn::TensorStrides strides_of(const char* name, const attn_strides& given,
                               const attn::Shape& shape, bool keys_too) {
  const attn::TensorStrides strides{given.batch, given.head, given.token};
  const attn::TensorStrides contiguous =
      attn::actual_strides({}, shape.heads, shape.tokens, shape.head_dim);
  // Strides equal to Q's contiguous ones are no views, except where they are also K's and V's
  // in cross-attention: contiguous K and V would have N_k rows a slice, not N.
  const bool same_as_contiguous = strides.batch == contiguous.batch &&
                                  strides.head == contiguous.head && strides.token == contiguous.token;
  if (strides.contiguous() || (same_as_contiguous && !(keys_too && shape.cross()))) {
    return {};
  }
  const std::string listed = std::string(name) + " strides {" + std::to_string(given.batch) + ", " +
                             std::to_string(given.head) + ", " + std::to_string(given.token) + "}";
  for (int64_t stride : {given.batch, given.head, given.token}) {
    if (stride < shape.head_dim || stride % 8 != 0) {
      throw Refused{listed + ": each must be a multiple of 8 elements (16 bytes) and at least "
                    "head_dim (" + std::to_string(shape.head_dim) + ")"};
    }
  }
  // The overlap checks size each view by its last element's offset: it must fit in 64 bits.
  const int64_t rows = keys_too ? std::max(shape.tokens, shape.keys()) : shape.tokens;
  const __int128 last = __int128(shape.batch - 1) * strides.batch +
                        __int128(shape.heads - 1) * strides.head + __int128(rows - 1) * strides.token +
                        shape.head_dim;
  if (last * __int128(sizeof(__half)) > __int128(INT64_MAX)) {
    throw Refused{listed + ": the view would span more than 2^63 bytes"};
  }
  return strides;
}

// ATTN_CAUSAL_* as the harness's alignment.
attn::Causal causal_of(int causal) {
  switch (causal) {
    case ATTN_CAUSAL_NONE: return attn::Causal::none;
    case ATTN_CAUSAL_TOP_LEFT: return attn::Causal::top_left;
    case ATTN_CAUSAL_BOTTOM_RIGHT: return attn::Causal::bottom_right;
  }
  throw Refused{"causal " + std::to_string(causal) + " is not ATTN_CAUSAL_NONE (0), "
                "ATTN_CAUSAL_TOP_LEFT (1) or ATTN_CAUSAL_BOTTOM_RIGHT (2)"};
}

// Packed sequences ([total, H, D] tensors, cu_seqlens_q): what a forward and a backward call
// share. The shape judged against the step is the longest sequence's (its head dim, dtype,
// shared memory and masks), with lengths that give the batch and the total (a step's workspace
// depends on those alone; the library never reads the prefix sums, that would synchronise).
struct PackedCall {
  attn::Shape shape;
  int64_t total, kv_total;
  // The bytes a [rows, H, D] tensor with these strides spans.
  std::size_t span(const attn::TensorStrides& strides, int64_t rows) const {
    if (rows == 0) return 0;
    return std::size_t((rows - 1) * strides.token + (shape.heads - 1) * strides.head + shape.head_dim) *
           sizeof(__half);
  }
};
template <typename Call>
PackedCall packed_call(const attn::StepInfo& step, const Call& call) {
  if (!step.takes_packed_sequences) {
    throw Refused{step.id + " does not serve packed sequences (cu_seqlens_q; it takes no batch "
                  "of sequences of different lengths)"};
  }
  if (call.key_padding_mask != nullptr) {
    throw Refused{"key_padding_mask with cu_seqlens_q: packed sequences take no key-padding mask "
                  "(each sequence's keys are its own)"};
  }
  PackedCall packed{with_dtype(shape_of(call.batch, call.heads, call.tokens, call.head_dim), call.dtype),
                    call.total_tokens, call.total_kv_tokens != 0 ? call.total_kv_tokens : call.total_tokens};
  attn::Shape& shape = packed.shape;
  if (call.kv_tokens != 0) shape.kv_tokens = keys_of(call.kv_tokens, call.batch, call.heads, call.head_dim);
  shape.causal = causal_of(call.causal);
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"total_tokens", packed.total},
                                    {"total_kv_tokens", packed.kv_total}}) {
    if (value < 0 || value > INT_MAX) {
      throw Refused{std::string(name) + " " + std::to_string(value) + ": it must lie in 0 .. " +
                    std::to_string(INT_MAX)};
    }
  }
  if (packed.total > 0 && packed.kv_total == 0) {
    throw Refused{"total_kv_tokens 0 with queries: no sequence has a key to attend to"};
  }
  if (call.cu_seqlens_k == nullptr && packed.kv_total != packed.total) {
    throw Refused{"total_kv_tokens differs from total_tokens: give cu_seqlens_k too"};
  }
  check_scale(call.scale);
  shape.lengths.assign(std::size_t(shape.batch), 0);
  shape.lengths[0] = packed.total;
  return packed;
}
// A packed tensor's strides: the token and head strides given, or (H D, D).
attn::TensorStrides packed_strides_of(const char* name, const attn_strides& given, const attn::Shape& shape) {
  const attn::TensorStrides strides{0, given.head != 0 ? given.head : shape.head_dim,
                                    given.token != 0 ? given.token : shape.heads * shape.head_dim};
  if (strides.head < shape.head_dim || strides.token < shape.head_dim || strides.head % 8 != 0 ||
      strides.token % 8 != 0) {
    throw Refused{std::string(name) + " strides {head " + std::to_string(strides.head) +
                  ", token " + std::to_string(strides.token) +
                  "}: each must be a multiple of 8 elements (16 bytes) and at least head_dim (" +
                  std::to_string(shape.head_dim) + ")"};
  }
  return strides;
}
bool packed_contiguous(const attn::TensorStrides& strides, const attn::Shape& shape) {
  return strides.head == shape.head_dim && strides.token == shape.heads * shape.head_dim;
}

// attn_launch with cu_seqlens_q: the same checks as launch_call's, on the packed tensors' sizes,
// strides and spans.
void launch_packed_call(const attn::StepInfo& step, const attn_launch_args& call) {
  const PackedCall packed = packed_call(step, call);
  const attn::Shape& shape = packed.shape;
  const int64_t total = packed.total, kv_total = packed.kv_total;
  if (call.log_sum_exp != nullptr && !step.writes_log_sum_exp) {
    throw Refused{step.id + " does not write L (the log-sum-exp); steps that do have "
                  "writes_log_sum_exp in their info"};
  }
  const attn::TensorStrides qkv = packed_strides_of("qkv", call.qkv_strides, shape);
  const attn::TensorStrides o = packed_strides_of("o", call.o_strides, shape);
  if (!(packed_contiguous(qkv, shape) && packed_contiguous(o, shape)) && !step.takes_strides) {
    throw Refused{step.id + " reads and writes contiguous [total, H, D] tensors only"};
  }
  const bool query_cuda = call.pointers_checked_by_caller == 0;
  const int device = device_for_launch(step, shape);
  if (total == 0) return;  // every sequence empty: nothing to compute
  for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"q", call.q}, {"k", call.k},
                                       {"v", call.v}, {"o", call.o}}) {
    check_pointer(name, pointer, device, query_cuda);
  }
  for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"cu_seqlens_q", call.cu_seqlens_q},
                                       {"cu_seqlens_k", call.cu_seqlens_k}}) {
    if (pointer != nullptr) check_pointer(name, pointer, device, query_cuda);
  }
  const std::size_t q_bytes = packed.span(qkv, total), kv_bytes = packed.span(qkv, kv_total),
                    o_bytes = packed.span(o, total);
  for (const auto& [name, input, bytes] :
       {std::tuple<const char*, const void*, std::size_t>{"q", call.q, q_bytes}, {"k", call.k, kv_bytes},
        {"v", call.v, kv_bytes}}) {
    if (overlaps(call.o, o_bytes, input, bytes)) {
      throw Refused{std::string("o overlaps ") + name + ": the output must not share memory with an input"};
    }
  }
  attn::AttentionArgs args = args_for(shape, call.q, call.k, call.v, call.o, nullptr, call.stream);
  if (call.scale > 0.0) args.scale = call.scale;
  args.qkv_strides = {0, qkv.head, qkv.token};
  args.o_strides = {0, o.head, o.token};
  args.sequences.cu_seqlens_q = static_cast<const int32_t*>(call.cu_seqlens_q);
  args.sequences.cu_seqlens_k = static_cast<const int32_t*>(call.cu_seqlens_k != nullptr ? call.cu_seqlens_k
                                                                                          : call.cu_seqlens_q);
  args.sequences.total_tokens = int(total);
  args.sequences.total_kv_tokens = int(kv_total);
  if (call.log_sum_exp != nullptr) {
    check_pointer("log_sum_exp", call.log_sum_exp, device, query_cuda);
    const std::size_t rows_bytes = std::size_t(call.heads * total) * sizeof(float);
    for (const auto& [name, tensor, bytes] :
         {std::tuple<const char*, const void*, std::size_t>{"q", call.q, q_bytes}, {"k", call.k, kv_bytes},
          {"v", call.v, kv_bytes}, {"o", call.o, o_bytes}}) {
      if (overlaps(call.log_sum_exp, rows_bytes, tensor, bytes)) {
        throw Refused{std::string("log_sum_exp overlaps ") + name +
                      ": L must not share memory with an input or O"};
      }
    }
    args.log_sum_exp = static_cast<float*>(call.log_sum_exp);
  }
  if (step.workspace_for(shape) != 0) {
    throw std::logic_error(step.id + " takes packed sequences and asks for a workspace: not served");
  }
  launch(step, args);
}

// attn_launch, which every attn_run* function is a case of. Nothing is queued unless every
// argument is accepted.
void launch_call(const char* id, const attn_launch_args& call) {
  const attn::StepInfo& step = step_named(id);
  if (attn::is_backward(step.kind)) {
    throw Refused{step.id + " is a backward step (dQ, dK, dV from dO); the C ABI runs forward "
                  "steps"};
  }
  if (call.cu_seqlens_q != nullptr) return launch_packed_call(step, call);
  if (call.cu_seqlens_k != nullptr || call.total_tokens != 0 || call.total_kv_tokens != 0) {
    throw Refused{"cu_seqlens_k, total_tokens or total_kv_tokens without cu_seqlens_q: packed "
                  "sequences need the query lengths' prefix sums"};
  }
  attn::Shape shape =
      with_dtype(shape_of(call.batch, call.heads, call.tokens, call.head_dim), call.dtype);
  if (call.kv_tokens != 0) {  // cross-attention: N_k keys and values; a step that serves it
    shape.kv_tokens = keys_of(call.kv_tokens, call.batch, call.heads, call.head_dim);
  }
  // A mask is part of the problem: a step that takes none refuses it, naming --key-padding.
  shape.key_padding = call.key_padding_mask != nullptr;
  shape.causal = causal_of(call.causal);
  if (call.log_sum_exp != nullptr && !step.writes_log_sum_exp) {
    throw Refused{step.id + " does not write L (the log-sum-exp); steps that do have "
                  "writes_log_sum_exp in their info"};
  }
  check_scale(call.scale);
  attn::AttentionArgs args = args_for(shape, call.q, call.k, call.v, call.o, nullptr, call.stream);
  if (call.scale > 0.0) args.scale = call.scale;
  args.qkv_strides = strides_of("qkv", call.qkv_strides, shape, /*keys_too=*/true);
  args.o_strides = strides_of("o", call.o_strides, shape, /*keys_too=*/false);
  if ((!args.qkv_strides.contiguous() || !args.o_strides.contiguous()) && !step.takes_strides) {
    throw Refused{step.id + " reads and writes contiguous [B, H, N, D] tensors only; give "
                  "contiguous ones, or use a step that takes views"};
  }
  const bool query_cuda = call.pointers_checked_by_caller == 0;
  const int device = check_run(step, shape, call.q, call.k, call.v, call.o, call.stream,
                               args.qkv_strides, args.o_strides, call.log_sum_exp, query_cuda);
  args.log_sum_exp = static_cast<float*>(call.log_sum_exp);
  if (call.key_padding_mask != nullptr) {
    check_pointer("key_padding_mask", call.key_padding_mask, device, query_cuda);
    args.key_padding_mask = static_cast<const uint8_t*>(call.key_padding_mask);
  }
  with_workspace(step, shape, device, call.workspace, call.workspace_bytes, query_cuda, call.stream,
                 {call.q, call.k, call.v, call.o}, std::size_t(shape.elements()) * sizeof(__half),
                 [&](void* workspace) {
                   args.workspace = workspace;
                   launch(step, args);
                 });
}

// The harness's arguments of a backward call's tensors, sizes, stream, mode and scale.
attn::BackwardArgs backward_args_of(const attn::Shape& shape, const attn_backward_args& call) {
  return attn::backward_args(
      shape,
      {static_cast<const __half*>(call.q), static_cast<const __half*>(call.k),
       static_cast<const __half*>(call.v), static_cast<const __half*>(call.o),
       static_cast<const __half*>(call.d_o), static_cast<const float*>(call.log_sum_exp),
       static_cast<__half*>(call.dq), static_cast<__half*>(call.dk), static_cast<__half*>(call.dv)},
      nullptr, static_cast<cudaStream_t>(call.stream), call.deterministic != 0, call.scale);
}

// A backward call's tensors (name, pointer, the bytes it spans): each on the device, and no
// gradient overlapping an input or another gradient.
using Tensor = std::tuple<const char*, const void*, std::size_t>;
void check_gradients_apart(const std::vector<Tensor>& inputs, std::initializer_list<Tensor> gradients,
                           int device, bool query_cuda) {
  const std::vector<Tensor> outputs(gradients);
  for (const auto& [name, pointer, size] : inputs) check_pointer(name, pointer, device, query_cuda);
  for (const auto& [name, pointer, size] : outputs) check_pointer(name, pointer, device, query_cuda);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [output_name, output, output_bytes] = outputs[i];
    for (const auto& [input_name, input, input_bytes] : inputs) {
      if (overlaps(output, output_bytes, input, input_bytes)) {
        throw Refused{std::string(output_name) + " overlaps " + input_name +
                      ": the gradients must not share memory with an input"};
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      const auto& [other_name, other, other_bytes] = outputs[j];
      if (overlaps(output, output_bytes, other, other_bytes)) {
        throw Refused{std::string(output_name) + " overlaps " + other_name +
                      ": each gradient needs memory of its own"};
      }
    }
  }
}

// attn_launch_backward with cu_seqlens_q: the checks of launch_packed_call and of a backward
// call, on [total, H, D] tensors. No query anywhere: dK = dV = 0; the step writes them.
void launch_packed_backward_call(const attn::StepInfo& step, const attn_backward_args& call) {
  const PackedCall packed = packed_call(step, call);
  const attn::Shape& shape = packed.shape;
  const attn::TensorStrides qkv = packed_strides_of("qkv", call.qkv_strides, shape),
                            o = packed_strides_of("o", call.o_strides, shape),
                            d_o = packed_strides_of("d_o", call.d_o_strides, shape);
  if (!(packed_contiguous(qkv, shape) && packed_contiguous(o, shape) && packed_contiguous(d_o, shape)) &&
      !step.takes_strides) {
    throw Refused{step.id + " reads contiguous [total, H, D] tensors only"};
  }
  const int device = device_for_launch(step, shape);
  if (packed.total == 0 && packed.kv_total == 0) return;  // every sequence empty: nothing to compute
  const bool query_cuda = call.pointers_checked_by_caller == 0;
  const attn::TensorStrides gradient{0, shape.head_dim, shape.heads * shape.head_dim};
  const std::size_t rows_bytes = std::size_t(shape.heads * packed.total) * sizeof(float);
  std::vector<Tensor> inputs = {{"k", call.k, packed.span(qkv, packed.kv_total)},
                                {"v", call.v, packed.span(qkv, packed.kv_total)}};
  if (packed.total > 0) {
    inputs.insert(inputs.end(), {{"q", call.q, packed.span(qkv, packed.total)}, {"o", call.o, packed.span(o, packed.total)},
                                 {"d_o", call.d_o, packed.span(d_o, packed.total)},
                                 {"log_sum_exp", call.log_sum_exp, rows_bytes}});
  }
  const std::size_t dq_bytes = packed.span(gradient, packed.total), dk_bytes = packed.span(gradient, packed.kv_total);
  if (packed.total > 0) {
    check_gradients_apart(inputs, {{"dq", call.dq, dq_bytes}, {"dk", call.dk, dk_bytes}, {"dv", call.dv, dk_bytes}},
                          device, query_cuda);
  } else {
    check_gradients_apart(inputs, {{"dk", call.dk, dk_bytes}, {"dv", call.dv, dk_bytes}}, device, query_cuda);
  }
  for (const auto& [name, pointer] : {std::pair<const char*, const void*>{"cu_seqlens_q", call.cu_seqlens_q},
                                       {"cu_seqlens_k", call.cu_seqlens_k}}) {
    if (pointer != nullptr) check_pointer(name, pointer, device, query_cuda);
  }
  attn::BackwardArgs args = backward_args_of(shape, call);
  args.qkv_strides = {0, qkv.head, qkv.token};
  args.o_strides = {0, o.head, o.token};
  args.d_o_strides = {0, d_o.head, d_o.token};
  args.sequences.cu_seqlens_q = static_cast<const int32_t*>(call.cu_seqlens_q);
  args.sequences.cu_seqlens_k = static_cast<const int32_t*>(call.cu_seqlens_k != nullptr ? call.cu_seqlens_k
                                                                                          : call.cu_seqlens_q);
  args.sequences.total_tokens = int(packed.total);
  args.sequences.total_kv_tokens = int(packed.kv_total);
  with_workspace(step, shape, device, call.workspace, call.workspace_bytes, query_cuda, call.stream,
                 {}, 0, [&](void* workspace) {
                   args.workspace = workspace;
                   step.launch_backward(args);
                   CUDA_CHECK_LAUNCH();
                 });
}

// attn_launch_backward. The checks of a forward launch, for eight tensors, L and the mask: N_k
// and the key-padding mask are part of the problem as in launch_call (a step that takes neither
// refuses them, naming --kv-tokens or --key-padding), K, V, dK and dV are sized by N_k, and the
// views of Q, K, V, O and dO are judged as the forward's (strides_of; a step without
// takes_strides refuses them) and sized by the memory they span.
void launch_backward_call(const char* id, const attn_backward_args& call) {
  const attn::StepInfo& step = step_named(id);
  if (!attn::is_backward(step.kind)) {
    throw Refused{step.id + " is a forward step; attn_launch_backward runs backward steps"};
  }
  if (call.cu_seqlens_q != nullptr) return launch_packed_backward_call(step, call);
  if (call.cu_seqlens_k != nullptr || call.total_tokens != 0 || call.total_kv_tokens != 0) {
    throw Refused{"cu_seqlens_k, total_tokens or total_kv_tokens without cu_seqlens_q: packed "
                  "sequences need the query lengths' prefix sums"};
  }
  attn::Shape shape =
      with_dtype(shape_of(call.batch, call.heads, call.tokens, call.head_dim), call.dtype);
  if (call.kv_tokens != 0) {  // cross-attention: N_k keys, values and their gradients
    shape.kv_tokens = keys_of(call.kv_tokens, call.batch, call.heads, call.head_dim);
  }
  shape.key_padding = call.key_padding_mask != nullptr;
  shape.causal = causal_of(call.causal);
  check_scale(call.scale);
  // Views, judged as the forward's are, before the GPU is asked anything: a step that reads
  // contiguous tensors only refuses them, naming itself and the views.
  const attn::TensorStrides qkv_strides = strides_of("qkv", call.qkv_strides, shape, /*keys_too=*/true);
  const attn::TensorStrides o_strides = strides_of("o", call.o_strides, shape, /*keys_too=*/false);
  const attn::TensorStrides d_o_strides = strides_of("d_o", call.d_o_strides, shape, /*keys_too=*/false);
  if (!step.takes_strides) {
    std::string views;
    for (const auto& [name, strides] : {std::pair<const char*, attn::TensorStrides>{"qkv_strides", qkv_strides},
                                        {"o_strides", o_strides}, {"d_o_strides", d_o_strides}}) {
      if (!strides.contiguous()) views += (views.empty() ? "" : ", ") + std::string(name);
    }
    if (!views.empty()) {
      throw Refused{step.id + " reads contiguous [B, H, N, D] tensors only (" + views + " describe "
                    "views); give contiguous ones, or use a backward step that takes views"};
    }
  }
  const int device = device_for_launch(step, shape);
  const bool query_cuda = call.pointers_checked_by_caller == 0;
  const std::size_t bytes = std::size_t(shape.elements()) * sizeof(__half);        // dQ
  const std::size_t kv_bytes = std::size_t(shape.kv_elements()) * sizeof(__half);  // dK, dV
  const std::size_t rows_bytes = std::size_t(shape.slices() * shape.tokens) * sizeof(float);
  const std::size_t mask_bytes = std::size_t(shape.batch * shape.keys());
  // The inputs by the memory each spans: a view reaches from its first element to its last.
  const std::size_t q_bytes = strided_bytes(shape, qkv_strides, shape.tokens);
  const std::size_t kv_input_bytes = strided_bytes(shape, qkv_strides, shape.keys());
  const std::size_t o_bytes = strided_bytes(shape, o_strides, shape.tokens);
  const std::size_t d_o_bytes = strided_bytes(shape, d_o_strides, shape.tokens);
  std::vector<Tensor> inputs = {{"q", call.q, q_bytes},       {"k", call.k, kv_input_bytes},
                                {"v", call.v, kv_input_bytes}, {"o", call.o, o_bytes},
                                {"d_o", call.d_o, d_o_bytes}, {"log_sum_exp", call.log_sum_exp, rows_bytes}};
  if (call.key_padding_mask != nullptr) {
    inputs.emplace_back("key_padding_mask", call.key_padding_mask, mask_bytes);
  }
  check_gradients_apart(inputs, {{"dq", call.dq, bytes}, {"dk", call.dk, kv_bytes}, {"dv", call.dv, kv_bytes}},
                        device, query_cuda);
  attn::BackwardArgs args = backward_args_of(shape, call);
  args.key_padding_mask = static_cast<const uint8_t*>(call.key_padding_mask);
  args.qkv_strides = qkv_strides;
  args.o_strides = o_strides;
  args.d_o_strides = d_o_strides;
  with_workspace(step, shape, device, call.workspace, call.workspace_bytes, query_cuda, call.stream,
                 {}, 0, [&](void* workspace) {
                   args.workspace = workspace;
                   step.launch_backward(args);
                   CUDA_CHECK_LAUNCH();
                 });
}

// The call of attn_run_strided and attn_run_with_log_sum_exp: NULL strides are contiguous.
attn_launch_args call_of(const void* q, const void* k, const void* v, void* o, int64_t batch,
                         int64_t heads, int64_t tokens, int64_t head_dim, void* stream) {
  attn_launch_args call{};
  call.q = q;
  call.k = k;
  call.v = v;
  call.o = o;
  call.batch = batch;
  call.heads = heads;
  call.tokens = tokens;
  call.head_dim = head_dim;
  call.stream = stream;
  return call;
}

}  // namespace

extern "C" {

int attn_launch(const char* id, const attn_launch_args* args, char* message,
                std::size_t message_size) {
  return guarded(message, message_size, [&] {
    if (args == nullptr) throw Refused{"args is NULL"};
    launch_call(id, *args);
  });
}

int attn_launch_backward(const char* id, const attn_backward_args* args, char* message,
                         std::size_t message_size) {
  return guarded(message, message_size, [&] {
    if (args == nullptr) throw Refused{"args is NULL"};
    launch_backward_call(id, *args);
  });
}

int attn_run(const char* id, const void* q, const void* k, const void* v, void* o, int64_t batch,
             int64_t heads, int64_t tokens, int64_t head_dim, void* stream, char* message,
             std::size_t message_size) {
  const attn_launch_args call = call_of(q, k, v, o, batch, heads, tokens, head_dim, stream);
  return attn_launch(id, &call, message, message_size);
}

int attn_run_with_workspace(const char* id, const void* q, const void* k, const void* v, void* o,
                            int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
                            void* workspace, std::size_t workspace_bytes, void* stream,
                            char* message, std::size_t message_size) {
  return guarded(message, message_size, [&] {
    attn_launch_args call = call_of(q, k, v, o, batch, heads, tokens, head_dim, stream);
    const attn::StepInfo& step = step_named(id);
    if (step.workspace_for(shape_of(batch, heads, tokens, head_dim)) > 0 && workspace == nullptr) {
      throw Refused{step.id + " needs a workspace at this shape; workspace is NULL"};
    }
    call.workspace = workspace;
    call.workspace_bytes = workspace_bytes;
    launch_call(id, call);
  });
}

int attn_run_strided(const char* id, const void* q, const void* k, const void* v, void* o,
                     int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
                     const attn_strides* qkv_strides, const attn_strides* o_strides, void* stream,
                     char* message, std::size_t message_size) {
  attn_launch_args call = call_of(q, k, v, o, batch, heads, tokens, head_dim, stream);
  if (qkv_strides != nullptr) call.qkv_strides = *qkv_strides;
  if (o_strides != nullptr) call.o_strides = *o_strides;
  return attn_launch(id, &call, message, message_size);
}

int attn_run_with_log_sum_exp(const char* id, const void* q, const void* k, const void* v,
                              void* o, void* log_sum_exp, int64_t batch, int64_t heads,
                              int64_t tokens, int64_t head_dim, const attn_strides* qkv_strides,
                              const attn_strides* o_strides, void* stream, char* message,
                              std::size_t message_size) {
  if (log_sum_exp == nullptr) {
    write_message(message, message_size, "log_sum_exp is NULL; attn_run_strided runs without L");
    return ATTN_REFUSED;
  }
  attn_launch_args call = call_of(q, k, v, o, batch, heads, tokens, head_dim, stream);
  call.log_sum_exp = log_sum_exp;
  if (qkv_strides != nullptr) call.qkv_strides = *qkv_strides;
  if (o_strides != nullptr) call.o_strides = *o_strides;
  return attn_launch(id, &call, message, message_size);
}

int attn_choose_step(const attn_call* call, char* id, std::size_t id_size, char* message,
                     std::size_t message_size) {
  return guarded(message, message_size, [&] {
    if (call == nullptr) throw Refused{"call is NULL"};
    if (id == nullptr || id_size < 2) throw Refused{"id is NULL or has no room for a step id"};
    attn::Shape shape =
        with_dtype(shape_of(call->batch, call->heads, call->tokens, call->head_dim), call->dtype);
    if (call->kv_tokens != 0) {
      shape.kv_tokens = keys_of(call->kv_tokens, call->batch, call->heads, call->head_dim);
    }
    shape.key_padding = call->key_padding_mask != 0;
    shape.causal = causal_of(call->causal);
    const attn::DeviceLimits device = call->compute_capability > 0
                                          ? limits_of_capability(call->compute_capability)
                                          : limits_of(current_device());
    const attn::StepInfo* chosen = nullptr;
    std::string reasons;
    for (const attn::StepInfo& step : attn::registered_steps()) {  // v0, v1, ..., v10: in order
      const bool numbered = step.id.size() > 1 && step.id[0] == 'v' &&
                            std::all_of(step.id.begin() + 1, step.id.end(), [](char c) { return c >= '0' && c <= '9'; });
      const bool direction = call->backward != 0 ? attn::is_backward(step.kind)
                                                 : !attn::is_backward(step.kind) && step.writes_log_sum_exp;
      if (attn::is_baseline(step.kind) || !numbered || !direction) continue;
      std::optional<std::string> reason = step.refuses(shape, device);
      if (!reason && call->backward != 0 && call->deterministic != 0 && !step.has_deterministic_mode) {
        reason = step.id + " has no deterministic mode";
      }
      if (reason) {
        reasons += "; " + *reason;
      } else {
        chosen = &step;
      }
    }
    if (chosen == nullptr) {
      throw Refused{std::string("no ") + (call->backward != 0 ? "backward step" : "forward step that writes L") +
                    " serves this call on " + device.name + (reasons.empty() ? "" : ": " + reasons.substr(2))};
    }
    if (chosen->id.size() + 1 > id_size) throw Refused{"id has no room for '" + chosen->id + "'"};
    std::memcpy(id, chosen->id.c_str(), chosen->id.size() + 1);
  });
}

}  // extern "C"
