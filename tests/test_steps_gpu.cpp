// The GPU suite, run for one step at a time (gpu_tests --step=v3): the shape matrix of
// DESIGN.md with tails, the stress case, run-to-run equality, and refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "gpu_support.hpp"
#include "runner.hpp"

namespace {

using attn::CheckMode;
using attn::Shape;

const int64_t kTokens[] = {1, 2, 17, 64, 65, 127, 128, 197, 577, 1025};
const int64_t kHeadlineTokens[] = {197, 577, 1025};
const int64_t kLongTokens[] = {2049, 4097, 16385};  // for steps with no N limit

bool serves(const attn::StepInfo& step, const Shape& shape) {
  return !step.refuses(shape, device_under_test());
}

attn::CheckResult check_step(const attn::StepInfo& step, const Shape& shape, CheckMode mode,
                             double qk_scale = 1.0, uint64_t seed = 17) {
  const attn::HostTensors inputs = attn::make_inputs(shape, seed, qk_scale);
  const attn::Reference reference =
      attn::compute_reference(inputs, attn::slices_to_check(shape, mode, seed));
  attn::RunConfig config;
  config.time = false;
  return attn::run_step(step, inputs, &reference, config).check;
}

void require_pass(const attn::CheckResult& result) {
  INFO("relative error " << result.relative_error << " (tolerance " << result.relative_tolerance
                         << "), max abs error " << result.max_abs_error << " (tolerance "
                         << result.abs_tolerance << "), " << result.nonfinite
                         << " non-finite; " << result.worst);
  CHECK(result.passed);
}

}  // namespace

TEST_CASE("shape matrix: every N of DESIGN.md, tails included, every head dim served") {
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : kTokens) {
      for (auto [batch, heads] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}}) {
        const Shape shape{batch, heads, tokens, head_dim};
        if (!serves(step, shape)) continue;
        CAPTURE(shape.str());
        require_pass(check_step(step, shape, CheckMode::full));
      }
    }
  }
}

TEST_CASE("headline ViT shapes at B = 32, H = 12 (sampled slices)") {
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : kHeadlineTokens) {
      const Shape shape{32, 12, tokens, head_dim};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape, CheckMode::sample));
    }
  }
}

TEST_CASE("long sequences, every head dim, for steps without an N limit") {
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    if (step.max_tokens(head_dim, device_under_test().shared_bytes_per_block)) continue;
    for (int64_t tokens : kLongTokens) {
      const Shape shape{1, 2, tokens, head_dim};
      CAPTURE(shape.str());
      require_pass(check_step(step, shape, CheckMode::full));
    }
  }
}

TEST_CASE("stress: scores in the hundreds, the softmax must stay stable") {
  const attn::StepInfo& step = step_under_test();
  for (int64_t tokens : {int64_t(77), int64_t(577)}) {
    const Shape shape{2, 2, tokens, 64};
    if (!serves(step, shape)) continue;
    CAPTURE(shape.str());
    require_pass(check_step(step, shape, CheckMode::full, attn::kStressScale));
  }
}

TEST_CASE("run-to-run equality: the same inputs give the same bits") {
  const attn::StepInfo& step = step_under_test();
  const Shape shape{2, 3, 197, 64};
  REQUIRE(serves(step, shape));
  const attn::HostTensors inputs = attn::make_inputs(shape, 5);
  attn::RunConfig config;
  config.time = false;
  const std::vector<__half> first = attn::run_step(step, inputs, nullptr, config).output;
  const std::vector<__half> second = attn::run_step(step, inputs, nullptr, config).output;
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(__half)) == 0);
}

TEST_CASE("refuses what it does not serve, with a reason naming the flag") {
  const attn::StepInfo& step = step_under_test();
  const attn::DeviceLimits& device = device_under_test();
  const auto reason = step.refuses({1, 1, 64, 48}, device);  // no step serves head dim 48
  REQUIRE(reason.has_value());
  CHECK(reason->find("--head-dim 48") != std::string::npos);
  if (const auto largest = step.max_tokens(64, device.shared_bytes_per_block)) {
    REQUIRE(*largest > 0);
    CHECK(serves(step, {1, 1, *largest, 64}));
    const auto too_long = step.refuses({1, 1, *largest + 1, 64}, device);
    REQUIRE(too_long.has_value());
    CHECK(too_long->find("--tokens") != std::string::npos);
    CHECK(too_long->find(std::to_string(device.shared_bytes_per_block)) != std::string::npos);
  }
  if (device.shared_bytes_per_block >= 166912) {  // an A100's budget or more
    CHECK(serves(step, {1, 1, 1025, 64}));         // every step serves the ViT shapes
  }
}
