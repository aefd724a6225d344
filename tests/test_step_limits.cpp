// The limits of the real steps, judged as the harness judges them on a GPU, without one: the
// step objects are linked in (they register themselves) and no kernel is launched. Shared memory
// against the budgets of common GPUs (v1-v5 keep whole score rows on chip, so their N limit is
// the GPU's), and compute capability against the GPU's (v6 needs 8.0, the Hopper steps 9.0).
#include <doctest/doctest.h>

#include <iterator>
#include <string>

#include "step.hpp"

namespace {

using attn::DeviceLimits;
using attn::Shape;
using attn::StepInfo;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The shipped layout of step N: vN, or vN_ref when vN is built from a student's file.
const StepInfo& shipped(int number) {
  const std::string id = "v" + std::to_string(number);
  const StepInfo* step = attn::find_step(id + "_ref");
  if (step == nullptr) step = attn::find_step(id);
  REQUIRE_MESSAGE(step != nullptr, "step " << id << " is not linked in");
  return *step;
}

const DeviceLimits kT4{"Tesla T4", 75, 65536};                     // 64 KB per block
const DeviceLimits kRtx4090{"NVIDIA GeForce RTX 4090", 89, 101376};  // 99 KB
const DeviceLimits kA100{"NVIDIA A100-SXM4-80GB", 80, 166912};      // 163 KB
const DeviceLimits kH100{"NVIDIA H100 80GB HBM3", 90, 232448};      // 227 KB
const DeviceLimits kB200{"NVIDIA B200", 100, 232448};

// The ViT 512-px shape (N = 1025) at B = 32, H = 12, D = 64.
const Shape kVit512{32, 12, 1025, 64};

}  // namespace

