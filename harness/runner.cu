#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "gpu_reference.hpp"
#include "runner.hpp"

namespace attn {
namespace {

constexpr int kMaxBufferSets = 8;

// How long the checked run (and the GPU reference) may take before it counts as a hang (an
// unfinished warp-specialized exercise waits forever): 10 s, plus the shape's FLOPs at 0.01
// TFLOP/s, a tenth of the slowest step's rate (v0: 0.12 TFLOP/s at D = 64 on an H100, half that
// at D = 128). 10 s for the tests' small shapes, 20 s at (32, 12, 1025, 64), 38 s at the
// longest tested shape, (1, 2, 16385, 128).
double checked_run_limit_seconds(const Shape& shape) { return 10.0 + shape.flops() / 1e10; }

// After a hang the kernel still occupies the GPU, so every later run in this process would hang
// too: they fail at once with the first one's reason. A checked pipeline build's watchdog ends
// its kernel instead, but the step hangs on every input: its later runs fail at once as well.
std::string& gpu_hang_reason() {
  static std::string reason;
  return reason;
}
std::map<std::string, std::string>& hung_steps() {
  static std::map<std::string, std::string> steps;
  return steps;
}

// Elements of Q (and O) and of K (and V) as the step reads them: [B, H, N, D] and [B, H, N_k, D],
// or for packed sequences [total, H, D] each.
std::size_t step_elements(const Shape& shape) {
  return std::size_t(shape.packed() ? shape.total_tokens() * shape.heads * shape.head_dim
                                    : shape.elements());
}
std::size_t step_kv_elements(const Shape& shape) {
  return shape.packed() ? step_elements(shape) : std::size_t(shape.kv_elements());
}

// Packed sequences (Shape::lengths). The harness keeps the references' [B, H, N, D] layout, in
// which sequence b is rows 0 .. lengths[b] - 1 of batch element b; the step reads and writes
// [total, H, D], the sequences one after another. pack() takes a [B, H, N, per_row] tensor to
// [total, H, per_row]; unpack() takes it back, rows past a sequence's end `filler` (no output).
template <typename Value>
std::vector<Value> pack(const Shape& shape, const std::vector<Value>& padded, int64_t per_row) {
  std::vector<Value> packed(std::size_t(shape.total_tokens() * shape.heads * per_row));
  int64_t start = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t r = 0; r < shape.length(b); ++r) {
        const Value* from = padded.data() + ((b * shape.heads + h) * shape.tokens + r) * per_row;
        std::copy(from, from + per_row, packed.data() + ((start + r) * shape.heads + h) * per_row);
      }
    }
    start += shape.length(b);
  }
  return packed;
}
template <typename Value>
std::vector<Value> unpack(const Shape& shape, const std::vector<Value>& packed, int64_t per_row,
                          Value filler) {
  std::vector<Value> padded(std::size_t(shape.slices() * shape.tokens * per_row), filler);
  int64_t start = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t r = 0; r < shape.length(b); ++r) {
        const Value* from = packed.data() + ((start + r) * shape.heads + h) * per_row;
        std::copy(from, from + per_row, padded.data() + ((b * shape.heads + h) * shape.tokens + r) * per_row);
      }
    }
    start += shape.length(b);
  }
  return padded;
}
// L: the step's [H, total] into [B, H, N], rows past a sequence's end -inf.
std::vector<float> unpack_rows(const Shape& shape, const std::vector<float>& packed) {
  std::vector<float> padded(std::size_t(shape.slices() * shape.tokens), -INFINITY);
  const int64_t total = shape.total_tokens();
  int64_t start = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t r = 0; r < shape.length(b); ++r) {
        padded[std::size_t((b * shape.heads + h) * shape.tokens + r)] = packed[std::size_t(h * total + start + r)];
      }
    }
    start += shape.length(b);
  }
  return padded;
}
// The prefix sums of the lengths, [B + 1], as the step takes them.
std::vector<int32_t> prefix_sums(const Shape& shape) {
  std::vector<int32_t> sums{0};
  for (int64_t length : shape.lengths) sums.push_back(int32_t(sums.back() + length));
  return sums;
}

