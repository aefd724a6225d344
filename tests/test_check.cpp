// The checker: a correct fp16 output passes with margin; every planted defect fails.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>

#include "check.hpp"

namespace {

using attn::CheckMode;
using attn::Shape;

struct Fixture {
  Shape shape{2, 3, 33, 64};
  attn::HostTensors inputs = attn::make_inputs(shape, 21);
  attn::Reference reference = attn::compute_reference(
      inputs, attn::slices_to_check(shape, CheckMode::full, 21));

  // The reference rounded to fp16: what a perfect kernel would store.
  std::vector<__half> perfect_output() const {
    std::vector<__half> out(std::size_t(shape.elements()));
    const int64_t slice_size = shape.tokens * shape.head_dim;
    for (std::size_t w = 0; w < reference.slices.size(); ++w) {
      for (int64_t i = 0; i < slice_size; ++i) {
        out[reference.slices[w] * slice_size + i] = __float2half(float(reference.output[w][i]));
      }
    }
    return out;
  }
};

}  // namespace

TEST_SUITE("check") {
  TEST_CASE("a perfect fp16 output passes, far inside the tolerance") {
    Fixture f;
    const attn::CheckResult result = attn::compare(f.inputs, f.reference, f.perfect_output());
    CHECK(result.passed);
    CHECK(result.nonfinite == 0);
    CHECK(result.checked_slices == 6);
    // Rounding O alone costs ~u/2 relative; the tolerance leaves room for P's rounding too.
    CHECK(result.relative_error < attn::kRelativeTolerance / 4);
    CHECK(result.max_abs_error < result.abs_tolerance / 4);
  }

  TEST_CASE("one element off fails, and the message says where") {
    Fixture f;
    std::vector<__half> out = f.perfect_output();
    const int64_t row = 20, column = 5, slice = 4;
    const int64_t index = (slice * f.shape.tokens + row) * f.shape.head_dim + column;
    out[index] = __float2half(__half2float(out[index]) + 0.05f);
    const attn::CheckResult result = attn::compare(f.inputs, f.reference, out);
    CHECK_FALSE(result.passed);
    CHECK(result.worst.find("slice 4, row 20, column 5") != std::string::npos);
  }

  TEST_CASE("a skipped row fails, whether left as poison or as zeros") {
    Fixture f;
    for (float fill : {std::numeric_limits<float>::quiet_NaN(), 0.0f}) {
      CAPTURE(fill);
      std::vector<__half> out = f.perfect_output();
      const int64_t row = f.shape.tokens - 1, slice = f.shape.slices() - 1;  // the tail row
      for (int64_t c = 0; c < f.shape.head_dim; ++c) {
        out[(slice * f.shape.tokens + row) * f.shape.head_dim + c] = __float2half(fill);
      }
      CHECK_FALSE(attn::compare(f.inputs, f.reference, out).passed);
    }
  }

  TEST_CASE("a single NaN or Inf fails") {
    Fixture f;
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<__half> out = f.perfect_output();
      out[123] = __float2half(bad);
      const attn::CheckResult result = attn::compare(f.inputs, f.reference, out);
      CHECK_FALSE(result.passed);
      CHECK(result.nonfinite == 1);
    }
  }

  TEST_CASE("a wrong softmax scale fails (1/D instead of 1/sqrt(D))") {
    Fixture f;
    attn::HostTensors scaled = f.inputs;  // q / sqrt(D) makes the scores q.k / D
    for (__half& x : scaled.q) x = __float2half(__half2float(x) / 8.0f);
    const attn::Reference wrong = attn::compute_reference(scaled, f.reference.slices);
    std::vector<__half> out = f.perfect_output();
    const int64_t slice_size = f.shape.tokens * f.shape.head_dim;
    for (std::size_t w = 0; w < wrong.slices.size(); ++w) {
      for (int64_t i = 0; i < slice_size; ++i) {
        out[wrong.slices[w] * slice_size + i] = __float2half(float(wrong.output[w][i]));
      }
    }
    CHECK_FALSE(attn::compare(f.inputs, f.reference, out).passed);
  }

  TEST_CASE("sampled slices include the first and the last; full covers all") {
    const Shape shape{32, 12, 8, 64};
    const std::vector<int64_t> sample = attn::slices_to_check(shape, CheckMode::sample, 5);
    CHECK(sample.size() == 4);
    CHECK(sample.front() == 0);
    CHECK(sample.back() == shape.slices() - 1);
    CHECK(std::set<int64_t>(sample.begin(), sample.end()).size() == sample.size());
    CHECK(attn::slices_to_check(shape, CheckMode::full, 5).size() == 384);
    CHECK(attn::slices_to_check(shape, CheckMode::none, 5).empty());
    CHECK(attn::slices_to_check({1, 3, 8, 64}, CheckMode::sample, 5).size() == 3);
  }
}
