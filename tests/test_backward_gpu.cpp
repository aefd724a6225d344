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

// qk_scale multiplies Q and K (inputs.hpp); 0: the key-mask probe's inputs, every score far
// below 0, so every row's L is too.
constexpr double kMaskProbe = 0.0;
attn::BackwardRunResult run_backward(const Shape& shape, CheckMode mode, double qk_scale = 1.0,
                                     bool deterministic = false, uint64_t seed = 19) {
  const attn::StepInfo& step = step_under_test();
  const attn::HostTensors inputs = qk_scale == kMaskProbe
                                       ? attn::make_key_mask_probe_inputs(shape, seed)
                                       : attn::make_inputs(shape, seed, qk_scale);
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
  INFO("largest error " << result.worst_bound_ratio << " of its element's bound (allowed "
       << attn::kGradientBoundFactor << ") on " << result.checked_slices << " of "
       << result.total_slices << " slices against fp64, " << result.all_worst_bound_ratio
       << " on all " << result.all_checked_slices << " against the GPU reference; largest relative"
       << " error of dQ, dK, dV " << result.relative_error << "; " << result.nonfinite
       << " non-finite; " << result.worst);
  CHECK(result.passed);
  CHECK(result.nonfinite == 0);
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

  TEST_CASE("tile multiples: N = k x tile and k x tile +- 1 for every tile of every head dim") {
    // The step's own tiles (StepInfo::tile_sizes): the Q tiles it walks and the keys a block
    // owns, exactly and one short of or past them.
    for (int head_dim : step_under_test().head_dims) {
      for (int64_t tokens : sizes_around(all_tiles(step_under_test().tiles(head_dim)))) {
        const Shape shape{1, 2, tokens, head_dim};
        CAPTURE(shape.str());
        REQUIRE(serves(shape));
        require_pass(check_backward(shape, CheckMode::full));
      }
    }
  }

  TEST_CASE("large scores over a few keys and at tile edges: finite, right gradients, both modes") {
    // Scores at a standard deviation of 16, and the key-mask probe's (every score far below 0),
    // at N = 1, 2, 3, 5, 17 and one short of and past each tile: a row's L is far below 0, so a
    // key past N (a zero K row, score 0) has P = exp(-L), which overflows unless the kernel
    // gives it no weight. fp16 and bf16 where taken, the deterministic mode too.
    const attn::StepInfo& step = step_under_test();
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        for (int64_t tokens : few_keys_and_tile_edges(step.tiles(head_dim))) {
          for (double qk_scale : {attn::kLargeScoreScale, kMaskProbe}) {
            for (bool deterministic : {false, true}) {
              const Shape shape{2, 3, tokens, head_dim, dtype};
              CAPTURE(shape.str());
              CAPTURE(qk_scale);
              CAPTURE(deterministic);
              REQUIRE(serves(shape));
              require_pass(run_backward(shape, CheckMode::full, qk_scale, deterministic).check);
            }
          }
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

  TEST_CASE("causal mask, where the step takes it: tails, large scores, bf16, the deterministic mode") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_causal) {
      Shape causal{1, 1, 64, 64};
      causal.causal = attn::Causal::top_left;
      const auto reason = step.refuses(causal);
      REQUIRE(reason.has_value());  // the refusal is the test
      CHECK(reason->find("--causal") != std::string::npos);
      return;
    }
    // With N_q = N_k both alignments are the same mask: each is run at a few sizes.
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        std::vector<int64_t> sizes = {1, 2, 17, 197};
        for (int64_t tokens : sizes_around(all_tiles(step.tiles(head_dim)))) sizes.push_back(tokens);
        for (int64_t tokens : sizes) {
          for (attn::Causal align : {attn::Causal::top_left, attn::Causal::bottom_right}) {
            Shape shape{2, 3, tokens, head_dim, dtype};
            shape.causal = align;
            CAPTURE(shape.str());
            REQUIRE(serves(shape));
            require_pass(check_backward(shape, CheckMode::full));
          }
        }
        Shape shape{2, 3, 130, head_dim, dtype};
        shape.causal = attn::Causal::top_left;
        CAPTURE(shape.str());
        for (double qk_scale : {attn::kLargeScoreScale, kMaskProbe}) {
          CAPTURE(qk_scale);
          require_pass(run_backward(shape, CheckMode::full, qk_scale).check);
        }
        const attn::BackwardRunResult first = run_backward(shape, CheckMode::full, 1.0, true);
        require_pass(first.check);
        const attn::BackwardRunResult second = run_backward(shape, CheckMode::full, 1.0, true);
        CHECK(same_bits(first.dq, second.dq));
        CHECK(same_bits(first.dk, second.dk));
        CHECK(same_bits(first.dv, second.dv));
        Shape vit{8, 12, 577, head_dim, dtype};
        vit.causal = attn::Causal::top_left;
        CAPTURE(vit.str());
        require_pass(check_backward(vit, CheckMode::sample));
      }
    }
  }

  TEST_CASE("refuses a head dim it does not serve, naming the flag") {
    const auto reason = step_under_test().refuses(Shape{1, 1, 64, 48});
    REQUIRE(reason.has_value());
    CHECK(reason->find("--head-dim 48") != std::string::npos);
  }
}
