// The checker: a correct fp16 output passes with margin; every planted defect fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <cuda_bf16.h>

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

// What a correct flash backward computes, on the CPU: scores summed and exponentiated in fp32,
// the forward's P rounded to the 16-bit type before P V and O stored in it, L in fp32, P rebuilt
// from L, D = dO . O from that 16-bit O, P and dS rounded to the 16-bit type for their products,
// the gradients stored in it. `eager`: dS from the 16-bit P instead of the fp32 one, as an eager
// backward forms it from the P it stored. `with_d_term` false drops D from dS (a bug the check
// must catch).
struct SimulatedGradients {
  std::vector<__half> dq, dk, dv;
};
SimulatedGradients simulated_backward(const attn::HostTensors& inputs, const std::vector<__half>& d_o,
                                      bool eager = false, bool with_d_term = true) {
  const Shape& shape = inputs.shape;
  const int64_t n = shape.tokens, d = shape.head_dim;
  const float scale = float(1.0 / std::sqrt(double(d)));
  auto value = [](const std::vector<__half>& t, int64_t i) { return double(__half2float(t[std::size_t(i)])); };
  auto rounded = [&](double x) {  // to the kernel's 16-bit type, kept in it
    return shape.dtype == attn::DType::bf16 ? double(__bfloat162float(__float2bfloat16(float(x))))
                                            : double(__half2float(__float2half(float(x))));
  };
  auto stored = [&](double x) { return attn::to_dtype(float(x), shape.dtype); };  // as downloaded
  SimulatedGradients out{std::vector<__half>(std::size_t(shape.elements())),
                         std::vector<__half>(std::size_t(shape.elements())),
                         std::vector<__half>(std::size_t(shape.elements()))};
  for (int64_t slice = 0; slice < shape.slices(); ++slice) {
    const int64_t base = slice * n * d;
    std::vector<float> s(static_cast<std::size_t>(n * n)), lse(static_cast<std::size_t>(n)),
        row_dot(static_cast<std::size_t>(n));
    std::vector<double> p(std::size_t(n * n)), d_s(std::size_t(n * n));
    for (int64_t i = 0; i < n; ++i) {
      float row_max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += value(inputs.q, base + i * d + c) * value(inputs.k, base + j * d + c);
        s[std::size_t(i * n + j)] = float(dot) * scale;
        row_max = std::max(row_max, s[std::size_t(i * n + j)]);
      }
      float row_sum = 0;
      for (int64_t j = 0; j < n; ++j) row_sum += std::exp(s[std::size_t(i * n + j)] - row_max);
      lse[std::size_t(i)] = row_max + std::log(row_sum);
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        double o = 0;
        for (int64_t j = 0; j < n; ++j) o += rounded(std::exp(s[std::size_t(i * n + j)] - row_max)) * value(inputs.v, base + j * d + c);
        dot += float(value(d_o, base + i * d + c) * rounded(o / row_sum));
      }
      row_dot[std::size_t(i)] = with_d_term ? dot : 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        double d_p = 0;
        for (int64_t c = 0; c < d; ++c) d_p += value(d_o, base + i * d + c) * value(inputs.v, base + j * d + c);
        const float p_ij = std::exp(s[std::size_t(i * n + j)] - lse[std::size_t(i)]);
        p[std::size_t(i * n + j)] = rounded(p_ij);
        const float p_for_d_s = eager ? float(p[std::size_t(i * n + j)]) : p_ij;
        d_s[std::size_t(i * n + j)] = rounded(p_for_d_s * (float(d_p) - row_dot[std::size_t(i)]));
      }
    }
    for (int64_t a = 0; a < n; ++a) {
      for (int64_t c = 0; c < d; ++c) {
        double dq = 0, dk = 0, dv = 0;
        for (int64_t b = 0; b < n; ++b) {
          dq += d_s[std::size_t(a * n + b)] * value(inputs.k, base + b * d + c);
          dk += d_s[std::size_t(b * n + a)] * value(inputs.q, base + b * d + c);
          dv += p[std::size_t(b * n + a)] * value(d_o, base + b * d + c);
        }
        const std::size_t at = std::size_t(base + a * d + c);
        out.dq[at] = stored(scale * dq);
        out.dk[at] = stored(scale * dk);
        out.dv[at] = stored(dv);
      }
    }
  }
  return out;
}

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

  TEST_CASE("bf16: its tolerance is bf16's, which an output rounded to bf16 passes with margin") {
    // A perfect kernel in bf16 stores the reference rounded to bf16 (8 significant bits): a
    // relative error near u/2 = 2^-9, far inside 4u of bf16 and far outside 4u of fp16.
    Shape shape{2, 3, 33, 64, attn::DType::bf16};
    const attn::HostTensors inputs = attn::make_inputs(shape, 21);
    for (__half value : inputs.q) {  // drawn as bf16 values: at most 8 significant bits
      REQUIRE(__half2float(value) == float(__half2float(attn::to_dtype(__half2float(value), attn::DType::bf16))));
    }
    const attn::Reference reference =
        attn::compute_reference(inputs, attn::slices_to_check(shape, CheckMode::full, 21));
    std::vector<__half> out(std::size_t(shape.elements()));
    const int64_t slice_size = shape.tokens * shape.head_dim;
    for (std::size_t w = 0; w < reference.slices.size(); ++w) {
      for (int64_t i = 0; i < slice_size; ++i) {
        out[reference.slices[w] * slice_size + i] =
            attn::to_dtype(float(reference.output[w][i]), attn::DType::bf16);
      }
    }
    const attn::CheckResult as_bf16 = attn::compare(inputs, reference, out);
    CHECK(as_bf16.passed);
    CHECK(as_bf16.relative_tolerance == attn::relative_tolerance(attn::DType::bf16));
    CHECK(as_bf16.relative_error < attn::relative_tolerance(attn::DType::bf16) / 2);
    // Every value 0.8% too large: within bf16's 4u (1.6%), outside fp16's (0.2%).
    for (__half& value : out) value = __float2half(__half2float(value) * 1.008f);
    CHECK(attn::compare(inputs, reference, out).passed);
    attn::HostTensors as_fp16 = inputs;
    as_fp16.shape.dtype = attn::DType::fp16;
    CHECK_FALSE(attn::compare(as_fp16, reference, out).passed);
  }

  TEST_CASE("every slice: an error in a slice the fp64 sample skips fails the all-slices part") {
    // The fp64 reference on the first slice only; the GPU reference's role played by the fp64
    // values of every slice, in fp32.
    Fixture f;
    const attn::Reference sampled = attn::compute_reference(f.inputs, {0});
    std::vector<float> all_slices(std::size_t(f.shape.elements()));
    const int64_t slice_size = f.shape.tokens * f.shape.head_dim;
    for (std::size_t w = 0; w < f.reference.slices.size(); ++w) {
      for (int64_t i = 0; i < slice_size; ++i) {
        all_slices[f.reference.slices[w] * slice_size + i] = float(f.reference.output[w][i]);
      }
    }
    std::vector<__half> out = f.perfect_output();
    const attn::CheckResult clean = attn::compare(f.inputs, sampled, out, all_slices);
    CHECK(clean.passed);
    CHECK(clean.checked_slices == 1);
    CHECK(clean.all_checked_slices == 6);
    CHECK(clean.all_relative_error < attn::kRelativeTolerance / 4);

    const int64_t index = (3 * f.shape.tokens + 7) * f.shape.head_dim + 2;  // slice 3, not sampled
    out[index] = __float2half(__half2float(out[index]) + 0.05f);
    CHECK(attn::compare(f.inputs, sampled, out).passed);  // the sample alone misses it
    const attn::CheckResult caught = attn::compare(f.inputs, sampled, out, all_slices);
    CHECK_FALSE(caught.passed);
    CHECK(caught.worst.find("slice 3, row 7, column 2") != std::string::npos);

    out = f.perfect_output();
    out[index] = __float2half(std::numeric_limits<float>::quiet_NaN());
    const attn::CheckResult nan = attn::compare(f.inputs, sampled, out, all_slices);
    CHECK_FALSE(nan.passed);
    CHECK(nan.nonfinite == 1);
  }

  TEST_CASE("gradients: perfect ones pass; one off in a slice the sample skips fails every-slice") {
    // The fp64 backward reference of every slice plays the GPU reference (in fp32), the sample
    // is slice 0 alone. Self-attention, and cross-attention with a key-padding mask (dK and dV
    // have N_k rows a slice, dQ N: each is read and named by its own rows).
    Shape cross{2, 2, 33, 64, attn::DType::fp16, 50};
    cross.key_padding = true;
    for (const Shape& shape : {Shape{2, 2, 33, 64}, cross}) {
      CAPTURE(shape.str());
      const attn::HostTensors inputs = attn::make_inputs(shape, 5);
      const std::vector<__half> d_o = attn::make_output_gradient(shape, 5);
      const attn::BackwardReference every = attn::compute_backward_reference(
          inputs, d_o, attn::slices_to_check(shape, CheckMode::full, 5));
      const attn::BackwardReference sampled = attn::compute_backward_reference(inputs, d_o, {0});
      const int64_t slice_sizes[] = {shape.tokens * shape.head_dim, shape.keys() * shape.head_dim,
                                     shape.keys() * shape.head_dim};
      std::vector<__half> gradients[3];
      attn::AllSliceGradients all;
      std::vector<float>* all_of[] = {&all.dq, &all.dk, &all.dv};
      std::vector<float>* all_bounds[] = {&all.dq_bound, &all.dk_bound, &all.dv_bound};
      const std::vector<double> attn::SliceGradients::*member[] = {
          &attn::SliceGradients::dq, &attn::SliceGradients::dk, &attn::SliceGradients::dv};
      const std::vector<double> attn::SliceGradients::*bound[] = {
          &attn::SliceGradients::dq_bound, &attn::SliceGradients::dk_bound, &attn::SliceGradients::dv_bound};
      for (int which = 0; which < 3; ++which) {
        const int64_t slice_size = slice_sizes[which];
        gradients[which].resize(std::size_t(shape.slices() * slice_size));
        all_of[which]->resize(gradients[which].size());
        all_bounds[which]->resize(gradients[which].size());
        for (std::size_t s = 0; s < every.slices.size(); ++s) {
          REQUIRE((every.gradients[s].*member[which]).size() == std::size_t(slice_size));
          for (int64_t i = 0; i < slice_size; ++i) {
            const std::size_t at = std::size_t(every.slices[s] * slice_size + i);
            const double value = (every.gradients[s].*member[which])[std::size_t(i)];
            gradients[which][at] = __float2half(float(value));
            (*all_of[which])[at] = float(value);
            (*all_bounds[which])[at] = float((every.gradients[s].*bound[which])[std::size_t(i)]);
          }
        }
      }
      const attn::CheckResult clean =
          attn::compare_gradients(shape, sampled, gradients[0], gradients[1], gradients[2], all);
      CHECK(clean.passed);
      CHECK(clean.elementwise);
      CHECK(clean.checked_slices == 1);
      CHECK(clean.all_checked_slices == 4);
      // Rounding to fp16 moves an element by at most u |x| + tau, which each bound holds.
      CHECK(clean.worst_bound_ratio <= 1.0);
      CHECK(clean.all_worst_bound_ratio <= 1.0);

      // dK of slice 3 (not sampled), key 3 (batch 1 keeps it), column 2.
      REQUIRE((!shape.key_padding || inputs.key_padding_mask[std::size_t(shape.keys() + 3)] == 0));
      const int64_t index = (3 * shape.keys() + 3) * shape.head_dim + 2;
      gradients[1][std::size_t(index)] = __float2half(__half2float(gradients[1][std::size_t(index)]) + 0.5f);
      CHECK(attn::compare_gradients(shape, sampled, gradients[0], gradients[1], gradients[2]).passed);
      const attn::CheckResult caught =
          attn::compare_gradients(shape, sampled, gradients[0], gradients[1], gradients[2], all);
      CHECK_FALSE(caught.passed);
      CHECK(caught.worst.find("dK") != std::string::npos);
      CHECK(caught.worst.find("slice 3, key 3, column 2") != std::string::npos);

      gradients[1][std::size_t(index)] = __float2half(std::numeric_limits<float>::quiet_NaN());
      const attn::CheckResult nan =
          attn::compare_gradients(shape, sampled, gradients[0], gradients[1], gradients[2], all);
      CHECK_FALSE(nan.passed);
      CHECK(nan.nonfinite == 1);

      // The last dQ element of the last slice: read at N rows a slice, named by its row.
      const double dk_value = every.gradients[3].dk[std::size_t(3 * shape.head_dim + 2)];
      gradients[1][std::size_t(index)] = __float2half(float(dk_value));
      REQUIRE(attn::compare_gradients(shape, sampled, gradients[0], gradients[1], gradients[2], all).passed);
      gradients[0].back() = __float2half(__half2float(gradients[0].back()) + 0.5f);
      const attn::CheckResult last =
          attn::compare_gradients(shape, sampled, gradients[0], gradients[1], gradients[2], all);
      CHECK_FALSE(last.passed);
      CHECK(last.worst.find("dQ") != std::string::npos);
      CHECK(last.worst.find("slice 3, row " + std::to_string(shape.tokens - 1) + ", column " +
                            std::to_string(shape.head_dim - 1)) != std::string::npos);
    }
  }

  TEST_CASE("gradients: simulated correct kernels pass at large scores and few keys; no D term fails") {
    // Scores with a standard deviation of 16 at N <= 5 saturate the softmax: dQ and dK are then
    // differences of rounded terms, thousands of u off relative to their own size for a correct
    // kernel (a relative tolerance fails it), yet within each element's bound.
    for (attn::DType dtype : {attn::DType::fp16, attn::DType::bf16}) {
      for (int64_t tokens : {1, 2, 3, 5, 17, 65}) {
        for (double qk_scale : {1.0, attn::kLargeScoreScale, attn::kStressScale}) {
          const Shape shape{1, 3, tokens, tokens % 2 ? 32 : 64, dtype};
          CAPTURE(shape.str());
          CAPTURE(qk_scale);
          const attn::HostTensors inputs = attn::make_inputs(shape, 11, qk_scale);
          const std::vector<__half> d_o = attn::make_output_gradient(shape, 11);
          const attn::BackwardReference reference = attn::compute_backward_reference(
              inputs, d_o, attn::slices_to_check(shape, CheckMode::full, 11));
          for (bool eager : {false, true}) {
            CAPTURE(eager);
            const SimulatedGradients kernel = simulated_backward(inputs, d_o, eager);
            const attn::CheckResult result =
                attn::compare_gradients(shape, reference, kernel.dq, kernel.dk, kernel.dv);
            INFO(result.worst);
            CHECK(result.passed);
            CHECK(result.worst_bound_ratio < 1.0);  // first order already holds it, in this model
          }
        }
      }
    }
    const Shape shape{1, 2, 64, 64};
    const attn::HostTensors inputs = attn::make_inputs(shape, 11);
    const std::vector<__half> d_o = attn::make_output_gradient(shape, 11);
    const attn::BackwardReference reference =
        attn::compute_backward_reference(inputs, d_o, attn::slices_to_check(shape, CheckMode::full, 11));
    const SimulatedGradients no_d_term = simulated_backward(inputs, d_o, false, false);
    const attn::CheckResult caught =
        attn::compare_gradients(shape, reference, no_d_term.dq, no_d_term.dk, no_d_term.dv);
    CHECK_FALSE(caught.passed);
    CHECK(caught.worst_bound_ratio > 10);  // not a near miss
  }

  TEST_CASE("the key-mask probe: strongly negative scores, V near 1, and a leaked key fails") {
    const Shape shape{1, 2, 40, 64};
    const attn::HostTensors inputs = attn::make_key_mask_probe_inputs(shape, 3);
    const attn::Reference reference =
        attn::compute_reference(inputs, attn::slices_to_check(shape, CheckMode::full, 3));
    double max_score = -1e30;
    for (int64_t j = 0; j < shape.tokens; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < shape.head_dim; ++c) {
        dot += double(__half2float(inputs.q[c])) * double(__half2float(inputs.k[j * shape.head_dim + c]));
      }
      max_score = std::max(max_score, dot / 8.0);
    }
    CHECK(max_score < -20.0);  // every real key of row 0 scores far below a padded key's 0
    // One zero-K, zero-V key admitted past N: its weight is ~1, so O is ~0 where it should be ~1.
    attn::HostTensors leaked = inputs;
    leaked.shape.tokens += 1;
    const int64_t slice_size = shape.tokens * shape.head_dim, leaked_size = leaked.shape.tokens * shape.head_dim;
    for (auto* tensor : {&leaked.q, &leaked.k, &leaked.v}) {
      tensor->assign(std::size_t(shape.slices() * leaked_size), __float2half(0.0f));
    }
    for (int64_t s = 0; s < shape.slices(); ++s) {
      for (int64_t i = 0; i < slice_size; ++i) {
        leaked.q[s * leaked_size + i] = inputs.q[s * slice_size + i];
        leaked.k[s * leaked_size + i] = inputs.k[s * slice_size + i];
        leaked.v[s * leaked_size + i] = inputs.v[s * slice_size + i];
      }
    }
    const attn::Reference wrong = attn::compute_reference(leaked, {0, 1});
    std::vector<__half> out(std::size_t(shape.elements()));
    for (int64_t s = 0; s < shape.slices(); ++s) {
      for (int64_t i = 0; i < slice_size; ++i) out[s * slice_size + i] = __float2half(float(wrong.output[s][i]));
    }
    const attn::CheckResult result = attn::compare(inputs, reference, out);
    CHECK_FALSE(result.passed);
    CHECK(result.max_abs_error > 0.5);  // not a near miss: the tolerance is ~7e-3
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
  TEST_CASE("L (the log-sum-exp): exact passes; off by more than the tolerance, or NaN, fails") {
    Fixture f;
    const int64_t rows = f.shape.slices() * f.shape.tokens;
    std::vector<float> step_rows(static_cast<std::size_t>(rows));
    for (std::size_t w = 0; w < f.reference.slices.size(); ++w) {
      for (int64_t row = 0; row < f.shape.tokens; ++row) {
        step_rows[std::size_t(f.reference.slices[w] * f.shape.tokens + row)] =
            float(f.reference.log_sum_exp[w][std::size_t(row)]);
      }
    }
    const std::vector<__half> out = f.perfect_output();
    auto check_rows = [&](const std::vector<float>& got, const std::vector<float>& all_rows) {
      attn::CheckResult result = attn::compare(f.inputs, f.reference, out);
      attn::compare_log_sum_exp(f.shape, f.reference, got, all_rows, result);
      return result;
    };
    const attn::CheckResult exact = check_rows(step_rows, step_rows);
    CHECK(exact.passed);
    CHECK(exact.log_sum_exp_rows == rows);
    CHECK(exact.log_sum_exp_max_error < attn::kLogSumExpTolerance / 100);  // fp32 rounding only

    std::vector<float> off = step_rows;
    off[std::size_t(4 * f.shape.tokens + 7)] += float(2 * attn::kLogSumExpTolerance);
    const attn::CheckResult caught = check_rows(off, {});
    CHECK_FALSE(caught.passed);
    CHECK(caught.worst.find("slice 4, row 7") != std::string::npos);

    // Only the GPU reference's rows cover a slice the CPU reference did not sample.
    const attn::Reference sampled = attn::compute_reference(f.inputs, {0});
    attn::CheckResult sample_only = attn::compare(f.inputs, sampled, out);
    attn::compare_log_sum_exp(f.shape, sampled, off, {}, sample_only);
    CHECK(sample_only.passed);
    attn::CheckResult all = attn::compare(f.inputs, sampled, out);
    attn::compare_log_sum_exp(f.shape, sampled, off, step_rows, all);
    CHECK_FALSE(all.passed);

    std::vector<float> nan = step_rows;
    nan[std::size_t(rows - 1)] = std::numeric_limits<float>::quiet_NaN();
    const attn::CheckResult nan_result = check_rows(nan, step_rows);
    CHECK_FALSE(nan_result.passed);
    CHECK(nan_result.worst.find("slice 5, row 32") != std::string::npos);
  }
}
