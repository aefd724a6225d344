// The GPU suite, run for one step at a time (gpu_tests --step=v3): the shape matrix with tails,
// the headline and long shapes, a probe of the key mask, persistent blocks that walk several
// work tiles, the stress case, run-to-run equality, and refusals. Every test checks every
// output element of every slice, and a step that writes L every row's L (check.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
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
// Tails for every tile size the steps use (64, 128, 160, 208 keys; 64 and 128 query rows).
const int64_t kMaskProbeTokens[] = {1, 17, 65, 127, 130, 197, 577, 1025};
// A persistent step gets at most this many blocks in the tests below, so that every block walks
// several work tiles (its Q buffers wrap around, its O staging buffer is reused) on any GPU.
constexpr int kFewBlocks = 4;

bool serves(const attn::StepInfo& step, const Shape& shape) {
  return !step.refuses(shape, device_under_test());
}

struct Run {
  CheckMode mode = CheckMode::full;
  double qk_scale = 1.0;
  bool mask_probe = false;  // make_key_mask_probe_inputs instead of standard normal ones
  int max_persistent_blocks = 0;
  uint64_t seed = 17;
};

// Every element of every slice is checked: against the fp64 reference on the slices `mode`
// picks, and against the GPU reference on all of them (the runner's default).
attn::CheckResult check_step(const attn::StepInfo& step, const Shape& shape, const Run& run = {}) {
  const attn::HostTensors inputs = run.mask_probe
                                       ? attn::make_key_mask_probe_inputs(shape, run.seed)
                                       : attn::make_inputs(shape, run.seed, run.qk_scale);
  const attn::Reference reference =
      attn::compute_reference(inputs, attn::slices_to_check(shape, run.mode, run.seed));
  attn::RunConfig config;
  config.time = false;
  config.max_persistent_blocks = run.max_persistent_blocks;
  return attn::run_step(step, inputs, &reference, config).check;
}

void require_pass(const attn::CheckResult& result) {
  INFO("relative error " << result.relative_error << " (tolerance " << result.relative_tolerance
                         << "), max abs error " << result.max_abs_error << " (tolerance "
                         << result.abs_tolerance << ") on " << result.checked_slices
                         << " slices against fp64; relative error " << result.all_relative_error
                         << ", max abs error " << result.all_max_abs_error << " (tolerance "
                         << result.all_abs_tolerance << ") on all " << result.all_checked_slices
                         << " slices against the GPU reference; " << result.nonfinite
                         << " non-finite; L max abs error " << result.log_sum_exp_max_error
                         << " on " << result.log_sum_exp_rows << " rows; " << result.worst);
  CHECK(result.passed);
  CHECK(result.all_checked_slices == result.total_slices);  // every slice was looked at
  // A step that writes L (the log-sum-exp) had it checked, every row of every slice.
  CHECK((result.log_sum_exp_rows > 0) == step_under_test().writes_log_sum_exp);
}

}  // namespace

TEST_CASE("shape matrix: every N of the tests, tails included, every head dim served") {
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : kTokens) {
      for (auto [batch, heads] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}}) {
        const Shape shape{batch, heads, tokens, head_dim};
        if (!serves(step, shape)) continue;
        CAPTURE(shape.str());
        require_pass(check_step(step, shape));
      }
    }
  }
}