// One copy of the problem on the device, as the step reads it.
// 16-bit elements, fp16 or bf16 as the shape's dtype says (AttentionArgs' pointers are typed
// for fp16 either way).
struct DeviceSet {
  DeviceBuffer<__half> q, k, v, o;  // K and V have N_k rows a slice (Shape::keys())
  explicit DeviceSet(const Shape& shape)
      : q(step_elements(shape)), k(step_kv_elements(shape)), v(step_kv_elements(shape)),
        o(step_elements(shape)) {}
};

// A host tensor (fp16 containers, HostTensors) to the device in `dtype`: for bf16 each value is
// converted, exactly, since it was drawn as a bf16 value.
void upload(__half* device, const std::vector<__half>& host, DType dtype) {
  if (dtype == DType::fp16) {
    CUDA_CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(__half), cudaMemcpyHostToDevice));
    return;
  }
  std::vector<__nv_bfloat16> converted(host.size());
  parallel_for(int64_t(host.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) converted[i] = __float2bfloat16(__half2float(host[i]));
  });
  CUDA_CHECK(cudaMemcpy(device, converted.data(), converted.size() * sizeof(__nv_bfloat16),
                        cudaMemcpyHostToDevice));
}

// A step's output back into an fp16 container. A bf16 value in fp16's normal range is an fp16
// value exactly; one below it (|x| < 6.1e-5) is rounded to fp16's subnormals, an absolute error
// under 3e-8, and a NaN stays a NaN. Both are far inside every tolerance (check.hpp).
void download(std::vector<__half>& host, const __half* device, std::size_t count, DType dtype) {
  host.resize(count);
  if (dtype == DType::fp16) {
    CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(__half), cudaMemcpyDeviceToHost));
    return;
  }
  std::vector<__nv_bfloat16> raw(count);
  CUDA_CHECK(cudaMemcpy(raw.data(), device, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  parallel_for(int64_t(count), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) host[i] = __float2half(__bfloat162float(raw[i]));
  });
}

AttentionArgs args_for(const DeviceSet& set, const Shape& shape, void* workspace,
                       cudaStream_t stream, int max_persistent_blocks, const int32_t* cu_seqlens) {
  AttentionArgs args = attention_args(shape, set.q.data(), set.k.data(), set.v.data(),
                                      set.o.data(), workspace, stream);
  args.max_persistent_blocks = max_persistent_blocks;
  if (shape.packed()) {  // the same sequences for queries and keys: self-attention
    args.sequences.cu_seqlens_q = args.sequences.cu_seqlens_k = cu_seqlens;
    args.sequences.total_tokens = args.sequences.total_kv_tokens = int(shape.total_tokens());
  }
  return args;
}

// Free device memory less some headroom for the runtime and cuBLAS.
std::size_t usable_device_bytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes - std::min(free_bytes, std::size_t(256) << 20);
}

}  // namespace

std::string gibibytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / double(1ull << 30));
  return text;
}

void ensure_fits(const StepInfo& step, const Shape& shape, bool check_all_slices) {
  const std::size_t needed = device_bytes_needed(step, shape, 1, check_all_slices);
  const std::size_t usable = usable_device_bytes();
  if (needed > usable) {
    throw CudaError("shape " + shape.str() + " needs " + gibibytes(double(needed)) +
                    " of GPU memory for " + step.id + "; " + gibibytes(double(usable)) +
                    " is usable");
  }
}