TEST_SUITE("step_limits") {
  TEST_CASE("the budgets of common GPUs are the ones bench --gpu-table prints") {
    REQUIRE(std::size(attn::kSharedBudgets) == 4);
    CHECK(attn::kSharedBudgets[0].bytes == kT4.shared_bytes_per_block);
    CHECK(attn::kSharedBudgets[1].bytes == kRtx4090.shared_bytes_per_block);
    CHECK(attn::kSharedBudgets[2].bytes == kA100.shared_bytes_per_block);
    CHECK(attn::kSharedBudgets[3].bytes == kH100.shared_bytes_per_block);
  }

  TEST_CASE("v1-v5 at N = 1025: which GPUs serve it, and the refusal names --tokens and both byte counts") {
    struct Expected {
      int step;
      bool on_t4, on_rtx, on_a100;
    };
    // v1, v2: 16 fp32 score rows (64 bytes a token) + 10 KB of tiles = 79,872 bytes at N = 1025.
    // v3, v4: plus 16 fp16 P rows (96 bytes a token) + 14 KB = 118,784. v5: 32 padded rows.
    const Expected expected[] = {{1, false, true, true},
                                 {2, false, true, true},
                                 {3, false, false, true},
                                 {4, false, false, true},
                                 {5, false, false, true}};
    for (const Expected& e : expected) {
      const StepInfo& step = shipped(e.step);
      CAPTURE(step.id);
      const std::size_t needed = step.shared_bytes_for(kVit512);
      for (auto [device, serves] : {std::pair{kT4, e.on_t4}, {kRtx4090, e.on_rtx}, {kA100, e.on_a100}}) {
        CAPTURE(device.name);
        const auto reason = step.refuses(kVit512, device);
        CHECK(reason.has_value() != serves);
        CHECK((needed <= device.shared_bytes_per_block) == serves);
        if (!reason) continue;
        CHECK(contains(*reason, step.id + " does not serve --tokens 1025 on this GPU"));
        CHECK(contains(*reason, "it needs " + std::to_string(needed) + " bytes of shared memory"));
        CHECK(contains(*reason, device.name + " allows " + std::to_string(device.shared_bytes_per_block)));
      }
      CHECK_FALSE(step.refuses(kVit512, kH100));
    }
  }

  TEST_CASE("max_tokens agrees with refuses at the boundary, for every budget") {
    for (int number = 1; number <= 5; ++number) {
      const StepInfo& step = shipped(number);
      for (const attn::SharedBudget& budget : attn::kSharedBudgets) {
        const DeviceLimits device{std::string(budget.label) + " GPU", 75, budget.bytes};
        CAPTURE(step.id);
        CAPTURE(device.name);
        const auto largest = step.max_tokens(64, device.shared_bytes_per_block);
        REQUIRE(largest.has_value());  // whole score rows on chip: every budget sets a limit
        REQUIRE(*largest > 0);
        CHECK(*largest % 64 == 0);  // a whole number of 64-key tiles
        CHECK_FALSE(step.refuses({1, 1, *largest, 64}, device));
        CHECK_FALSE(step.refuses({32, 12, *largest, 64}, device));  // B and H take no shared memory
        const auto too_long = step.refuses({1, 1, *largest + 1, 64}, device);
        REQUIRE(too_long.has_value());
        CHECK(contains(*too_long, "--tokens " + std::to_string(*largest + 1)));
        CHECK(contains(*too_long, "the largest N it serves here is " + std::to_string(*largest)));
        CHECK(step.shared_bytes_for({1, 1, *largest, 64}) <= budget.bytes);
        CHECK(step.shared_bytes_for({1, 1, *largest + 1, 64}) > budget.bytes);
      }
      // The limit never shrinks as the budget grows, and an A100 serves every ViT shape.
      CHECK(*step.max_tokens(64, 65536) <= *step.max_tokens(64, 101376));
      CHECK(*step.max_tokens(64, 101376) <= *step.max_tokens(64, 166912));
      CHECK(*step.max_tokens(64, 166912) <= *step.max_tokens(64, 232448));
      CHECK(*step.max_tokens(64, 166912) >= 1025);
    }
  }

  TEST_CASE("steps without an N limit: v0 and v6 serve any N on every GPU they run on") {
    for (int number : {0, 6}) {
      const StepInfo& step = shipped(number);
      CAPTURE(step.id);
      for (const attn::SharedBudget& budget : attn::kSharedBudgets) {
        bool runs = false;  // on some GPU of this budget (v6: not on a T4)
        for (int capability : budget.capabilities) {
          runs = runs || (capability != 0 && !step.refuses_device({"", capability, budget.bytes}));
        }
        if (!runs) continue;
        for (int head_dim : step.head_dims) {
          CAPTURE(budget.label);
          CAPTURE(head_dim);
          CHECK_FALSE(step.max_tokens(head_dim, budget.bytes).has_value());
        }
      }
      CHECK_FALSE(step.refuses({1, 2, 16385, 64}, kRtx4090));
    }
  }

  TEST_CASE("compute capability: v6 needs 8.0 or newer") {
    const StepInfo& v6 = shipped(6);
    CHECK(v6.compute_capability_range() == "8.0+");
    const auto reason = v6.refuses_device(kT4);
    REQUIRE(reason.has_value());
    CHECK(contains(*reason, v6.id + " needs a GPU of compute capability 8.0 or newer"));
    CHECK(contains(*reason, "this GPU, Tesla T4, is 7.5"));
    // The whole judgement says the same, before any shared-memory or N question.
    CHECK(v6.refuses({1, 1, 197, 64}, kT4) == reason);
    for (const DeviceLimits& device : {kRtx4090, kA100, kH100, kB200}) {
      CAPTURE(device.name);
      CHECK_FALSE(v6.refuses_device(device));
      CHECK_FALSE(v6.refuses({32, 12, 1025, 64}, device));
    }
    for (int number = 0; number <= 5; ++number) {  // the others run on a T4
      CHECK(shipped(number).compute_capability_range() == "7.5+");
      CHECK_FALSE(shipped(number).refuses_device(kT4));
    }
  }

  TEST_CASE("compute capability: a Hopper-only step (9.0 exactly) refuses below and above") {
    const StepInfo hopper{"v98", "sm_90a test step", {64, 128}, 90, 90, nullptr, nullptr};
    CHECK(hopper.compute_capability_range() == "9.0");
    CHECK_FALSE(hopper.refuses_device(kH100));
    CHECK_FALSE(hopper.refuses({8, 16, 4097, 128}, kH100));

    const auto below = hopper.refuses_device(kA100);
    REQUIRE(below.has_value());
    CHECK(*below == "v98 needs a GPU of compute capability 9.0 exactly (its code is built for that "
                    "GPU family alone); this GPU, NVIDIA A100-SXM4-80GB, is 8.0");
    const auto above = hopper.refuses_device(kB200);
    REQUIRE(above.has_value());
    CHECK(contains(*above, "v98 needs a GPU of compute capability 9.0 exactly"));
    CHECK(contains(*above, "this GPU, NVIDIA B200, is 10.0"));
    CHECK(hopper.refuses({1, 1, 197, 64}, kB200) == above);

    const StepInfo ampere_family{"v97", "a range", {64}, 80, 89, nullptr, nullptr};
    CHECK(ampere_family.compute_capability_range() == "8.0-8.9");
    CHECK(ampere_family.refuses_device(kH100).value() ==
          "v97 needs a GPU of compute capability 8.0 to 8.9; this GPU, NVIDIA H100 80GB HBM3, is 9.0");
    CHECK_FALSE(ampere_family.refuses_device(kRtx4090));
  }

  TEST_CASE("a head dim no N fits on this GPU is refused naming --head-dim, not --tokens") {
    auto big = [](const Shape& shape) -> std::size_t { return shape.head_dim == 128 ? 100000 : 1000; };
    const StepInfo step{"v96", "needs 100 KB at D = 128", {64, 128}, 75, 0, big, nullptr};
    CHECK(step.max_tokens(128, 65536) == 0);
    const auto reason = step.refuses({1, 1, 197, 128}, kT4);
    REQUIRE(reason.has_value());
    CHECK(*reason == "v96 does not serve --head-dim 128 on this GPU: at any N it needs 100000 bytes "
                     "of shared memory per block, Tesla T4 allows 65536");
    CHECK_FALSE(step.refuses({1, 1, 197, 64}, kT4));
    CHECK_FALSE(step.refuses({1, 1, 197, 128}, kRtx4090));
  }
}