TEST_CASE("tile multiples: N = k x tile and k x tile +- 1 for every tile of every head dim") {
  // The step's own tiles (StepInfo::tile_sizes): a tail mask written for "N % tile != 0", a tile
  // count off by one, or a last tile assumed partial break exactly here. Where the step takes
  // N_k != N, the sizes of the query tiles and of the key tiles are also run apart, the other
  // side at 77; the key sizes with the key-mask probe too (a key past N_k admitted fails it).
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    const attn::TileSizes tiles = step.tiles(head_dim);
    if (tiles.rows.empty() && tiles.keys.empty()) {
      MESSAGE(step.id << " cuts N into no tiles (one thread per output): nothing to run here");
      return;
    }
    CAPTURE(head_dim);
    for (int64_t tokens : sizes_around(all_tiles(tiles))) {
      const Shape shape{1, 2, tokens, head_dim};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
    if (!step.takes_kv_tokens) continue;
    for (int64_t tokens : sizes_around(tiles.rows)) {
      const Shape shape{1, 2, tokens, head_dim, attn::DType::fp16, 77};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
    for (int64_t kv_tokens : sizes_around(tiles.keys)) {
      const Shape shape{1, 2, 77, head_dim, attn::DType::fp16, kv_tokens};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
      Run mask;
      mask.mask_probe = true;
      require_pass(check_step(step, shape, mask));
    }
  }
}

TEST_CASE("large scores over a few keys and at tile edges: every output finite and right") {
  // Scores at a standard deviation of 16 (kLargeScoreScale) with N = 1, 2, 3, 5, 17 and one
  // short of and past each tile: a row's L is often far below 0 there, so a key past N that keeps
  // any weight (its score 0 from a zero-filled K row) overflows. In each dtype the step takes.
  const attn::StepInfo& step = step_under_test();
  for (attn::DType dtype : step.dtypes) {
    for (int head_dim : step.head_dims) {
      for (int64_t tokens : few_keys_and_tile_edges(step.tiles(head_dim))) {
        const Shape shape{2, 3, tokens, head_dim, dtype};
        if (!serves(step, shape)) continue;
        CAPTURE(shape.str());
        Run run;
        run.qk_scale = attn::kLargeScoreScale;
        require_pass(check_step(step, shape, run));
      }
    }
  }
}

TEST_CASE("headline ViT shapes at B = 32, H = 12 (fp64 on sampled slices, every slice on the GPU)") {
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : kHeadlineTokens) {
      const Shape shape{32, 12, tokens, head_dim};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape, {CheckMode::sample}));
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
      require_pass(check_step(step, shape));
    }
  }
}

TEST_CASE("key mask: with every real score strongly negative, a key past N must get no weight") {
  // Built to expose a mask off by one (a padded key admitted), whatever the tolerance: such a key
  // scores 0 against real scores near -4 sqrt(D), and takes its whole row (inputs.hpp).
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : kMaskProbeTokens) {
      const Shape shape{2, 3, tokens, head_dim};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      Run run;
      run.mask_probe = true;
      require_pass(check_step(step, shape, run));
    }
  }
}

TEST_CASE("persistent blocks: every block runs several work tiles, fully checked") {
  // At most kFewBlocks blocks: with 128-row work tiles (the largest any step uses) these shapes
  // have at least 3 * kFewBlocks tiles, so each block walks three or more, and a tile whose
  // second 64 rows lie past N (N = 1025) is among them. Steps without persistent blocks ignore
  // the cap and run the same shapes.
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (const Shape& shape : {Shape{2, 3, 577, head_dim}, Shape{1, 3, 1025, head_dim},
                               Shape{4, 3, 197, head_dim}}) {
      REQUIRE(shape.slices() * ((shape.tokens + 127) / 128) >= 3 * kFewBlocks);
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      for (bool mask_probe : {false, true}) {
        CAPTURE(mask_probe);
        Run run;
        run.mask_probe = mask_probe;
        run.max_persistent_blocks = kFewBlocks;
        require_pass(check_step(step, shape, run));
      }
    }
  }
}

TEST_CASE("stress: scores in the hundreds, the softmax must stay stable, every head dim") {
  const attn::StepInfo& step = step_under_test();
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : {int64_t(77), int64_t(577)}) {
      const Shape shape{2, 2, tokens, head_dim};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      Run run;
      run.qk_scale = attn::kStressScale;
      require_pass(check_step(step, shape, run));
    }
  }
}

