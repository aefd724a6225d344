// The GPU suite of a backward step (gpu_tests --step=v9): its forward step writes O and L, then
// dQ, dK and dV are checked against the fp64 backward reference on every slice of the small
// shapes and on sampled slices of the large ones, dQ, dK, dV poisoned with NaN first so that an
// unwritten element fails. The shape matrix (tails, N = 1, several B and H, every head dim), the
// ViT shapes, a long sequence, the stress case, the deterministic mode (checked, and the same
// bits run to run), and refusals.
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

attn::BackwardRunResult run_backward(const Shape& shape, CheckMode mode, double qk_scale = 1.0,
                                     bool deterministic = false, uint64_t seed = 19) {
  const attn::StepInfo& step = step_under_test();
  const attn::HostTensors inputs = attn::make_inputs(shape, seed, qk_scale);
  const std::vector<__half> d_o = attn::make_output_gradient(shape, seed);
  const attn::BackwardReference reference =
      attn::compute_backward_reference(inputs, d_o, attn::slices_to_check(shape, mode, seed));
  attn::RunConfig config;
  config.time = false;
  config.deterministic = deterministic;
  return attn::run_backward_step(step, inputs, d_o, &reference, config);
}

attn::CheckResult check_backward(const Shape& shape, CheckMode mode, double qk_scale = 1.0) {
  return run_backward(shape, mode, qk_scale).check;
}

bool same_bits(const std::vector<__half>& a, const std::vector<__half>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(__half)) == 0;
}

void require_pass(const attn::CheckResult& result) {
  INFO("largest relative error of dQ, dK, dV " << result.relative_error << " (tolerance "
       << result.relative_tolerance << "), max abs error " << result.max_abs_error
       << " (tolerance " << result.abs_tolerance << ") on " << result.checked_slices << " of "
       << result.total_slices << " slices; " << result.nonfinite << " non-finite; " << result.worst);
  CHECK(result.passed);
}

bool serves(const Shape& shape) { return !step_under_test().refuses(shape, device_under_test()); }

}  // namespace

TEST_SUITE("backward") {
  TEST_CASE("shape matrix: tails, N = 1, several B and H, every head dim, every slice checked") {
    for (int head_dim : step_under_test().head_dims) {
      for (int64_t tokens : {1, 2, 17, 63, 64, 65, 127, 128, 130, 197}) {
        for (const auto& [batch, heads] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}}) {
          const Shape shape{batch, heads, tokens, head_dim};
          CAPTURE(shape.str());
          REQUIRE(serves(shape));
          require_pass(check_backward(shape, CheckMode::full));
        }
      }
    }
  }

  TEST_CASE("ViT shapes at B = 32, H = 12 (sampled slices) and a long sequence") {
    for (int head_dim : step_under_test().head_dims) {
      for (const Shape shape : {Shape{32, 12, 577, head_dim}, Shape{2, 2, 2049, head_dim}}) {
        CAPTURE(shape.str());
        require_pass(check_backward(shape, CheckMode::sample));
      }
    }
  }

  TEST_CASE("stress: scores in the hundreds, P rebuilt from L must stay finite and right") {
    for (int head_dim : step_under_test().head_dims) {
      const Shape shape{1, 2, 197, head_dim};
      CAPTURE(shape.str());
      require_pass(check_backward(shape, CheckMode::full, attn::kStressScale));
    }
  }

  TEST_CASE("deterministic mode: checked at tails and a ViT shape, and the same bits run to run") {
    for (int head_dim : step_under_test().head_dims) {
      for (const Shape shape : {Shape{2, 3, 1, head_dim}, Shape{2, 3, 130, head_dim},
                                Shape{32, 12, 197, head_dim}}) {
        CAPTURE(shape.str());
        const CheckMode mode = shape.batch > 2 ? CheckMode::sample : CheckMode::full;
        const attn::BackwardRunResult first = run_backward(shape, mode, 1.0, true);
        require_pass(first.check);
        const attn::BackwardRunResult second = run_backward(shape, mode, 1.0, true);
        CHECK(same_bits(first.dq, second.dq));
        CHECK(same_bits(first.dk, second.dk));
        CHECK(same_bits(first.dv, second.dv));
      }
    }
  }

  TEST_CASE("bf16, where the step takes it: tails, a ViT shape, the stress case; else a refusal") {
    const attn::StepInfo& step = step_under_test();
    if (std::find(step.dtypes.begin(), step.dtypes.end(), attn::DType::bf16) == step.dtypes.end()) {
      const auto reason = step.refuses(Shape{1, 1, 64, 64, attn::DType::bf16});
      REQUIRE(reason.has_value());
      CHECK(reason->find("--dtype bf16") != std::string::npos);
      return;
    }
    for (int head_dim : step.head_dims) {
      for (int64_t tokens : {1, 17, 64, 65, 130, 197}) {
        const Shape shape{2, 3, tokens, head_dim, attn::DType::bf16};
        CAPTURE(shape.str());
        REQUIRE(serves(shape));
        require_pass(check_backward(shape, CheckMode::full));
      }
      const Shape vit{32, 12, 577, head_dim, attn::DType::bf16};
      CAPTURE(vit.str());
      require_pass(check_backward(vit, CheckMode::sample));
      const Shape stress{1, 2, 197, head_dim, attn::DType::bf16};
      CAPTURE(stress.str());
      require_pass(check_backward(stress, CheckMode::full, attn::kStressScale));
      const attn::BackwardRunResult deterministic = run_backward(Shape{2, 3, 130, head_dim, attn::DType::bf16},
                                                                 CheckMode::full, 1.0, true);
      require_pass(deterministic.check);
    }
  }

  TEST_CASE("refuses a head dim it does not serve, naming the flag") {
    const auto reason = step_under_test().refuses(Shape{1, 1, 64, 48});
    REQUIRE(reason.has_value());
    CHECK(reason->find("--head-dim 48") != std::string::npos);
  }
}
