// The GPU suite of a backward step (gpu_tests --step=v9): its forward step writes O and L, then
// dQ, dK and dV are checked against the fp64 backward reference on every slice of the small
// shapes and on sampled slices of the large ones, and against the GPU reference on every slice
// of all, dQ, dK, dV poisoned with NaN first so that an unwritten element fails. The shape matrix
// (tails, N = 1, several B and H, every head dim), the ViT shapes, a long sequence, the stress
// case, the deterministic mode (checked, and the same bits run to run), the causal mask,
// cross-attention (N_k != N), the key-padding mask and packed sequences of different lengths where
// the step takes them (the gradients the masks make 0 checked to be exactly 0), and refusals.
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

// The step under test on `inputs` (their key-padding mask too) and a dO drawn from `seed`: the
// fp64 reference checks the slices `mode` picks, the GPU reference every slice.
attn::BackwardRunResult run_backward_on(const attn::HostTensors& inputs, CheckMode mode,
                                        bool deterministic = false, uint64_t seed = 19) {
  const Shape& shape = inputs.shape;
  const std::vector<__half> d_o = attn::make_output_gradient(shape, seed);
  const attn::BackwardReference reference =
      attn::compute_backward_reference(inputs, d_o, attn::slices_to_check(shape, mode, seed));
  attn::RunConfig config;
  config.time = false;
  config.deterministic = deterministic;
  return attn::run_backward_step(step_under_test(), inputs, d_o, &reference, config);
}

// qk_scale multiplies Q and K (inputs.hpp); 0: the key-mask probe's inputs, every score far
// below 0, so every row's L is too.
constexpr double kMaskProbe = 0.0;
attn::HostTensors test_inputs(const Shape& shape, double qk_scale = 1.0, uint64_t seed = 19) {
  return qk_scale == kMaskProbe ? attn::make_key_mask_probe_inputs(shape, seed)
                                : attn::make_inputs(shape, seed, qk_scale);
}
attn::BackwardRunResult run_backward(const Shape& shape, CheckMode mode, double qk_scale = 1.0,
                                     bool deterministic = false, uint64_t seed = 19) {
  return run_backward_on(test_inputs(shape, qk_scale, seed), mode, deterministic, seed);
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

// The deterministic mode on `shape`: checked, and the same bits from a second run.
void check_deterministic(const Shape& shape, CheckMode mode) {
  const attn::BackwardRunResult first = run_backward(shape, mode, 1.0, true);
  require_pass(first.check);
  const attn::BackwardRunResult second = run_backward(shape, mode, 1.0, true);
  CHECK(same_bits(first.dq, second.dq));
  CHECK(same_bits(first.dk, second.dk));
  CHECK(same_bits(first.dv, second.dv));
}

bool serves(const Shape& shape) { return !step_under_test().refuses(shape, device_under_test()); }

// Whether the step takes everything `shape` asks for (its dtype, N_k != N, the key-padding
// mask, a causal mask). A case that mixes features runs a shape only where this holds, and then
// the step must serve it.
bool takes(const Shape& shape) {
  const attn::StepInfo& step = step_under_test();
  return std::find(step.dtypes.begin(), step.dtypes.end(), shape.dtype) != step.dtypes.end() &&
         (!shape.cross() || step.takes_kv_tokens) &&
         (!shape.key_padding || step.takes_key_padding_mask) &&
         (shape.causal == attn::Causal::none || step.takes_causal);
}

// `shape` with the key-padding mask (inputs.cpp's pattern).
Shape with_key_padding(Shape shape) {
  shape.key_padding = true;
  return shape;
}

// A case for a feature the step does not take: its refusal of `shape` names `flag` (the check),
// and the case says that it ran no gradients, so that nothing unrun reads as a pass.
void expect_refusal(const Shape& shape, const std::string& flag) {
  const auto reason = step_under_test().refuses(shape);
  REQUIRE(reason.has_value());
  CHECK(reason->find(flag) != std::string::npos);
  MESSAGE("skipped: " << *reason << "; no gradient of this case was run, the refusal was checked");
}

// The gradients the masks make exactly 0 (backward_reference.hpp): dQ of a query row that sees
// no key, dK and dV of a key that no row sees (padding, or past every row's causal diagonal).
// `elements` counts them, `nonzero` those of the step that are not 0 (a NaN among them).
struct MaskedGradients {
  int64_t elements = 0, nonzero = 0;
};
MaskedGradients masked_gradients(const attn::HostTensors& inputs,
                                 const attn::BackwardRunResult& run) {
  const Shape& shape = inputs.shape;
  const int64_t tokens = shape.tokens, keys = shape.keys(), head_dim = shape.head_dim;
  MaskedGradients masked;
  auto expect_zero_row = [&](const std::vector<__half>& gradient, int64_t row_index) {
    masked.elements += head_dim;
    for (int64_t c = 0; c < head_dim; ++c) {
      if (!(__half2float(gradient[std::size_t(row_index * head_dim + c)]) == 0.0f)) ++masked.nonzero;
    }
  };
  for (int64_t b = 0; b < shape.batch; ++b) {
    // Which rows see some key and which keys some row sees: the same for every head of b.
    std::vector<bool> row_sees_a_key(std::size_t(tokens), false), key_is_seen(std::size_t(keys), false);
    for (int64_t i = 0; i < tokens; ++i) {
      for (int64_t j = 0; j < keys; ++j) {
        const bool padded = shape.key_padding && inputs.key_padding_mask[std::size_t(b * keys + j)] != 0;
        if (!padded && shape.sees(i, j)) row_sees_a_key[std::size_t(i)] = key_is_seen[std::size_t(j)] = true;
      }
    }
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t slice = b * shape.heads + h;
      for (int64_t i = 0; i < tokens; ++i) {
        if (!row_sees_a_key[std::size_t(i)]) expect_zero_row(run.dq, slice * tokens + i);
      }
      for (int64_t j = 0; j < keys; ++j) {
        if (key_is_seen[std::size_t(j)]) continue;
        expect_zero_row(run.dk, slice * keys + j);
        expect_zero_row(run.dv, slice * keys + j);
      }
    }
  }
  return masked;
}

