// The C ABI on a GPU, for one step at a time (capi_gpu_tests --step=v3): results through
// attn_run against the fp64 CPU reference at tail shapes for every head dim the step serves,
// views, L (the log-sum-exp) where the step writes it, the caller's stream honoured, the
// caller's workspace path, a launch captured into a CUDA graph, another scale, and misuse
// (cross-attention and masks included) refused without a launch. A backward step
// (capi_gpu_tests --step=v10) runs the suite "backward" instead: through attn_launch_backward on
// views (Q, K, V from a packed projection, O and dO [B, N, H, D]; sequence-first cross-attention)
// the bits it gives on contiguous tensors, or a refusal by a step without takes_strides. The step
// runs from libattention_steps.so only: this program links no step object, just the harness's
// inputs, reference and check (attn_common).
// Without a CUDA device it says so and exits 77 (ctest: skipped); on a GPU the step cannot run
// on, it checks that the library refuses the step there, then exits 77 with the reason.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "attention_steps.h"
#include "check.hpp"
#include "cpu_reference.hpp"
#include "device_buffer.hpp"
#include "inputs.hpp"

namespace {

constexpr int kSkipped = 77;
attn_step_info step{};  // the step under test, as the library lists it

struct Answer {
  int status = -1;
  std::string message;
};

// The problem on the device, O filled with NaN (0xFFFF) so an unwritten element fails the check.
struct DeviceProblem {
  attn::HostTensors inputs;
  attn::DeviceBuffer<__half> q, k, v, o;
  explicit DeviceProblem(const attn::Shape& shape, uint64_t seed = 23)
      : inputs(attn::make_inputs(shape, seed)),
        q(std::size_t(shape.elements())),
        k(std::size_t(shape.kv_elements())),  // N_k rows a slice (cross-attention)
        v(std::size_t(shape.kv_elements())),
        o(std::size_t(shape.elements())) {
    CUDA_CHECK(cudaMemcpy(q.data(), inputs.q.data(), q.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(k.data(), inputs.k.data(), k.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(v.data(), inputs.v.data(), v.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(o.data(), 0xFF, o.bytes()));
    // The copies and the fill run on the legacy default stream (a pageable upload may return
    // before its data lands), and the steps run on non-blocking streams that do not wait for
    // it: only this makes the inputs and the NaN poison be there when a step reads them.
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  const attn::Shape& shape() const { return inputs.shape; }

  Answer run(cudaStream_t stream, const char* id = step.id) {
    Answer answer;
    char message[1024] = "";
    const attn::Shape& s = shape();
    answer.status = attn_run(id, q.data(), k.data(), v.data(), o.data(), s.batch, s.heads, s.tokens,
                             s.head_dim, stream, message, sizeof message);
    answer.message = message;
    return answer;
  }

  std::vector<__half> output() const {
    std::vector<__half> host(o.size());
    CUDA_CHECK(cudaMemcpy(host.data(), o.data(), o.bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

  attn::CheckResult check() const {
    const attn::Reference reference =
        attn::compute_reference(inputs, attn::slices_to_check(shape(), attn::CheckMode::full, 1));
    return attn::compare(inputs, reference, output());
  }
};

void require_pass(const attn::CheckResult& result) {
  INFO("relative error " << result.relative_error << " (tolerance " << result.relative_tolerance
                         << "), max abs error " << result.max_abs_error << " (tolerance "
                         << result.abs_tolerance << "), " << result.nonfinite << " non-finite; "
                         << result.worst);
  CHECK(result.passed);
}

Answer check_shape(const attn::Shape& s) {
  Answer answer;
  char message[1024] = "";
  answer.status = attn_check(step.id, s.batch, s.heads, s.tokens, s.head_dim, message, sizeof message);
  answer.message = message;
  return answer;
}

std::vector<int> head_dims() { return {step.head_dims, step.head_dims + step.head_dim_count}; }

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

}  // namespace

TEST_CASE("through the C ABI: tail shapes, every head dim served, against the fp64 reference") {
  const attn::Stream stream;
  for (int head_dim : head_dims()) {
    for (const attn::Shape& shape : {attn::Shape{2, 3, 65, head_dim}, attn::Shape{1, 2, 1, head_dim},
                                    attn::Shape{1, 1, 130, head_dim}}) {
      CAPTURE(shape.str());
      const Answer served = check_shape(shape);
      INFO("attn_check: " << served.message);
      REQUIRE(served.status == ATTN_OK);  // every step serves these small N on every GPU
      DeviceProblem problem(shape);
      const Answer ran = problem.run(stream.get());
      INFO("attn_run: " << ran.message);
      REQUIRE(ran.status == ATTN_OK);
      CHECK(ran.message == "ok");
      CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      require_pass(problem.check());
    }
  }
}

TEST_CASE("views: Q, K, V cut from one packed projection [B, N, 3, H, D], O written as [B, N, H, D]") {
  const attn::Stream stream;
  for (int head_dim : head_dims()) {
    for (int64_t tokens : {int64_t(65), int64_t(577)}) {
      const attn::Shape shape{2, 3, tokens, head_dim};
      CAPTURE(shape.str());
      if (check_shape(shape).status != ATTN_OK) continue;
      const attn::HostTensors inputs = attn::make_inputs(shape, 29);
      const int64_t H = shape.heads, N = shape.tokens, D = shape.head_dim;
      // Element (b, h, n, d) of the packed tensors, and of [B, H, N, D].
      auto packed = [&](int64_t b, int64_t h, int64_t n, int64_t which) {
        return ((b * N + n) * 3 + which) * H * D + h * D;
      };
      auto contiguous = [&](int64_t b, int64_t h, int64_t n) { return ((b * H + h) * N + n) * D; };
      std::vector<__half> host_qkv(std::size_t(3 * shape.elements()));
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t n = 0; n < N; ++n)
            for (int64_t which = 0; which < 3; ++which) {
              const std::vector<__half>& from = which == 0 ? inputs.q : which == 1 ? inputs.k : inputs.v;
              std::memcpy(&host_qkv[std::size_t(packed(b, h, n, which))],
                          &from[std::size_t(contiguous(b, h, n))], std::size_t(D) * 2);
            }
      attn::DeviceBuffer<__half> qkv(host_qkv.size()), o(std::size_t(shape.elements()));
      CUDA_CHECK(cudaMemcpy(qkv.data(), host_qkv.data(), qkv.bytes(), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemset(o.data(), 0xFF, o.bytes()));
      CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // as in DeviceProblem
      const attn_strides qkv_strides{N * 3 * H * D, D, 3 * H * D}, o_strides{N * H * D, D, H * D};
      char message[1024] = "";
      const int status = attn_run_strided(step.id, qkv.data(), qkv.data() + H * D,
                                          qkv.data() + 2 * H * D, o.data(), shape.batch, H, N, D,
                                          &qkv_strides, &o_strides, stream.get(), message,
                                          sizeof message);
      INFO("attn_run_strided: " << message);
      CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      std::vector<__half> host_o(o.size());
      CUDA_CHECK(cudaMemcpy(host_o.data(), o.data(), o.bytes(), cudaMemcpyDeviceToHost));
      if (!step.takes_strides) {
        CHECK(status == ATTN_REFUSED);
        CHECK(contains(message, "contiguous"));
        std::size_t untouched = 0;  // refused: nothing ran
        for (__half value : host_o) untouched += *reinterpret_cast<const uint16_t*>(&value) == 0xFFFF;
        CHECK(untouched == host_o.size());
        continue;
      }
      REQUIRE(status == ATTN_OK);
      std::vector<__half> output(host_o.size());  // [B, N, H, D] back to [B, H, N, D]
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t n = 0; n < N; ++n)
            std::memcpy(&output[std::size_t(contiguous(b, h, n))],
                        &host_o[std::size_t(((b * N + n) * H + h) * D)], std::size_t(D) * 2);
      const attn::Reference reference =
          attn::compute_reference(inputs, attn::slices_to_check(shape, attn::CheckMode::full, 1));
      require_pass(attn::compare(inputs, reference, output));
    }
  }
}

TEST_CASE("views in cross-attention: sequence-first Q [N, B, H, D], K and V [N_k, B, H, D], one set of strides") {
  if (!step.takes_kv_tokens) return;  // the cross-attention test case checks the refusal
  const attn::Stream stream;
  for (int head_dim : head_dims()) {
    for (const auto& [tokens, kv_tokens] : {std::pair<int64_t, int64_t>{65, 130}, {100, 1050}, {1, 17}}) {
      attn::Shape shape{2, 3, tokens, head_dim, attn::DType::fp16, kv_tokens};
      CAPTURE(shape.str());
      if (check_shape(shape).status != ATTN_OK) continue;
      const attn::HostTensors inputs = attn::make_inputs(shape, 37);
      const int64_t B = shape.batch, H = shape.heads, D = shape.head_dim;
      // [rows, B, H, D] from [B, H, rows, D]: a DETR module's projection, and back.
      auto sequence_first = [&](const std::vector<__half>& from, int64_t rows) {
        std::vector<__half> to(from.size());
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < rows; ++n)
              std::memcpy(&to[std::size_t(((n * B + b) * H + h) * D)],
                          &from[std::size_t(((b * H + h) * rows + n) * D)], std::size_t(D) * 2);
        return to;
      };
      auto upload = [&](const std::vector<__half>& host) {
        attn::DeviceBuffer<__half> device(host.size());
        CUDA_CHECK(cudaMemcpy(device.data(), host.data(), device.bytes(), cudaMemcpyHostToDevice));
        return device;
      };
      const attn::DeviceBuffer<__half> q = upload(sequence_first(inputs.q, tokens));
      const attn::DeviceBuffer<__half> k = upload(sequence_first(inputs.k, kv_tokens));
      const attn::DeviceBuffer<__half> v = upload(sequence_first(inputs.v, kv_tokens));
      attn::DeviceBuffer<__half> o(std::size_t(shape.elements()));
      CUDA_CHECK(cudaMemset(o.data(), 0xFF, o.bytes()));
      CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
      attn_launch_args call{};
      call.q = q.data();
      call.k = k.data();
      call.v = v.data();
      call.o = o.data();
      call.batch = B;
      call.heads = H;
      call.tokens = tokens;
      call.head_dim = D;
      call.kv_tokens = kv_tokens;
      call.qkv_strides = attn_strides{H * D, D, B * H * D};  // the same for N and N_k rows
      call.o_strides = attn_strides{H * D, D, B * H * D};
      call.stream = stream.get();
      char message[1024] = "";
      const int status = attn_launch(step.id, &call, message, sizeof message);
      INFO("attn_launch: " << message);
      CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      if (!step.takes_strides) {
        CHECK(status == ATTN_REFUSED);
        CHECK(contains(message, "contiguous"));
        continue;
      }
      REQUIRE(status == ATTN_OK);
      std::vector<__half> host_o(o.size()), output(o.size());
      CUDA_CHECK(cudaMemcpy(host_o.data(), o.data(), o.bytes(), cudaMemcpyDeviceToHost));
      for (int64_t b = 0; b < B; ++b)  // [N, B, H, D] back to [B, H, N, D]
        for (int64_t h = 0; h < H; ++h)
          for (int64_t n = 0; n < tokens; ++n)
            std::memcpy(&output[std::size_t(((b * H + h) * tokens + n) * D)],
                        &host_o[std::size_t(((n * B + b) * H + h) * D)], std::size_t(D) * 2);
      const attn::Reference reference =
          attn::compute_reference(inputs, attn::slices_to_check(shape, attn::CheckMode::full, 1));
      require_pass(attn::compare(inputs, reference, output));
    }
  }
}

TEST_CASE("L, the log-sum-exp of each row: written by the steps that say so, refused by the others") {
  const attn::Stream stream;
  for (int head_dim : head_dims()) {
    for (const attn::Shape& shape : {attn::Shape{2, 3, 65, head_dim}, attn::Shape{1, 2, 1, head_dim},
                                    attn::Shape{1, 1, 577, head_dim}}) {
      CAPTURE(shape.str());
      if (check_shape(shape).status != ATTN_OK) continue;
      DeviceProblem problem(shape);
      const std::size_t rows = std::size_t(shape.slices() * shape.tokens);
      attn::DeviceBuffer<float> log_sum_exp(rows);
      CUDA_CHECK(cudaMemset(log_sum_exp.data(), 0xFF, log_sum_exp.bytes()));  // NaN
      CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
      char message[1024] = "";
      const int status = attn_run_with_log_sum_exp(
          step.id, problem.q.data(), problem.k.data(), problem.v.data(), problem.o.data(),
          log_sum_exp.data(), shape.batch, shape.heads, shape.tokens, shape.head_dim, nullptr,
          nullptr, stream.get(), message, sizeof message);
      INFO("attn_run_with_log_sum_exp: " << message);
      if (!step.writes_log_sum_exp) {
        CHECK(status == ATTN_REFUSED);
        CHECK(contains(message, "does not write L"));
        break;
      }
      REQUIRE(status == ATTN_OK);
      CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      std::vector<float> host_rows(rows);
      CUDA_CHECK(cudaMemcpy(host_rows.data(), log_sum_exp.data(), log_sum_exp.bytes(),
                            cudaMemcpyDeviceToHost));
      const attn::Reference reference = attn::compute_reference(
          problem.inputs, attn::slices_to_check(shape, attn::CheckMode::full, 1));
      attn::CheckResult result = attn::compare(problem.inputs, reference, problem.output());
      attn::compare_log_sum_exp(shape, reference, host_rows, {}, result);
      INFO("L: max abs error " << result.log_sum_exp_max_error << " over "
                               << result.log_sum_exp_rows << " rows");
      CHECK(result.log_sum_exp_rows == int64_t(rows));
      require_pass(result);
    }
  }
}

namespace {
// A host function that holds its stream until released (or 30 s pass, so a bug cannot hang).
struct Gate {
  std::atomic<bool> open{false};
  static void CUDART_CB wait(void* self) {
    auto* gate = static_cast<Gate*>(self);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gate->open.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};
}  // namespace

TEST_CASE("the work is queued on the caller's stream, in its order, and the call returns at once") {
  const attn::Shape shape{2, 3, 65, head_dims().front()};
  const attn::Stream stream, observer;
  {  // a first run makes whatever the step keeps (a cuBLAS handle) before the stream is held
    DeviceProblem warm_up(shape);
    REQUIRE(warm_up.run(stream.get()).status == ATTN_OK);
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  }
  DeviceProblem problem(shape);
  __half* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), problem.o.bytes()));
  Gate gate;
  CUDA_CHECK(cudaLaunchHostFunc(stream.get(), Gate::wait, &gate));
  const Answer ran = problem.run(stream.get());
  INFO("attn_run: " << ran.message);
  REQUIRE(ran.status == ATTN_OK);
  // While the stream is held, O must still be all NaN: nothing ran ahead of the caller's work.
  CUDA_CHECK(cudaMemcpyAsync(pinned, problem.o.data(), problem.o.bytes(), cudaMemcpyDeviceToHost,
                             observer.get()));
  CUDA_CHECK(cudaStreamSynchronize(observer.get()));
  std::vector<uint16_t> bits(problem.o.size());
  std::memcpy(bits.data(), pinned, problem.o.bytes());
  CHECK(cudaStreamQuery(stream.get()) == cudaErrorNotReady);
  std::size_t untouched = 0;
  for (uint16_t value : bits) untouched += value == 0xFFFF;
  CHECK(untouched == bits.size());
  gate.open = true;
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  // Only now: cudaFreeHost waits for the whole device, the held stream too.
  CUDA_CHECK(cudaFreeHost(pinned));
  require_pass(problem.check());
}

TEST_CASE("the caller's workspace, and the stream-ordered one, give the same answer") {
  const attn::Shape shape{2, 3, 65, head_dims().front()};
  std::size_t bytes = 0;
  char message[1024] = "";
  REQUIRE(attn_workspace_bytes(step.id, shape.batch, shape.heads, shape.tokens, shape.head_dim,
                               &bytes, message, sizeof message) == ATTN_OK);
  CHECK((bytes > 0) == (step.uses_workspace != 0));
  DeviceProblem problem(shape);
  attn::DeviceBuffer<char> workspace(bytes);
  const int status = attn_run_with_workspace(
      step.id, problem.q.data(), problem.k.data(), problem.v.data(), problem.o.data(), shape.batch,
      shape.heads, shape.tokens, shape.head_dim, workspace.data(), bytes, nullptr, message,
      sizeof message);
  INFO("attn_run_with_workspace: " << message);
  REQUIRE(status == ATTN_OK);
  CUDA_CHECK(cudaDeviceSynchronize());
  require_pass(problem.check());
  if (bytes > 0) {  // one byte short is refused
    const int short_status = attn_run_with_workspace(
        step.id, problem.q.data(), problem.k.data(), problem.v.data(), problem.o.data(),
        shape.batch, shape.heads, shape.tokens, shape.head_dim, workspace.data(), bytes - 1,
        nullptr, message, sizeof message);
    CHECK(short_status == ATTN_REFUSED);
    CHECK(contains(message, "workspace"));
  }
}

namespace {
// attn_launch on a DeviceProblem, every field but the tensors and the shape left at its default.
attn_launch_args launch_args_for(DeviceProblem& problem, cudaStream_t stream) {
  attn_launch_args call{};
  call.q = problem.q.data();
  call.k = problem.k.data();
  call.v = problem.v.data();
  call.o = problem.o.data();
  call.batch = problem.shape().batch;
  call.heads = problem.shape().heads;
  call.tokens = problem.shape().tokens;
  call.kv_tokens = problem.shape().kv_tokens;  // 0: as many as the queries
  call.head_dim = problem.shape().head_dim;
  call.stream = stream;
  return call;
}
}  // namespace

TEST_CASE("a launch captured into a CUDA graph and replayed gives the answer (with and without the caller's vouching)") {
  const attn::Shape shape{2, 3, 65, head_dims().front()};
  const attn::Stream stream;
  {  // a first run makes whatever the step keeps (a cuBLAS handle, the device's limits)
    DeviceProblem warm_up(shape);
    REQUIRE(warm_up.run(stream.get()).status == ATTN_OK);
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  }
  for (int vouched : {0, 1}) {
    CAPTURE(vouched);
    DeviceProblem problem(shape);
    attn_launch_args call = launch_args_for(problem, stream.get());
    call.pointers_checked_by_caller = vouched;
    char message[1024] = "";
    // Global mode: the strictest, in which any call that is not capture-safe (a synchronising
    // query, cudaMalloc) invalidates the capture.
    CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
    const int status = attn_launch(step.id, &call, message, sizeof message);
    cudaGraph_t graph = nullptr;
    const cudaError_t captured = cudaStreamEndCapture(stream.get(), &graph);
    if (captured != cudaSuccess) cudaGetLastError();  // reported here, not by the next test
    INFO("attn_launch during capture: " << message << "; end of capture: "
                                        << std::string(cudaGetErrorString(captured)));
    REQUIRE(status == ATTN_OK);
    REQUIRE(captured == cudaSuccess);
    // Captured, not run: O is still the NaN poison.
    CHECK_FALSE(problem.check().passed);
    cudaGraphExec_t instance = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));
    for (int replay = 0; replay < 2; ++replay) CUDA_CHECK(cudaGraphLaunch(instance, stream.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    require_pass(problem.check());
    CUDA_CHECK(cudaGraphExecDestroy(instance));
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
}

TEST_CASE("scale: the scores multiplied by another factor, checked as 1/sqrt(D) on 2Q") {
  const attn::Shape shape{2, 3, 65, head_dims().front()};
  const attn::Stream stream;
  DeviceProblem problem(shape);
  // softmax(s Q K^T) V with s = 2/sqrt(D) is the reference's softmax((2Q) K^T / sqrt(D)) V, and
  // doubling an fp16 value is exact: the reference is computed on 2Q, the step runs on Q.
  for (__half& value : problem.inputs.q) value = __float2half(2.0f * __half2float(value));
  attn_launch_args call = launch_args_for(problem, stream.get());
  call.scale = 2.0 / std::sqrt(double(shape.head_dim));
  char message[1024] = "";
  const int status = attn_launch(step.id, &call, message, sizeof message);
  INFO("attn_launch: " << message);
  REQUIRE(status == ATTN_OK);
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  require_pass(problem.check());
  for (double bad : {-1.0, std::nan("")}) {  // refused, nothing launched
    call.scale = bad;
    CHECK(attn_launch(step.id, &call, message, sizeof message) == ATTN_REFUSED);
    CHECK(contains(message, "scale"));
  }
}

TEST_CASE("cross-attention: run where the step serves it (takes_kv_tokens), refused elsewhere") {
  for (const int64_t kv_tokens : {int64_t(130), int64_t(17)}) {  // more keys than queries, fewer
    const attn::Shape shape{1, 2, 65, head_dims().front(), attn::DType::fp16, kv_tokens};
    CAPTURE(shape.str());
    DeviceProblem problem(shape);
    char message[1024] = "";
    attn_launch_args call = launch_args_for(problem, nullptr);
    const int status = attn_launch(step.id, &call, message, sizeof message);
    INFO("attn_launch: " << message);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (step.takes_kv_tokens) {
      REQUIRE(status == ATTN_OK);
      require_pass(problem.check());
    } else {
      CHECK(status == ATTN_REFUSED);
      CHECK(contains(message, "--kv-tokens " + std::to_string(kv_tokens)));
      CHECK_FALSE(problem.check().passed);  // O untouched: still NaN
    }
  }
}

TEST_CASE("a key-padding mask: honoured where the step takes it, refused elsewhere") {
  attn::Shape shape{2, 2, 65, head_dims().front()};
  shape.key_padding = true;
  DeviceProblem problem(shape);
  attn::DeviceBuffer<uint8_t> mask(problem.inputs.key_padding_mask.size());
  CUDA_CHECK(cudaMemcpy(mask.data(), problem.inputs.key_padding_mask.data(), mask.bytes(),
                        cudaMemcpyHostToDevice));
  char message[1024] = "";
  attn_launch_args call = launch_args_for(problem, nullptr);
  call.key_padding_mask = mask.data();
  const int status = attn_launch(step.id, &call, message, sizeof message);
  INFO("attn_launch: " << message);
  CUDA_CHECK(cudaDeviceSynchronize());
  if (step.takes_key_padding_mask) {
    REQUIRE(status == ATTN_OK);
    require_pass(problem.check());  // against the reference with the same mask
  } else {
    CHECK(status == ATTN_REFUSED);
    CHECK(contains(message, "--key-padding"));
    CHECK_FALSE(problem.check().passed);  // O untouched: still NaN
  }
}

TEST_CASE("misuse is refused with status 2 and a reason, and nothing is launched") {
  const attn::Shape shape{1, 2, 33, head_dims().front()};
  DeviceProblem problem(shape);
  const int64_t b = shape.batch, h = shape.heads, n = shape.tokens, d = shape.head_dim;
  auto* q = problem.q.data();
  auto* k = problem.k.data();
  auto* v = problem.v.data();
  auto* o = problem.o.data();
  std::vector<__half> host(problem.q.size());
  char message[1024];
  struct Case {
    const char* what;
    int status;
    const char* fragment;
  };
  std::vector<Case> cases = {
      {"unknown step", attn_run("v99", q, k, v, o, b, h, n, d, nullptr, message, sizeof message),
       "unknown step"},
  };
  auto run = [&](const char* what, const void* q_, const void* k_, const void* v_, void* o_,
                 int64_t b_, int64_t h_, int64_t n_, int64_t d_, const char* fragment) {
    const int status = attn_run(step.id, q_, k_, v_, o_, b_, h_, n_, d_, nullptr, message,
                                sizeof message);
    cases.push_back({what, status, fragment});
    INFO(what << ": " << message);
    CHECK(status == ATTN_REFUSED);
    CHECK(contains(message, fragment));
  };
  run("head dim 48", q, k, v, o, b, h, n, 48, "--head-dim 48");
  run("tokens 0", q, k, v, o, b, h, 0, d, "tokens 0");
  run("NULL q", nullptr, k, v, o, b, h, n, d, "q is NULL");
  run("misaligned k", q, k + 1, v, o, b, h, n, d, "16-byte aligned");
  run("host memory for v", q, k, host.data(), o, b, h, n, d, "not device memory");
  run("o is q", q, k, v, q, b, h, n, d, "overlaps q");
  run("o overlaps v", q, k, v, v + 8, b, h, n, d, "overlaps v");
  int64_t largest = 0;
  if (attn_max_tokens(step.id, d, &largest, message, sizeof message) == ATTN_OK && largest > 0) {
    const Answer fits = check_shape({b, h, largest, d});
    const Answer too_long = check_shape({b, h, largest + 1, d});
    INFO("largest N " << largest << ": " << fits.message << " / " << too_long.message);
    CHECK(fits.status == ATTN_OK);
    CHECK(too_long.status == ATTN_REFUSED);
    CHECK(contains(too_long.message, "--tokens"));
  }
  CHECK(cases.front().status == ATTN_REFUSED);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<__half> after = problem.output();
  std::size_t untouched = 0;
  for (const __half& value : after) {
    uint16_t bits;
    std::memcpy(&bits, &value, 2);
    untouched += bits == 0xFFFF;
  }
  CHECK(untouched == after.size());  // no refused call wrote O
}

TEST_CASE("the caller's current device is used and left as it was") {
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  int before = -1, after = -2;
  CUDA_CHECK(cudaGetDevice(&before));
  {
    DeviceProblem problem({1, 1, 17, head_dims().front()});
    CHECK(problem.run(nullptr).status == ATTN_OK);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  CUDA_CHECK(cudaGetDevice(&after));
  CHECK(before == after);
  if (devices < 2) return;
  // Memory of the current device while another is made current: refused, naming both.
  const int other = (before + 1) % devices;
  DeviceProblem on_first({1, 1, 17, head_dims().front()});
  CUDA_CHECK(cudaSetDevice(other));
  const Answer answer = on_first.run(nullptr);
  CUDA_CHECK(cudaSetDevice(before));
  INFO(answer.message);
  if (answer.status == ATTN_REFUSED && contains(answer.message, "compute capability")) return;
  CHECK(answer.status == ATTN_REFUSED);
  CHECK(contains(answer.message, "current device is " + std::to_string(other)));
}

// ---------------------------------------------------------------------------------------------
// Backward steps (capi.gpu.v9, capi.gpu.v10, capi.gpu.eager_backward): the test suite "backward",
// the only one main() runs for them (and the one it leaves out for a forward step).

namespace {

// The bits of 16-bit values as the GPU takes them: fp16 as drawn, or bf16 (the values are drawn
// in bf16 and held in fp16 containers, exactly: harness/inputs.hpp).
std::vector<uint16_t> bits_of(const std::vector<__half>& values, attn::DType dtype) {
  std::vector<uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == attn::DType::bf16) {
      const __nv_bfloat16 value = __float2bfloat16(__half2float(values[i]));
      std::memcpy(&bits[i], &value, 2);
    } else {
      std::memcpy(&bits[i], &values[i], 2);
    }
  }
  return bits;
}

// Element strides between batches, heads and tokens of a view, as attn_strides.
struct Layout {
  int64_t batch, head, token;
};

// The rows of a contiguous [B, H, rows, D] tensor written into `to` at `offset` with `layout`.
void scatter(std::vector<uint16_t>& to, int64_t offset, const std::vector<uint16_t>& from,
             int64_t batch, int64_t heads, int64_t rows, int64_t head_dim, Layout layout) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t n = 0; n < rows; ++n)
        std::memcpy(&to[std::size_t(offset + b * layout.batch + h * layout.head + n * layout.token)],
                    &from[std::size_t(((b * heads + h) * rows + n) * head_dim)], std::size_t(head_dim) * 2);
}

attn::DeviceBuffer<uint16_t> upload_bits(const std::vector<uint16_t>& host) {
  attn::DeviceBuffer<uint16_t> device(host.size());
  CUDA_CHECK(cudaMemcpy(device.data(), host.data(), device.bytes(), cudaMemcpyHostToDevice));
  return device;
}

std::vector<uint16_t> download_bits(const attn::DeviceBuffer<uint16_t>& device) {
  std::vector<uint16_t> host(device.size());
  CUDA_CHECK(cudaMemcpy(host.data(), device.data(), device.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

float value_of(uint16_t bits, attn::DType dtype) {
  if (dtype == attn::DType::bf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// dQ, dK and dV of one backward call, poisoned with NaN (0xFFFF) before it.
struct Gradients {
  attn::DeviceBuffer<uint16_t> dq, dk, dv;
  explicit Gradients(const attn::Shape& shape)
      : dq(std::size_t(shape.elements())), dk(std::size_t(shape.kv_elements())),
        dv(std::size_t(shape.kv_elements())) {
    for (auto* buffer : {&dq, &dk, &dv}) CUDA_CHECK(cudaMemset(buffer->data(), 0xFF, buffer->bytes()));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // as in DeviceProblem
  }
};

// Where the tensors of one backward call lie.
struct BackwardTensors {
  const void *q, *k, *v, *o, *d_o;
  attn_strides qkv_strides, o_strides, d_o_strides;  // all zero: contiguous
};

Answer run_backward(const attn::Shape& shape, const BackwardTensors& tensors, const float* log_sum_exp,
                    Gradients& gradients, bool deterministic, cudaStream_t stream) {
  attn_backward_args call{};
  call.q = tensors.q;
  call.k = tensors.k;
  call.v = tensors.v;
  call.o = tensors.o;
  call.d_o = tensors.d_o;
  call.log_sum_exp = log_sum_exp;
  call.dq = gradients.dq.data();
  call.dk = gradients.dk.data();
  call.dv = gradients.dv.data();
  call.batch = shape.batch;
  call.heads = shape.heads;
  call.tokens = shape.tokens;
  call.kv_tokens = shape.cross() ? shape.keys() : 0;
  call.head_dim = shape.head_dim;
  call.qkv_strides = tensors.qkv_strides;
  call.o_strides = tensors.o_strides;
  call.d_o_strides = tensors.d_o_strides;
  call.stream = stream;
  call.deterministic = deterministic ? 1 : 0;
  call.dtype = shape.dtype == attn::DType::bf16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_FP16;
  Answer answer;
  char message[1024] = "";
  answer.status = attn_launch_backward(step.id, &call, message, sizeof message);
  answer.message = message;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return answer;
}

// How a layout of the inputs is made: Q, K and V from one packed projection [B, N, 3, H, D] (a
// ViT block's), O and dO [B, N, H, D] (as the forward writes O for the out-projection, and as
// autograd hands dO back through it); or sequence-first, DETR's: Q, O and dO [N, B, H, D], K and V
// [N_k, B, H, D], one set of strides for all three inputs.
enum class Views { packed, sequence_first };

// The backward of `shape` through attn_launch_backward on contiguous tensors and on `views` of
// the same values, both after the forward the library chooses wrote O and L. A step that takes
// views gives the same bits (deterministic mode) or the same values within fp16's rounding of
// dQ's sum (without it); a step that does not refuses the views, naming itself, and writes nothing.
void check_backward_on_views(const attn::Shape& shape, Views views, const attn::Stream& stream) {
  const int64_t B = shape.batch, H = shape.heads, N = shape.tokens, K = shape.keys(), D = shape.head_dim;
  const int dtype = shape.dtype == attn::DType::bf16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_FP16;
  attn_call forward_call{};
  forward_call.batch = B;
  forward_call.heads = H;
  forward_call.tokens = N;
  forward_call.kv_tokens = shape.cross() ? K : 0;
  forward_call.head_dim = D;
  forward_call.dtype = dtype;
  char forward[32] = "", message[1024] = "";
  if (attn_choose_step(&forward_call, forward, sizeof forward, message, sizeof message) != ATTN_OK) {
    MESSAGE("skipped " << shape.str() << ": no forward step writes O and L for it here (" << message << ")");
    return;
  }
  const attn::HostTensors inputs = attn::make_inputs(shape, 41);
  const std::vector<uint16_t> q = bits_of(inputs.q, shape.dtype), k = bits_of(inputs.k, shape.dtype),
                              v = bits_of(inputs.v, shape.dtype),
                              d_o = bits_of(attn::make_output_gradient(shape, 41), shape.dtype);
  const attn::DeviceBuffer<uint16_t> q_c = upload_bits(q), k_c = upload_bits(k), v_c = upload_bits(v),
                                     d_o_c = upload_bits(d_o);
  attn::DeviceBuffer<uint16_t> o_c(q.size());
  attn::DeviceBuffer<float> log_sum_exp(std::size_t(shape.slices() * N));
  attn_launch_args call{};
  call.q = q_c.data();
  call.k = k_c.data();
  call.v = v_c.data();
  call.o = o_c.data();
  call.log_sum_exp = log_sum_exp.data();
  call.batch = B;
  call.heads = H;
  call.tokens = N;
  call.kv_tokens = forward_call.kv_tokens;
  call.head_dim = D;
  call.dtype = dtype;
  call.stream = stream.get();
  int status = attn_launch(forward, &call, message, sizeof message);
  INFO("the forward, " << forward << ": " << message);
  REQUIRE(status == ATTN_OK);
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  const std::vector<uint16_t> o = download_bits(o_c);

  // The same values where views put them.
  Layout qkv_layout{}, o_layout{};
  int64_t q_at = 0, k_at = 0, v_at = 0;
  std::vector<uint16_t> qkv_host, o_host, d_o_host;
  if (views == Views::packed) {
    REQUIRE(!shape.cross());  // one projection: N_k = N
    qkv_layout = {N * 3 * H * D, D, 3 * H * D};
    o_layout = {N * H * D, D, H * D};
    qkv_host.assign(std::size_t(3 * shape.elements()), 0);
    k_at = H * D;
    v_at = 2 * H * D;
  } else {
    qkv_layout = {H * D, D, B * H * D};
    o_layout = {H * D, D, B * H * D};
    // Q, then K and V, each its own [rows, B, H, D] block of one allocation.
    qkv_host.assign(std::size_t(shape.elements() + 2 * shape.kv_elements()), 0);
    k_at = shape.elements();
    v_at = k_at + shape.kv_elements();
  }
  scatter(qkv_host, q_at, q, B, H, N, D, qkv_layout);
  scatter(qkv_host, k_at, k, B, H, K, D, qkv_layout);
  scatter(qkv_host, v_at, v, B, H, K, D, qkv_layout);
  o_host.assign(o.size(), 0);
  d_o_host.assign(d_o.size(), 0);
  scatter(o_host, 0, o, B, H, N, D, o_layout);
  scatter(d_o_host, 0, d_o, B, H, N, D, o_layout);
  const attn::DeviceBuffer<uint16_t> qkv_v = upload_bits(qkv_host), o_v = upload_bits(o_host),
                                     d_o_v = upload_bits(d_o_host);
  const attn_strides qkv_strides{qkv_layout.batch, qkv_layout.head, qkv_layout.token},
      o_strides{o_layout.batch, o_layout.head, o_layout.token};
  const BackwardTensors contiguous{q_c.data(), k_c.data(), v_c.data(), o_c.data(), d_o_c.data(), {}, {}, {}};
  const BackwardTensors strided{qkv_v.data() + q_at, qkv_v.data() + k_at, qkv_v.data() + v_at,
                                o_v.data(), d_o_v.data(), qkv_strides, o_strides, o_strides};

  for (const bool deterministic : {true, false}) {
    CAPTURE(deterministic);
    Gradients want(shape), got(shape);
    const Answer plain = run_backward(shape, contiguous, log_sum_exp.data(), want, deterministic, stream.get());
    INFO("the backward on contiguous tensors: " << plain.message);
    REQUIRE(plain.status == ATTN_OK);
    const Answer viewed = run_backward(shape, strided, log_sum_exp.data(), got, deterministic, stream.get());
    INFO("the backward on views: " << viewed.message);
    const char* names[] = {"dq", "dk", "dv"};
    const attn::DeviceBuffer<uint16_t>* wanted[] = {&want.dq, &want.dk, &want.dv};
    const attn::DeviceBuffer<uint16_t>* gotten[] = {&got.dq, &got.dk, &got.dv};
    if (!step.takes_strides) {
      CHECK(viewed.status == ATTN_REFUSED);
      CHECK(contains(viewed.message, step.id));
      CHECK(contains(viewed.message, "reads contiguous"));
      for (const auto* buffer : gotten) {  // refused: nothing ran
        const std::vector<uint16_t> bits = download_bits(*buffer);
        CHECK(std::count(bits.begin(), bits.end(), uint16_t(0xFFFF)) == std::ptrdiff_t(bits.size()));
      }
      return;
    }
    REQUIRE(viewed.status == ATTN_OK);
    for (int which = 0; which < 3; ++which) {
      CAPTURE(names[which]);
      const std::vector<uint16_t> a = download_bits(*wanted[which]), b = download_bits(*gotten[which]);
      // Every element written, by the contiguous call too (no NaN poison left).
      CHECK(std::count(a.begin(), a.end(), uint16_t(0xFFFF)) == 0);
      std::size_t differ = 0, first = a.size();
      float largest = 0.0f, worst = 0.0f;
      for (std::size_t i = 0; i < a.size(); ++i) {
        largest = std::max(largest, std::fabs(value_of(a[i], shape.dtype)));
        if (a[i] == b[i]) continue;
        ++differ;
        if (first == a.size()) first = i;
        worst = std::max(worst, std::fabs(value_of(a[i], shape.dtype) - value_of(b[i], shape.dtype)));
      }
      INFO(differ << " of " << a.size() << " elements differ (the first at " << first
                  << "), by at most " << worst << " (largest value " << largest << ")");
      if (deterministic) {
        CHECK(differ == 0);  // the same bits: the views change where values lie, not the sums
      } else {
        const float u = shape.dtype == attn::DType::bf16 ? 0x1p-8f : 0x1p-11f;
        CHECK(worst <= 8.0f * u * largest);  // dQ's sum in another order, nothing more
      }
    }
  }
}

}  // namespace

TEST_SUITE("backward") {
  TEST_CASE("a backward on views: Q, K, V from one packed [B, N, 3, H, D], O and dO [B, N, H, D]: "
            "the bits of the contiguous call, or a refusal by a step that reads contiguous tensors") {
    const attn::Stream stream;
    std::vector<attn::DType> dtypes = {attn::DType::fp16};
    if (step.takes_bf16) dtypes.push_back(attn::DType::bf16);
    for (const attn::DType dtype : dtypes) {
      for (int head_dim : head_dims()) {
        for (int64_t tokens : {int64_t(65), int64_t(197)}) {
          const attn::Shape shape{2, 3, tokens, head_dim, dtype};
          CAPTURE(shape.str());
          if (check_shape(shape).status != ATTN_OK) continue;
          check_backward_on_views(shape, Views::packed, stream);
        }
      }
    }
  }

  TEST_CASE("a backward on sequence-first views (DETR's cross-attention): Q, O, dO [N, B, H, D], "
            "K and V [N_k, B, H, D]") {
    if (!step.takes_kv_tokens) return;  // capi_no_gpu checks the refusal of kv_tokens
    const attn::Stream stream;
    for (int head_dim : head_dims()) {
      for (const auto& [tokens, kv_tokens] : {std::pair<int64_t, int64_t>{100, 1050}, {65, 17}}) {
        const attn::Shape shape{2, 3, tokens, head_dim, attn::DType::fp16, kv_tokens};
        CAPTURE(shape.str());
        if (check_shape(shape).status != ATTN_OK) continue;
        check_backward_on_views(shape, Views::sequence_first, stream);
      }
    }
  }
}

int main(int argc, char** argv) {
  std::string id;
  std::vector<char*> doctest_args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--step=", 7) == 0) {
      id = argv[i] + 7;
    } else {
      doctest_args.push_back(argv[i]);
    }
  }
  bool found = false;
  for (int i = 0; i < attn_step_count() && !found; ++i) {
    found = attn_step_get(i, &step) == ATTN_OK && id == step.id;
  }
  if (!found) {
    std::cerr << "capi_gpu_tests: --step=ID names no step of libattention_steps ('" << id << "')\n";
    return 2;
  }
  char message[1024] = "";
  int capability = 0;
  const int status = attn_device(nullptr, nullptr, 0, &capability, nullptr, message, sizeof message);
  if (status != ATTN_OK) {
    if (contains(message, "no CUDA device")) {
      std::cout << "SKIPPED: " << message << "; the C ABI GPU suite for " << id << " did not run\n";
      return kSkipped;
    }
    std::cerr << "capi_gpu_tests: " << message << "\n";
    return 3;
  }
  const bool runs_here = capability >= step.min_compute_capability &&
                         (step.max_compute_capability == 0 || capability <= step.max_compute_capability);
  if (!runs_here) {
    // Checked, not assumed: the library must refuse the step on this GPU, naming why.
    const int refused = attn_check(step.id, 1, 1, 64, step.head_dims[0], message, sizeof message);
    if (refused != ATTN_REFUSED || !contains(message, "compute capability")) {
      std::cerr << "capi_gpu_tests: " << id << " cannot run on compute capability " << capability
                << " but attn_check answered " << refused << " '" << message << "'\n";
      return 1;
    }
    std::cout << "SKIPPED: " << message << " (the C ABI refused it, as it should); the C ABI GPU "
              << "suite for " << id << " did not run\n";
    return kSkipped;
  }
  doctest::Context context(int(doctest_args.size()), doctest_args.data());
  // A backward step runs the suite "backward" alone (attn_launch_backward), a forward one the rest.
  context.addFilter(step.is_backward ? "test-suite" : "test-suite-exclude", "backward");
  return context.run();
}