std::size_t device_bytes_needed(const StepInfo& step, const Shape& shape, int buffer_sets,
                                bool check_all_slices) {
  const std::size_t rows = std::size_t(shape.slices() * shape.tokens);
  // The key-padding mask; for packed sequences, the one the references take their lengths from.
  const std::size_t padding_bytes =
      shape.key_padding || shape.packed() ? std::size_t(shape.batch * shape.keys()) : 0;
  if (is_backward(step.kind)) {  // one set: Q, O, dO, dQ of N rows a slice, K, V, dK, dV of N_k,
                                 // L, the mask; the GPU reference's gradients and bounds (and,
                                 // for packed sequences, its padded Q, K, V and dO)
    const std::size_t query_elements = std::size_t(shape.elements()),
                      key_elements = std::size_t(shape.kv_elements());
    return 4 * (query_elements + key_elements) * sizeof(__half) + rows * sizeof(float) +
           padding_bytes + step.workspace_for(shape) +
           (check_all_slices ? 2 * (query_elements + 2 * key_elements) * sizeof(float) +
                                   gpu_backward_reference_scratch_bytes(shape) +
                                   (shape.packed() ? 2 * (query_elements + key_elements) * sizeof(__half) : 0)
                             : 0);
  }
  // Packed sequences: the GPU reference reads Q, K and V padded, a copy of their own.
  const std::size_t padded_copies =
      shape.packed() && check_all_slices ? 3 * std::size_t(shape.elements()) * sizeof(__half) : 0;
  return std::size_t(buffer_sets) * std::size_t(shape.min_bytes()) +  // Q, K, V, O per set
         padding_bytes + padded_copies + step.workspace_for(shape) +
         (step.writes_log_sum_exp ? rows * sizeof(float) : 0) +  // the checked run's L
         (check_all_slices ? (std::size_t(shape.elements()) + rows) * sizeof(float) : 0);
}

// A step built with the checked pipeline: its first broken rule since the last call fails the
// check, with the rule's line as the reason.
static void take_pipeline_violation(const StepInfo& step, CheckResult& check) {
  if (step.pipeline_report == nullptr) return;
  if (const std::optional<std::string> violation = step.pipeline_report()) {
    check.checked = true;
    check.passed = false;
    if (check.pipeline_violation.empty()) check.pipeline_violation = *violation;
    check.worst = check.pipeline_violation;
    if (violation->find("pipeline rule watchdog") != std::string::npos) {
      hung_steps().emplace(step.id, *violation);
    }
  }
}

// Waits for `stream`. A hang is remembered for every later run of this process, and `on_hang`
// gives up the run's device memory (freeing it would wait for the hung kernel forever).
template <typename OnHang>
static void synchronize_or_remember(cudaStream_t stream, double limit_seconds, OnHang on_hang) {
  try {
    synchronize_within(stream, limit_seconds);
  } catch (const GpuHang& hang) {
    gpu_hang_reason() = hang.what();
    on_hang();
    throw;
  }
}

// After a hang every later run of this process would hang too: it fails at once instead.
static void throw_if_gpu_hung() {
  if (!gpu_hang_reason().empty()) {
    throw GpuHang("not run: an earlier kernel of this process never finished and still occupies "
                  "the GPU (" + gpu_hang_reason() + ")");
  }
}

void exit_if_gpu_hung(int status) {
  if (gpu_hang_reason().empty()) return;
  std::fflush(nullptr);
  std::_Exit(status);  // no CUDA teardown: it would wait for the kernel that never ends
}