TEST_CASE("run-to-run equality: the same inputs give the same bits, and they are numbers") {
  const attn::StepInfo& step = step_under_test();
  REQUIRE(serves(step, Shape{2, 3, 197, 64}));  // every step serves it
  for (const Shape& shape : {Shape{2, 3, 197, 64}, Shape{2, 3, 577, 64}}) {
    if (!serves(step, shape)) continue;
    CAPTURE(shape.str());
    const attn::HostTensors inputs = attn::make_inputs(shape, 5);
    attn::RunConfig config;
    config.time = false;
    config.max_persistent_blocks = kFewBlocks;
    const std::vector<__half> first = attn::run_step(step, inputs, nullptr, config).output;
    const std::vector<__half> second = attn::run_step(step, inputs, nullptr, config).output;
    // Two unwritten (NaN-poisoned) outputs would compare equal: every element must be finite.
    const auto finite = [](const std::vector<__half>& output) {
      return std::all_of(output.begin(), output.end(),
                         [](__half x) { return std::isfinite(__half2float(x)); });
    };
    REQUIRE(first.size() == std::size_t(shape.elements()));
    REQUIRE(second.size() == first.size());
    CHECK(finite(first));
    CHECK(finite(second));
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(__half)) == 0);
  }
}

TEST_CASE("bf16, where the step takes it: tails, a ViT shape, the stress case, the key mask") {
  const attn::StepInfo& step = step_under_test();
  const Shape probe{1, 1, 64, 64, attn::DType::bf16};
  if (std::find(step.dtypes.begin(), step.dtypes.end(), attn::DType::bf16) == step.dtypes.end()) {
    const auto reason = step.refuses(probe, device_under_test());  // the refusal is the test
    REQUIRE(reason.has_value());
    CHECK(reason->find("--dtype bf16") != std::string::npos);
    return;
  }
  for (int head_dim : step.head_dims) {
    for (int64_t tokens : {1, 17, 64, 65, 127, 197}) {
      for (auto [batch, heads] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}}) {
        const Shape shape{batch, heads, tokens, head_dim, attn::DType::bf16};
        if (!serves(step, shape)) continue;
        CAPTURE(shape.str());
        require_pass(check_step(step, shape));
      }
    }
    const Shape vit{32, 12, 577, head_dim, attn::DType::bf16};
    if (serves(step, vit)) {
      CAPTURE(vit.str());
      require_pass(check_step(step, vit, {CheckMode::sample}));
    }
    const Shape small{2, 2, 577, head_dim, attn::DType::bf16};
    if (serves(step, small)) {
      CAPTURE(small.str());
      Run stress;
      stress.qk_scale = attn::kStressScale;
      require_pass(check_step(step, small, stress));
      Run mask;
      mask.mask_probe = true;
      require_pass(check_step(step, Shape{1, 2, 130, head_dim, attn::DType::bf16}, mask));
    }
  }
}