// A run on `inputs` that passes, its masked gradients exactly 0; returns how many there were.
int64_t require_pass_and_masked_zero(const attn::HostTensors& inputs,
                                     const attn::BackwardRunResult& run) {
  require_pass(run.check);
  const MaskedGradients masked = masked_gradients(inputs, run);
  INFO(masked.nonzero << " of the " << masked.elements
                      << " gradient elements the masks make 0 are not 0");
  CHECK(masked.nonzero == 0);
  return masked.elements;
}

// The step on `shape`'s inputs (test_inputs), every slice checked; it must pass with the masked
// gradients exactly 0. Returns how many masked gradient elements there were.
int64_t check_masked(const Shape& shape, double qk_scale = 1.0) {
  CAPTURE(shape.str());
  CAPTURE(qk_scale);
  REQUIRE(serves(shape));
  const attn::HostTensors inputs = test_inputs(shape, qk_scale);
  return require_pass_and_masked_zero(inputs, run_backward_on(inputs, CheckMode::full));
}

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
      for (const Shape& shape : {Shape{32, 12, 577, head_dim}, Shape{2, 2, 2049, head_dim}}) {
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
      for (const Shape& shape : {Shape{2, 3, 1, head_dim}, Shape{2, 3, 130, head_dim},
                                Shape{32, 12, 197, head_dim}}) {
        CAPTURE(shape.str());
        const CheckMode mode = shape.batch > 2 ? CheckMode::sample : CheckMode::full;
        check_deterministic(shape, mode);
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
        check_deterministic(shape, CheckMode::full);
        Shape vit{8, 12, 577, head_dim, dtype};
        vit.causal = attn::Causal::top_left;
        CAPTURE(vit.str());
        require_pass(check_backward(vit, CheckMode::sample));
      }
    }
  }

  TEST_CASE("cross-attention, where the step takes it: N_q and N_k apart, the tails of each, fp16 and bf16") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_kv_tokens) {
      expect_refusal(Shape{1, 1, 64, 64, attn::DType::fp16, 65}, "--kv-tokens 65");
      return;
    }
    // N_k below and above N: tails of N_q with a whole K/V tile and of N_k with a whole Q tile,
    // both at once, and DETR's decoder (100 object queries over 1050 image positions).
    const std::pair<int64_t, int64_t> sizes[] = {{1, 65},   {65, 1},   {64, 130}, {130, 64},
                                                 {17, 197}, {197, 17}, {100, 1050}};
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        for (const auto& [tokens, kv_tokens] : sizes) {
          check_masked(Shape{2, 3, tokens, head_dim, dtype, kv_tokens});
        }
        // The step's own tiles: N at each Q tile's tails over 77 keys, N_k at each key tile's
        // tails under 77 queries, those also with large scores and the key-mask probe (a key
        // past N_k given weight makes P = exp(-L) overflow, or shows in dQ).
        const attn::TileSizes tiles = step.tiles(head_dim);
        for (int64_t tokens : sizes_around(tiles.rows)) {
          check_masked(Shape{1, 2, tokens, head_dim, dtype, 77});
        }
        for (int64_t kv_tokens : sizes_around(tiles.keys)) {
          for (double qk_scale : {1.0, attn::kLargeScoreScale, kMaskProbe}) {
            check_masked(Shape{1, 2, 77, head_dim, dtype, kv_tokens}, qk_scale);
          }
        }
      }
    }
  }

  TEST_CASE("key-padding mask, where the step takes it: padded keys get dK = dV = 0, alone and with causal") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_key_padding_mask) {
      expect_refusal(with_key_padding(Shape{1, 1, 64, 64}), "--key-padding");
      return;
    }
    // inputs.cpp's mask: each batch element keeps a different rectangle of a sqrt(N_k)-wide
    // grid, so its padded keys fall inside tiles and at their ends. Self-attention (at small N
    // and at the key tiles' tails) and cross-attention (where the step takes it), N_k below and
    // above N.
    const std::pair<int64_t, int64_t> sizes[] = {{1, 1},     {17, 17}, {65, 65},  {130, 130},
                                                 {197, 197}, {65, 130}, {130, 65}, {100, 1050}};
    const std::pair<int64_t, int64_t> causal_sizes[] = {{197, 197}, {130, 300}, {300, 130}};
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        auto padded_shape = [&](int64_t tokens, int64_t kv_tokens, attn::Causal causal) {
          Shape shape{3, 2, tokens, head_dim, dtype, kv_tokens};
          shape.key_padding = true;
          shape.causal = causal;
          return shape;
        };
        for (const auto& [tokens, kv_tokens] : sizes) {
          const Shape shape = padded_shape(tokens, kv_tokens, attn::Causal::none);
          if (takes(shape)) check_masked(shape);
        }
        for (int64_t tokens : sizes_around(step.tiles(head_dim).keys)) {
          check_masked(padded_shape(tokens, tokens, attn::Causal::none));
        }
        // With the causal mask in both alignments: bottom right with N > N_k leaves rows with no
        // key at all, with padding or without.
        for (attn::Causal align : {attn::Causal::top_left, attn::Causal::bottom_right}) {
          for (const auto& [tokens, kv_tokens] : causal_sizes) {
            const Shape shape = padded_shape(tokens, kv_tokens, align);
            if (takes(shape)) check_masked(shape);
          }
        }
        // Large scores over the few keys left, and the key-mask probe.
        for (double qk_scale : {attn::kLargeScoreScale, kMaskProbe}) {
          for (const Shape& shape : {padded_shape(130, 130, attn::Causal::none),
                                     padded_shape(65, 130, attn::Causal::none)}) {
            if (takes(shape)) check_masked(shape, qk_scale);
          }
        }
      }
    }
  }

  TEST_CASE("causal mask with N_q != N_k, both alignments: rows that see no key get dQ = 0, keys no row sees dK = dV = 0") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_causal || !step.takes_kv_tokens) {
      Shape shape{1, 1, 130, 64, attn::DType::fp16, 64};
      shape.causal = attn::Causal::bottom_right;
      expect_refusal(shape, step.takes_causal ? "--kv-tokens" : "--causal");
      return;
    }
    // Bottom right with N_q > N_k: the first N_q - N_k rows see no key (L = -inf: their dQ must be
    // exactly 0, never NaN, and they add nothing to dK and dV). Top left with N_q < N_k: the keys
    // past N_q are seen by no row (dK = dV = 0).
    const std::pair<int64_t, int64_t> sizes[] = {{1, 65},   {65, 1},   {64, 130}, {130, 64},
                                                 {17, 197}, {197, 17}, {300, 77}, {77, 300},
                                                 {100, 1050}};
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        auto causal_shape = [&](int64_t tokens, int64_t kv_tokens, attn::Causal align) {
          Shape shape{2, 3, tokens, head_dim, dtype, kv_tokens};
          shape.causal = align;
          return shape;
        };
        for (attn::Causal align : {attn::Causal::top_left, attn::Causal::bottom_right}) {
          for (const auto& [tokens, kv_tokens] : sizes) {
            const int64_t masked = check_masked(causal_shape(tokens, kv_tokens, align));
            const bool masks_some =
                align == attn::Causal::bottom_right ? tokens > kv_tokens : tokens < kv_tokens;
            CHECK((masked > 0) == masks_some);
          }
        }
        // N_q at the step's Q tiles' tails over 77 keys, bottom right: the first row that sees a
        // key (N_q - 77) falls at another offset of a Q tile each time. Then large scores over
        // the few keys the top rows see.
        for (int64_t tokens : sizes_around(step.tiles(head_dim).rows)) {
          check_masked(causal_shape(tokens, 77, attn::Causal::bottom_right));
        }
        for (double qk_scale : {attn::kLargeScoreScale, kMaskProbe}) {
          check_masked(causal_shape(130, 64, attn::Causal::bottom_right), qk_scale);
        }
      }
    }
  }

  TEST_CASE("a batch element whose keys are all padding: its dQ, dK and dV are 0, never NaN") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_key_padding_mask) {
      expect_refusal(with_key_padding(Shape{1, 1, 64, 64}), "--key-padding");
      return;
    }
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        Shape cross_causal{2, 2, 130, head_dim, dtype, 197};
        cross_causal.causal = attn::Causal::bottom_right;
        for (Shape shape : {Shape{2, 2, 130, head_dim, dtype}, Shape{2, 2, 100, head_dim, dtype, 1050},
                            Shape{2, 2, 130, head_dim, dtype, 65}, cross_causal}) {
          shape.key_padding = true;
          if (!takes(shape)) continue;
          CAPTURE(shape.str());
          REQUIRE(serves(shape));
          attn::HostTensors inputs = attn::make_inputs(shape, 31);
          std::fill(inputs.key_padding_mask.begin(), inputs.key_padding_mask.begin() + shape.keys(), 1);
          for (bool deterministic : {false, true}) {
            if (deterministic && !step.has_deterministic_mode) continue;
            CAPTURE(deterministic);
            const attn::BackwardRunResult run = run_backward_on(inputs, CheckMode::full, deterministic, 31);
            require_pass_and_masked_zero(inputs, run);
            // Batch element 0, every head: each of its rows sees no key and none of its keys is seen.
            const int64_t query_elements = shape.heads * shape.tokens * shape.head_dim;
            const int64_t key_elements = shape.heads * shape.keys() * shape.head_dim;
            auto nonzero_in = [](const std::vector<__half>& gradient, int64_t count) {
              return std::count_if(gradient.begin(), gradient.begin() + count,
                                   [](__half value) { return !(__half2float(value) == 0.0f); });
            };
            const int64_t nonzero = nonzero_in(run.dq, query_elements) +
                                    nonzero_in(run.dk, key_elements) + nonzero_in(run.dv, key_elements);
            CHECK(nonzero == 0);
          }
        }
      }
    }
  }

  TEST_CASE("deterministic mode on cross-attention with the key-padding mask: checked, and the same bits run to run") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_kv_tokens || !step.takes_key_padding_mask) {
      expect_refusal(with_key_padding(Shape{1, 1, 64, 64, attn::DType::fp16, 65}),
                     step.takes_key_padding_mask ? "--kv-tokens" : "--key-padding");
      return;
    }
    if (!step.has_deterministic_mode) {
      MESSAGE("skipped: " << step.id << " has no deterministic mode; no gradient of this case was run");
      return;
    }
    for (attn::DType dtype : step.dtypes) {
      for (int head_dim : step.head_dims) {
        // Bottom right at N_q = 197 over 65 keys: the first 132 rows see no key, whole Q tiles
        // among them, whose dQ no key's turn writes.
        Shape causal{3, 2, 197, head_dim, dtype, 65};
        causal.causal = attn::Causal::bottom_right;
        for (Shape shape : {Shape{3, 2, 100, head_dim, dtype, 1050}, Shape{3, 2, 130, head_dim, dtype, 65},
                            causal}) {
          shape.key_padding = true;
          if (!takes(shape)) continue;
          CAPTURE(shape.str());
          REQUIRE(serves(shape));
          const attn::HostTensors inputs = test_inputs(shape);
          const attn::BackwardRunResult first = run_backward_on(inputs, CheckMode::full, true);
          require_pass_and_masked_zero(inputs, first);
          const attn::BackwardRunResult second = run_backward_on(inputs, CheckMode::full, true);
          CHECK(same_bits(first.dq, second.dq));
          CHECK(same_bits(first.dk, second.dk));
          CHECK(same_bits(first.dv, second.dv));
        }
      }
    }
  }

  TEST_CASE("packed sequences, where the step takes them: lengths 1, tile +- 1, long and short, causal, bf16, deterministic") {
    const attn::StepInfo& step = step_under_test();
    if (!step.takes_packed_sequences) {
      expect_refusal(packed_shape({17, 65}, 64), "--lengths");
      return;
    }
    for (int head_dim : step.head_dims) {
      // Every length around every tile (Q tiles and K/V tiles), between sequences of one token,
      // whose Q tiles' TMA copies bring in the next sequence's rows.
      for (const std::vector<int64_t>& lengths : packed_length_mixes(step.tiles(head_dim), 300)) {
        for (attn::Causal causal : {attn::Causal::none, attn::Causal::top_left}) {
          const Shape shape = packed_shape(lengths, head_dim, causal);
          CAPTURE(shape.str());
          REQUIRE(serves(shape));
          require_pass(check_backward(shape, shape.tokens > 600 ? CheckMode::sample : CheckMode::full));
        }
      }
      // Large scores; bf16; the deterministic mode, the same bits run to run.
      const Shape walk = packed_shape({577, 1, 197, 1025, 64, 129}, head_dim);
      CAPTURE(walk.str());
      require_pass(check_backward(walk, CheckMode::sample, attn::kLargeScoreScale));
      for (attn::Causal causal : {attn::Causal::none, attn::Causal::top_left}) {
        const Shape shape = packed_shape({197, 65, 1, 300}, head_dim, causal, attn::DType::bf16);
        CAPTURE(shape.str());
        require_pass(check_backward(shape, CheckMode::full));
        if (!step.has_deterministic_mode) continue;
        check_deterministic(shape, CheckMode::full);
      }
    }
  }

  TEST_CASE("refuses a head dim it does not serve, naming the flag") {
    const auto reason = step_under_test().refuses(Shape{1, 1, 64, 48});
    REQUIRE(reason.has_value());
    CHECK(reason->find("--head-dim 48") != std::string::npos);
  }
}