BackwardRunResult run_backward_step(const StepInfo& step, const HostTensors& inputs,
                                    const std::vector<__half>& d_o,
                                    const BackwardReference* reference, const RunConfig& config) {
  throw_if_gpu_hung();
  const StepInfo* forward = find_step(step.forward_step);
  if (step.launch_backward == nullptr || forward == nullptr || forward->launch == nullptr ||
      !forward->writes_log_sum_exp) {
    throw std::logic_error(step.id + " needs its forward step '" + step.forward_step +
                           "' (one that writes L) linked into this program");
  }
  const Shape& shape = inputs.shape;
  for (const StepInfo* ran : {forward, &step}) {
    if (const auto hung = hung_steps().find(ran->id); hung != hung_steps().end()) {
      // The checked build's watchdog ended it; it would only hang again (and wait out the
      // watchdog on every run of a suite).
      throw CudaError("not run: an earlier run of " + ran->id + " hung: " + hung->second);
    }
  }
  const bool check_all_slices = reference != nullptr && config.check_all_slices;
  ensure_fits(step, shape, check_all_slices);
  // Q, O, dO and dQ have N rows a slice, K, V, dK and dV N_k (Shape::keys()); packed sequences
  // [total, H, D] each, L [H, total] (step_elements).
  const std::size_t count = step_elements(shape), kv_count = step_kv_elements(shape);
  const std::size_t rows = std::size_t(shape.heads * (shape.packed() ? shape.total_tokens() : shape.batch * shape.tokens));
  DeviceBuffer<__half> q(count), k(kv_count), v(kv_count), o(count), d_o_buffer(count), dq(count),
      dk(kv_count), dv(kv_count);
  DeviceBuffer<float> log_sum_exp(rows);
  DeviceBuffer<char> forward_workspace(forward->workspace_for(shape)),
      workspace(step.workspace_for(shape));
  for (const auto& [device, host] : {std::pair<__half*, const std::vector<__half>*>{q.data(), &inputs.q},
                                     {k.data(), &inputs.k}, {v.data(), &inputs.v},
                                     {d_o_buffer.data(), &d_o}}) {
    upload(device, shape.packed() ? pack(shape, *host, shape.head_dim) : *host, shape.dtype);
  }
  // The key-padding mask (B * N_k bytes), which the forward and the backward both honour. For
  // packed sequences it marks the keys past each sequence's end, for the GPU reference, which
  // reads the padded layout; the steps get the prefix sums of the lengths instead.
  DeviceBuffer<uint8_t> key_padding_mask(inputs.key_padding_mask.size());
  if (!inputs.key_padding_mask.empty()) {
    CUDA_CHECK(cudaMemcpy(key_padding_mask.data(), inputs.key_padding_mask.data(),
                          key_padding_mask.bytes(), cudaMemcpyHostToDevice));
  }
  const uint8_t* padding = inputs.key_padding_mask.empty() ? nullptr : key_padding_mask.data();
  const uint8_t* step_padding = shape.packed() ? nullptr : padding;
  const std::vector<int32_t> sums = shape.packed() ? prefix_sums(shape) : std::vector<int32_t>{};
  DeviceBuffer<int32_t> cu_seqlens(sums.size());
  if (!sums.empty()) {
    CUDA_CHECK(cudaMemcpy(cu_seqlens.data(), sums.data(), cu_seqlens.bytes(), cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // as in run_step
  const Stream owned_stream;
  const cudaStream_t stream = owned_stream.get();

  AttentionArgs forward_args = attention_args(shape, q.data(), k.data(), v.data(), o.data(),
                                              forward_workspace.data(), stream);
  forward_args.log_sum_exp = log_sum_exp.data();
  forward_args.key_padding_mask = step_padding;
  if (shape.packed()) {  // the same sequences for queries and keys: self-attention
    forward_args.sequences.cu_seqlens_q = forward_args.sequences.cu_seqlens_k = cu_seqlens.data();
    forward_args.sequences.total_tokens = forward_args.sequences.total_kv_tokens = int(shape.total_tokens());
  }
  if (forward->pipeline_report != nullptr) forward->pipeline_report();  // a clean record
  forward->launch(forward_args);
  CUDA_CHECK_LAUNCH();
  BackwardArgs args = backward_args(
      shape,
      {q.data(), k.data(), v.data(), o.data(), d_o_buffer.data(), log_sum_exp.data(), dq.data(),
       dk.data(), dv.data()},
      workspace.data(), stream, config.deterministic, forward_args.scale);
  args.key_padding_mask = step_padding;
  args.sequences = forward_args.sequences;
  // NaN: an unwritten element fails (a padded key's dK and dV too: they must be written as 0).
  for (const auto& [gradient, elements] : {std::pair<__half*, std::size_t>{dq.data(), count},
                                           {dk.data(), kv_count}, {dv.data(), kv_count}}) {
    CUDA_CHECK(cudaMemsetAsync(gradient, 0xFF, elements * sizeof(__half), stream));
  }
  // The workspace too (NaN floats, -1 counters), as one the caller used before would be: a step
  // that counts on fresh memory being zero (cudaMalloc's often is) fails here.
  CUDA_CHECK(cudaMemsetAsync(workspace.data(), 0xFF, workspace.bytes(), stream));
  if (step.pipeline_report != nullptr) step.pipeline_report();  // clear what an earlier run left
  step.launch_backward(args);
  CUDA_CHECK_LAUNCH();
  const auto abandon_buffers = [&] {
    for (DeviceBuffer<__half>* buffer : {&q, &k, &v, &o, &d_o_buffer, &dq, &dk, &dv}) buffer->abandon();
    log_sum_exp.abandon();
    forward_workspace.abandon();
    workspace.abandon();
    key_padding_mask.abandon();
    cu_seqlens.abandon();
  };
  synchronize_or_remember(stream, 2 * checked_run_limit_seconds(shape), abandon_buffers);

  BackwardRunResult result;
  if (reference != nullptr) {
    for (const auto& [host, device, elements] :
         {std::tuple<std::vector<__half>*, const __half*, std::size_t>{&result.dq, dq.data(), count},
          {&result.dk, dk.data(), kv_count}, {&result.dv, dv.data(), kv_count}}) {
      download(*host, device, elements, shape.dtype);
      // Packed: back to the references' [B, H, N, D], 0 past each sequence's end, as the
      // references have it there (a padded key's dK and dV, a padded row's dQ: its dO is 0).
      if (shape.packed()) *host = unpack(shape, *host, shape.head_dim, __float2half(0.0f));
    }
    AllSliceGradients all;
    if (check_all_slices) {  // every element, against the GPU reference and its bounds
      // dQ, dK, dV, then their bounds: each as many elements as the gradient it goes with.
      const std::size_t padded_count = std::size_t(shape.elements()), padded_kv_count = std::size_t(shape.kv_elements());
      const std::size_t sizes[6] = {padded_count, padded_kv_count, padded_kv_count,
                                    padded_count, padded_kv_count, padded_kv_count};
      // Packed sequences: the reference reads Q, K, V and dO padded, a copy of their own.
      DeviceBuffer<__half> padded[4] = {DeviceBuffer<__half>(shape.packed() ? padded_count : 0),
                                        DeviceBuffer<__half>(shape.packed() ? padded_kv_count : 0),
                                        DeviceBuffer<__half>(shape.packed() ? padded_kv_count : 0),
                                        DeviceBuffer<__half>(shape.packed() ? padded_count : 0)};
      const std::vector<__half>* padded_hosts[4] = {&inputs.q, &inputs.k, &inputs.v, &d_o};
      if (shape.packed()) {
        for (int i = 0; i < 4; ++i) upload(padded[i].data(), *padded_hosts[i], shape.dtype);
        CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // as in run_step
      }
      auto reference_input = [&](int i, const DeviceBuffer<__half>& step_input) {
        return shape.packed() ? padded[i].data() : step_input.data();
      };
      DeviceBuffer<float> all_gradients[6] = {
          DeviceBuffer<float>(sizes[0]), DeviceBuffer<float>(sizes[1]), DeviceBuffer<float>(sizes[2]),
          DeviceBuffer<float>(sizes[3]), DeviceBuffer<float>(sizes[4]), DeviceBuffer<float>(sizes[5])};
      DeviceBuffer<double> row_stats(gpu_backward_reference_scratch_bytes(shape) / sizeof(double));
      GpuGradients out;
      float** outputs[6] = {&out.dq, &out.dk, &out.dv, &out.dq_bound, &out.dk_bound, &out.dv_bound};
      for (int i = 0; i < 6; ++i) *outputs[i] = all_gradients[i].data();
      launch_gpu_backward_reference(reference_input(0, q), reference_input(1, k), reference_input(2, v),
                                    reference_input(3, d_o_buffer), padding, out, row_stats.data(),
                                    shape, args.scale, stream);
      synchronize_or_remember(stream, 2 * checked_run_limit_seconds(shape), [&] {
        abandon_buffers();
        for (DeviceBuffer<float>& buffer : all_gradients) buffer.abandon();
        for (DeviceBuffer<__half>& buffer : padded) buffer.abandon();
        row_stats.abandon();
      });
      std::vector<float>* hosts[6] = {&all.dq, &all.dk, &all.dv, &all.dq_bound, &all.dk_bound, &all.dv_bound};
      for (int i = 0; i < 6; ++i) {
        hosts[i]->resize(sizes[i]);
        CUDA_CHECK(cudaMemcpy(hosts[i]->data(), all_gradients[i].data(), sizes[i] * sizeof(float),
                              cudaMemcpyDeviceToHost));
      }
    }
    result.check = compare_gradients(shape, *reference, result.dq, result.dk, result.dv, all);
    // The checked pipeline build: the forward's broken rule (it ran first) or the backward's.
    take_pipeline_violation(*forward, result.check);
    take_pipeline_violation(step, result.check);
  }
  if (config.time && hung_steps().count(step.id) == 0) {
    try {
      result.timing = time_launches(
          [&](int) {
            step.launch_backward(args);
            CUDA_CHECK_LAUNCH();
          },
          stream, config.warmup, config.iters);
    } catch (const GpuHang& hang) {
      gpu_hang_reason() = hang.what();
      abandon_buffers();
      throw;
    }
    result.timing.buffer_sets = 1;
  }
  return result;
}

RunResult run_step(const StepInfo& step, const HostTensors& inputs, const Reference* reference,
                   const RunConfig& config) {
  if (is_backward(step.kind)) {
    throw std::logic_error(step.id + " is a backward step: run_backward_step runs it");
  }
  throw_if_gpu_hung();
  const Shape& shape = inputs.shape;
  if (const auto hung = hung_steps().find(step.id); hung != hung_steps().end()) {
    // The checked build's watchdog ended it; it would only hang again.
    throw CudaError("not run: an earlier run of " + step.id + " hung: " + hung->second);
  }
  const std::size_t count = step_elements(shape);  // of O as the step writes it
  const std::size_t set_bytes = std::size_t(shape.min_bytes());  // Q, K, V and O

  // Enough copies that they cannot all sit in L2 (two L2s' worth), as far as memory allows.
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const std::size_t usable = usable_device_bytes();
  const bool check_all_slices = reference != nullptr && config.check_all_slices;
  ensure_fits(step, shape, check_all_slices);
  int sets = config.time ? int(std::clamp<std::size_t>((2 * std::size_t(l2_bytes)) / set_bytes + 1,
                                                       1, kMaxBufferSets))
                         : 1;
  while (sets > 1 && device_bytes_needed(step, shape, sets, check_all_slices) > usable) --sets;

  const Stream owned_stream;
  const cudaStream_t stream = owned_stream.get();

  std::vector<DeviceSet> device_sets;
  device_sets.reserve(sets);
  for (int s = 0; s < sets; ++s) device_sets.emplace_back(shape);
  DeviceBuffer<char> workspace(step.workspace_for(shape));
  const int64_t head_dim = shape.head_dim;
  for (const auto& [device, host] : {std::pair<__half*, const std::vector<__half>*>{device_sets[0].q.data(), &inputs.q},
                                     {device_sets[0].k.data(), &inputs.k}, {device_sets[0].v.data(), &inputs.v}}) {
    if (shape.packed()) {
      upload(device, pack(shape, *host, head_dim), shape.dtype);
    } else {
      upload(device, *host, shape.dtype);
    }
  }
  // The key-padding mask, one for every buffer set (it is B * N_k bytes). For packed sequences it
  // marks the keys past each sequence's end, for the GPU reference, which reads the padded layout;
  // the step gets the prefix sums of the lengths instead.
  DeviceBuffer<uint8_t> key_padding_mask(inputs.key_padding_mask.size());
  if (!inputs.key_padding_mask.empty()) {
    CUDA_CHECK(cudaMemcpy(key_padding_mask.data(), inputs.key_padding_mask.data(),
                          key_padding_mask.bytes(), cudaMemcpyHostToDevice));
  }
  const uint8_t* padding = inputs.key_padding_mask.empty() ? nullptr : key_padding_mask.data();
  const uint8_t* step_padding = shape.packed() ? nullptr : padding;
  const std::vector<int32_t> sums = shape.packed() ? prefix_sums(shape) : std::vector<int32_t>{};
  DeviceBuffer<int32_t> cu_seqlens(sums.size());
  if (!sums.empty()) {
    CUDA_CHECK(cudaMemcpy(cu_seqlens.data(), sums.data(), cu_seqlens.bytes(), cudaMemcpyHostToDevice));
  }
  for (int s = 1; s < sets; ++s) {
    for (auto member : {&DeviceSet::q, &DeviceSet::k, &DeviceSet::v}) {
      CUDA_CHECK(cudaMemcpy((device_sets[s].*member).data(), (device_sets[0].*member).data(),
                            (device_sets[0].*member).bytes(), cudaMemcpyDeviceToDevice));
    }
  }
  // These copies run on the legacy default stream, and a pageable upload may return before its
  // data lands; the step runs on `stream`, which does not wait for the legacy stream
  // (non-blocking). Without this, a busy GPU can start the step on half-copied inputs.
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));

  // The checked run, on an output of NaNs (0xFFFF is a NaN in fp16), and on an L of NaNs
  // (0xFFFFFFFF in fp32) when the step writes L: checked with O. The timed runs ask for no L.
  RunResult result;
  if (step.pipeline_report != nullptr) step.pipeline_report();  // clear what an earlier run left
  const std::size_t rows = std::size_t(shape.slices() * shape.tokens);  // of L, padded
  const std::size_t step_rows_count = shape.packed() ? std::size_t(shape.heads * shape.total_tokens()) : rows;
  const bool check_log_sum_exp = step.writes_log_sum_exp && reference != nullptr;
  DeviceBuffer<float> log_sum_exp(check_log_sum_exp ? step_rows_count : 0);
  CUDA_CHECK(cudaMemsetAsync(device_sets[0].o.data(), 0xFF, count * sizeof(__half), stream));
  AttentionArgs checked_args = args_for(device_sets[0], shape, workspace.data(), stream,
                                        config.max_persistent_blocks, cu_seqlens.data());
  checked_args.key_padding_mask = step_padding;
  if (check_log_sum_exp) {
    CUDA_CHECK(cudaMemsetAsync(log_sum_exp.data(), 0xFF, log_sum_exp.bytes(), stream));
    checked_args.log_sum_exp = log_sum_exp.data();
  }
  step.launch(checked_args);
  CUDA_CHECK_LAUNCH();
  const auto abandon_buffers = [&] {
    for (DeviceSet& set : device_sets) {
      for (auto member : {&DeviceSet::q, &DeviceSet::k, &DeviceSet::v, &DeviceSet::o}) {
        (set.*member).abandon();
      }
    }
    workspace.abandon();
    log_sum_exp.abandon();
    key_padding_mask.abandon();
    cu_seqlens.abandon();
  };
  synchronize_or_remember(stream, checked_run_limit_seconds(shape), abandon_buffers);
  download(result.output, device_sets[0].o.data(), count, shape.dtype);
  if (shape.packed()) result.output = unpack(shape, result.output, head_dim, __float2half(0.0f));
  if (reference != nullptr) {
    std::vector<float> all_slices, all_rows;
    if (check_all_slices) {
      const std::size_t padded_count = std::size_t(shape.elements());
      DeviceBuffer<float> gpu_reference(padded_count), gpu_reference_rows(check_log_sum_exp ? rows : 0);
      // Packed sequences: the reference reads the padded inputs, a copy of their own.
      DeviceBuffer<__half> padded_q(shape.packed() ? padded_count : 0),
          padded_k(shape.packed() ? padded_count : 0), padded_v(shape.packed() ? padded_count : 0);
      if (shape.packed()) {
        upload(padded_q.data(), inputs.q, shape.dtype);
        upload(padded_k.data(), inputs.k, shape.dtype);
        upload(padded_v.data(), inputs.v, shape.dtype);
        CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
      }
      launch_gpu_reference(shape.packed() ? padded_q.data() : device_sets[0].q.data(),
                           shape.packed() ? padded_k.data() : device_sets[0].k.data(),
                           shape.packed() ? padded_v.data() : device_sets[0].v.data(), padding,
                           gpu_reference.data(),
                           check_log_sum_exp ? gpu_reference_rows.data() : nullptr, shape, stream);
      synchronize_or_remember(stream, checked_run_limit_seconds(shape), [&] {
        abandon_buffers();
        gpu_reference.abandon();
        gpu_reference_rows.abandon();
        for (DeviceBuffer<__half>* buffer : {&padded_q, &padded_k, &padded_v}) buffer->abandon();
      });
      all_slices.resize(padded_count);
      CUDA_CHECK(cudaMemcpy(all_slices.data(), gpu_reference.data(), padded_count * sizeof(float),
                            cudaMemcpyDeviceToHost));
      if (check_log_sum_exp) {
        all_rows.resize(rows);
        CUDA_CHECK(cudaMemcpy(all_rows.data(), gpu_reference_rows.data(), rows * sizeof(float),
                              cudaMemcpyDeviceToHost));
      }
    }
    result.check = compare(inputs, *reference, result.output, all_slices);
    if (check_log_sum_exp) {
      std::vector<float> step_rows(step_rows_count);
      CUDA_CHECK(cudaMemcpy(step_rows.data(), log_sum_exp.data(), step_rows_count * sizeof(float),
                            cudaMemcpyDeviceToHost));
      if (shape.packed()) step_rows = unpack_rows(shape, step_rows);
      compare_log_sum_exp(shape, *reference, step_rows, all_rows, result.check);
    }
  }
  take_pipeline_violation(step, result.check);

  if (config.time && hung_steps().count(step.id) == 0) {
    if (config.timed_log_sum_exp && !step.writes_log_sum_exp) {
      throw std::logic_error(step.id + " does not write L; the caller must not ask it to");
    }
    // One L for every buffer set: B * H * N floats, 1/(2D) of O's bytes.
    DeviceBuffer<float> timed_rows(config.timed_log_sum_exp ? step_rows_count : 0);
    try {
      result.timing = time_launches(
          [&](int run) {
            AttentionArgs args = args_for(device_sets[run % sets], shape, workspace.data(), stream,
                                          config.max_persistent_blocks, cu_seqlens.data());
            args.key_padding_mask = step_padding;
            args.log_sum_exp = timed_rows.data();  // nullptr unless asked
            step.launch(args);
            CUDA_CHECK_LAUNCH();
          },
          stream, config.warmup, config.iters);
    } catch (const GpuHang& hang) {
      gpu_hang_reason() = hang.what();
      abandon_buffers();
      timed_rows.abandon();
      throw;
    }
    result.timing.buffer_sets = sets;
    take_pipeline_violation(step, result.check);
  }
  return result;
}

}  // namespace attn