TEST_CASE("cross-attention, where the step serves it: N_q and N_k apart, the tails of each") {
  const attn::StepInfo& step = step_under_test();
  if (!step.takes_kv_tokens) {
    const auto reason = step.refuses(Shape{1, 1, 64, 64, attn::DType::fp16, 65}, device_under_test());
    REQUIRE(reason.has_value());  // the refusal is the test
    CHECK(reason->find("--kv-tokens 65") != std::string::npos);
    return;
  }
  // Tails of N_q with a whole K/V tile and of N_k with a whole Q tile, both at once, one of each
  // side, and DETR's decoder (100 object queries over 1050 image positions).
  const std::pair<int64_t, int64_t> sizes[] = {{1, 65},   {65, 1},   {64, 130}, {130, 64},
                                               {17, 197}, {197, 17}, {100, 1050}};
  for (int head_dim : step.head_dims) {
    for (const auto& [tokens, kv_tokens] : sizes) {
      const Shape shape{2, 3, tokens, head_dim, attn::DType::fp16, kv_tokens};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
    // A key past N_k must get no weight, at a tail of N_k shorter and longer than N_q.
    for (const auto& [tokens, kv_tokens] : {std::pair<int64_t, int64_t>{130, 17}, {17, 130}}) {
      const Shape shape{1, 2, tokens, head_dim, attn::DType::fp16, kv_tokens};
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      Run mask;
      mask.mask_probe = true;
      require_pass(check_step(step, shape, mask));
    }
  }
}

TEST_CASE("key-padding mask, where the step takes it: padded keys get no weight, in self- and cross-attention") {
  const attn::StepInfo& step = step_under_test();
  if (!step.takes_key_padding_mask) {
    Shape padded{1, 1, 64, 64};
    padded.key_padding = true;
    const auto reason = step.refuses(padded, device_under_test());
    REQUIRE(reason.has_value());  // the refusal is the test
    CHECK(reason->find("--key-padding") != std::string::npos);
    return;
  }
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},  {17, 17},  {65, 65},   {130, 130},
                                               {197, 197}, {65, 130}, {100, 1050}};
  for (int head_dim : step.head_dims) {
    for (const auto& [tokens, kv_tokens] : sizes) {
      Shape shape{3, 2, tokens, head_dim, attn::DType::fp16, kv_tokens};
      shape.key_padding = true;
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
    // Persistent blocks that walk several work tiles of different batch elements (each with a
    // mask of its own): one tile's mask must not leak into the next (step 8 fetches the mask of
    // the K/V tile it will visit next).
    for (const auto& [tokens, kv_tokens] : {std::pair<int64_t, int64_t>{197, 197}, {100, 1050}}) {
      Shape shape{6, 2, tokens, head_dim, attn::DType::fp16, kv_tokens};
      shape.key_padding = true;
      REQUIRE(shape.slices() * ((shape.tokens + 127) / 128) >= 3 * kFewBlocks);
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      Run run;
      run.max_persistent_blocks = kFewBlocks;
      require_pass(check_step(step, shape, run));
    }
    // A batch element whose keys are all padding: its rows are O = 0 and L = -inf.
    Shape shape{2, 2, 130, head_dim, attn::DType::fp16, 0};
    shape.key_padding = true;
    if (!serves(step, shape)) continue;
    CAPTURE(shape.str());
    attn::HostTensors inputs = attn::make_inputs(shape, 31);
    std::fill(inputs.key_padding_mask.begin(), inputs.key_padding_mask.begin() + shape.keys(), 1);
    const attn::Reference reference =
        attn::compute_reference(inputs, attn::slices_to_check(shape, CheckMode::full, 31));
    attn::RunConfig config;
    config.time = false;
    const attn::RunResult run = attn::run_step(step, inputs, &reference, config);
    require_pass(run.check);
    for (int64_t i = 0; i < shape.heads * shape.tokens * shape.head_dim; ++i) {  // batch 0
      REQUIRE(__half2float(run.output[std::size_t(i)]) == 0.0f);
    }
  }
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

TEST_CASE("causal mask, where the step takes it: tails, N_q != N_k in both alignments, bf16, with padding") {
  const attn::StepInfo& step = step_under_test();
  if (!step.takes_causal) {
    Shape causal{1, 1, 64, 64};
    causal.causal = attn::Causal::top_left;
    const auto reason = step.refuses(causal, device_under_test());
    REQUIRE(reason.has_value());  // the refusal is the test
    CHECK(reason->find("--causal") != std::string::npos);
    return;
  }
  auto causal_shape = [](int64_t batch, int64_t heads, int64_t tokens, int64_t kv_tokens,
                         int64_t head_dim, attn::Causal align, attn::DType dtype = attn::DType::fp16) {
    Shape shape{batch, heads, tokens, head_dim, dtype, kv_tokens};
    shape.causal = align;
    return shape;
  };
  for (int head_dim : step.head_dims) {
    // Self-attention at every tail the step's tiles make, and a few small N: the diagonal
    // crosses a tile at every offset.
    std::vector<int64_t> sizes = {1, 2, 17, 197};
    const attn::TileSizes tiles = step.tiles(head_dim);
    for (int64_t tokens : sizes_around(all_tiles(tiles))) sizes.push_back(tokens);
    for (int64_t tokens : sizes) {
      const Shape shape = causal_shape(1, 2, tokens, 0, head_dim, attn::Causal::top_left);
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
    // N_q != N_k: the alignments differ. Bottom right with N_q > N_k leaves the first
    // N_q - N_k rows with no key (O = 0, L = -inf); with N_q < N_k top left leaves keys no row sees.
    const std::pair<int64_t, int64_t> cross[] = {{1, 65},   {65, 1},   {64, 130}, {130, 64},
                                                 {17, 197}, {197, 17}, {300, 77}, {77, 300},
                                                 {100, 1050}};
    for (attn::Causal align : {attn::Causal::top_left, attn::Causal::bottom_right}) {
      for (const auto& [tokens, kv_tokens] : cross) {
        const Shape shape = causal_shape(2, 3, tokens, kv_tokens, head_dim, align);
        if (!serves(step, shape)) continue;
        CAPTURE(shape.str());
        require_pass(check_step(step, shape));
      }
    }
    // With the key-padding mask, and with large scores over the few keys the top rows see.
    for (const auto& [tokens, kv_tokens] : {std::pair<int64_t, int64_t>{197, 197}, {130, 300}}) {
      Shape shape = causal_shape(3, 2, tokens, kv_tokens, head_dim, attn::Causal::bottom_right);
      shape.key_padding = true;
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
    const Shape large = causal_shape(2, 3, 130, 0, head_dim, attn::Causal::top_left);
    if (serves(step, large)) {
      CAPTURE(large.str());
      Run run;
      run.qk_scale = attn::kLargeScoreScale;
      require_pass(check_step(step, large, run));
    }
    // Persistent blocks walking work tiles of different lengths; a ViT shape; bf16.
    for (const Shape& shape : {causal_shape(2, 3, 577, 0, head_dim, attn::Causal::top_left),
                               causal_shape(1, 3, 1025, 600, head_dim, attn::Causal::bottom_right)}) {
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      Run run;
      run.max_persistent_blocks = kFewBlocks;
      require_pass(check_step(step, shape, run));
    }
    const Shape vit = causal_shape(32, 12, 577, 0, head_dim, attn::Causal::top_left);
    if (serves(step, vit)) {
      CAPTURE(vit.str());
      require_pass(check_step(step, vit, {CheckMode::sample}));
    }
    for (const Shape& shape : {causal_shape(2, 3, 197, 0, head_dim, attn::Causal::top_left, attn::DType::bf16),
                               causal_shape(2, 3, 130, 64, head_dim, attn::Causal::bottom_right, attn::DType::bf16)}) {
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
  }
}

TEST_CASE("packed sequences, where the step takes them: lengths 1, tile +- 1, long and short, causal, bf16") {
  const attn::StepInfo& step = step_under_test();
  if (!step.takes_packed_sequences) {
    const auto reason = step.refuses(packed_shape({17, 65}, 64), device_under_test());
    REQUIRE(reason.has_value());  // the refusal is the test
    CHECK(reason->find("--lengths") != std::string::npos);
    return;
  }
  for (int head_dim : step.head_dims) {
    // Every length around every tile (work tiles and K/V tiles), between sequences of one token.
    for (const std::vector<int64_t>& lengths : packed_length_mixes(step.tiles(head_dim), 400)) {
      for (attn::Causal causal : {attn::Causal::none, attn::Causal::top_left}) {
        const Shape shape = packed_shape(lengths, head_dim, causal);
        if (!serves(step, shape)) continue;
        CAPTURE(shape.str());
        // fp64 on sampled sequences where they are long (the GPU reference checks every one).
        require_pass(check_step(step, shape, {shape.tokens > 600 ? CheckMode::sample : CheckMode::full}));
      }
    }
    // Persistent blocks walking tiles of sequences of many lengths; large scores; bf16.
    const Shape walk = packed_shape({577, 1, 197, 1025, 64, 129}, head_dim);
    if (serves(step, walk)) {
      CAPTURE(walk.str());
      Run run{CheckMode::sample};
      run.max_persistent_blocks = kFewBlocks;
      require_pass(check_step(step, walk, run));
      run.max_persistent_blocks = 0;
      run.qk_scale = attn::kLargeScoreScale;
      require_pass(check_step(step, walk, run));
    }
    for (attn::Causal causal : {attn::Causal::none, attn::Causal::top_left}) {
      const Shape shape = packed_shape({197, 65, 1, 300}, head_dim, causal, attn::DType::bf16);
      if (!serves(step, shape)) continue;
      CAPTURE(shape.str());
      require_pass(check_step(step, shape));
    }
  }
}
