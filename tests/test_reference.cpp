// The fp64 Eigen reference against the definition written as plain loops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_reference.hpp"
#include "inputs.hpp"

namespace {

using attn::HostTensors;
using attn::Shape;

double at(const std::vector<__half>& t, int64_t i) { return double(__half2float(t[i])); }

// Whether query i of a slice gives key j no weight: the key is padding (the inputs' key-padding
// mask, if any) or past the causal diagonal, written out here: top left, j > i; bottom right,
// j > i + N_k - N.
bool masked(const HostTensors& in, int64_t slice, int64_t i, int64_t j) {
  const attn::Causal causal = in.shape.causal;
  const int64_t offset = causal == attn::Causal::bottom_right ? in.shape.keys() - in.shape.tokens : 0;
  if (causal != attn::Causal::none && j > i + offset) return true;
  return !in.key_padding_mask.empty() &&
         in.key_padding_mask[std::size_t((slice / in.shape.heads) * in.shape.keys() + j)] != 0;
}

// softmax(Q K^T / sqrt(D)) V for one slice, straight from the formula (long double, stable):
// N query rows, N_k keys (as many unless the shape says otherwise).
std::vector<double> plain_attention(const HostTensors& in, int64_t slice) {
  const int64_t n = in.shape.tokens, n_k = in.shape.keys(), d = in.shape.head_dim;
  const int64_t base = slice * n * d, kv_base = slice * n_k * d;
  std::vector<double> out(n * d);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<long double> s(n_k);
    long double row_max = -INFINITY;
    for (int64_t j = 0; j < n_k; ++j) {
      long double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += at(in.q, base + i * d + c) * at(in.k, kv_base + j * d + c);
      s[j] = masked(in, slice, i, j) ? -INFINITY : dot / std::sqrt((long double)d);
      row_max = std::max(row_max, s[j]);
    }
    if (row_max == -INFINITY) continue;  // every key is masked: O stays 0
    long double sum = 0;
    for (int64_t j = 0; j < n_k; ++j) sum += (s[j] = std::exp(s[j] - row_max));
    for (int64_t c = 0; c < d; ++c) {
      long double o = 0;
      for (int64_t j = 0; j < n_k; ++j) o += s[j] / sum * at(in.v, kv_base + j * d + c);
      out[i * d + c] = double(o);
    }
  }
  return out;
}

// L = log(sum_j exp(s_j)) of each row of one slice, straight from the formula (long double).
std::vector<double> plain_log_sum_exp(const HostTensors& in, int64_t slice) {
  const int64_t n = in.shape.tokens, n_k = in.shape.keys(), d = in.shape.head_dim;
  const int64_t base = slice * n * d, kv_base = slice * n_k * d;
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    long double sum = 0;
    for (int64_t j = 0; j < n_k; ++j) {
      long double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += at(in.q, base + i * d + c) * at(in.k, kv_base + j * d + c);
      if (!masked(in, slice, i, j)) sum += std::exp(dot / std::sqrt((long double)d));  // no overflow in long double
    }
    out[i] = double(std::log(sum));
  }
  return out;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST_SUITE("reference") {
  TEST_CASE("matches plain loops on random shapes, N = 1 and tails included") {
    const attn::DType fp16 = attn::DType::fp16;
    const Shape shapes[] = {{1, 1, 1, 64}, {1, 2, 2, 32}, {2, 1, 17, 64}, {1, 1, 65, 80},
                            {2, 2, 300, 128}, {1, 1, 257, 64},
                            // cross-attention: fewer keys than queries, more, and one
                            {2, 1, 65, 64, fp16, 17}, {1, 2, 17, 32, fp16, 300}, {2, 2, 9, 64, fp16, 1}};
    for (const Shape& shape : shapes) {
      CAPTURE(shape.str());
      const HostTensors inputs = attn::make_inputs(shape, 7);
      const attn::Reference reference =
          attn::compute_reference(inputs, {0, shape.slices() - 1});
      CHECK(max_difference(reference.output[0], plain_attention(inputs, 0)) < 1e-12);
      CHECK(max_difference(reference.output[1], plain_attention(inputs, shape.slices() - 1)) < 1e-12);
      CHECK(max_difference(reference.log_sum_exp[0], plain_log_sum_exp(inputs, 0)) < 1e-12);
      CHECK(max_difference(reference.log_sum_exp[1], plain_log_sum_exp(inputs, shape.slices() - 1)) < 1e-12);
    }
  }

  TEST_CASE("a key-padding mask: padded keys get no weight; a row with none left is O = 0, L = -inf") {
    for (Shape shape : {Shape{3, 2, 17, 64}, Shape{2, 1, 65, 32, attn::DType::fp16, 130}}) {
      shape.key_padding = true;
      CAPTURE(shape.str());
      HostTensors inputs = attn::make_inputs(shape, 9);
      REQUIRE(inputs.key_padding_mask.size() == std::size_t(shape.batch * shape.keys()));
      int64_t padding = 0;
      for (uint8_t value : inputs.key_padding_mask) padding += value;
      CHECK(padding > 0);  // the drawn mask pads something
      CHECK(inputs.key_padding_mask[0] == 0);  // and keeps key 0 of every batch element
      std::fill(inputs.key_padding_mask.begin(), inputs.key_padding_mask.begin() + shape.keys(), 1);
      const int64_t last = shape.slices() - 1;  // batch 0 is all padding now, the last is not
      const attn::Reference reference = attn::compute_reference(inputs, {0, last});
      CHECK(max_difference(reference.output[1], plain_attention(inputs, last)) < 1e-12);
      CHECK(max_difference(reference.log_sum_exp[1], plain_log_sum_exp(inputs, last)) < 1e-12);
      for (double value : reference.output[0]) CHECK(value == 0.0);
      for (double value : reference.log_sum_exp[0]) CHECK(value == -INFINITY);
    }
  }

  TEST_CASE("a causal mask, both alignments, with and without padding: as plain loops") {
    const attn::DType fp16 = attn::DType::fp16;
    for (attn::Causal align : {attn::Causal::top_left, attn::Causal::bottom_right}) {
      for (Shape shape : {Shape{2, 1, 17, 64}, Shape{1, 2, 65, 32, fp16, 17}, Shape{1, 1, 17, 64, fp16, 65},
                          Shape{2, 2, 9, 64, fp16, 1}}) {
        for (bool padding : {false, true}) {
          shape.causal = align;
          shape.key_padding = padding;
          CAPTURE(shape.str());
          const HostTensors inputs = attn::make_inputs(shape, 13);
          const int64_t last = shape.slices() - 1;
          const attn::Reference reference = attn::compute_reference(inputs, {0, last});
          CHECK(max_difference(reference.output[0], plain_attention(inputs, 0)) < 1e-12);
          CHECK(max_difference(reference.output[1], plain_attention(inputs, last)) < 1e-12);
          CHECK(max_difference(reference.log_sum_exp[1], plain_log_sum_exp(inputs, last)) < 1e-12);
          // Top left, query 0 sees key 0 alone: O is V's row 0. Bottom right with N > N_k, the
          // first N - N_k rows see nothing: O = 0, L = -inf.
          if (align == attn::Causal::top_left && !padding) {
            for (int64_t c = 0; c < shape.head_dim; ++c) CHECK(reference.output[0][c] == at(inputs.v, c));
          }
          const int64_t blind = align == attn::Causal::bottom_right ? shape.tokens - shape.keys() : 0;
          for (int64_t i = 0; i < blind; ++i) {
            CHECK(reference.log_sum_exp[0][i] == -INFINITY);
            for (int64_t c = 0; c < shape.head_dim; ++c) CHECK(reference.output[0][i * shape.head_dim + c] == 0.0);
          }
        }
      }
    }
  }

  TEST_CASE("a causal mask's FLOPs count the pairs on or below the diagonal") {
    for (attn::Causal align : {attn::Causal::top_left, attn::Causal::bottom_right}) {
      for (auto [n, n_k] : {std::pair<int64_t, int64_t>{1, 1}, {17, 17}, {65, 17}, {17, 65}, {9, 1}, {300, 1050}}) {
        Shape shape{1, 1, n, 64, attn::DType::fp16, n_k};
        shape.causal = align;
        CAPTURE(shape.str());
        int64_t pairs = 0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n_k; ++j) pairs += shape.sees(i, j) ? 1 : 0;
        }
        CHECK(shape.visible_pairs() == double(pairs));
      }
    }
    CHECK(Shape{1, 1, 4096, 64}.visible_pairs() == 4096.0 * 4096.0);
  }

  TEST_CASE("L of equal scores is log N, and L holds where exp of a score overflows") {
    // Q = 0: every score is 0, so L = log(N) exactly.
    HostTensors zeros = attn::make_inputs({1, 1, 37, 64}, 3);
    for (__half& value : zeros.q) value = __float2half(0.0f);
    const attn::Reference equal = attn::compute_reference(zeros, {0});
    for (double value : equal.log_sum_exp[0]) CHECK(value == doctest::Approx(std::log(37.0)).epsilon(1e-15));
    // The stress inputs: scores past 88.8, whose exp overflows fp32; the shifted sum keeps L.
    const HostTensors stress = attn::make_inputs({1, 1, 64, 64}, 11, attn::kStressScale);
    const attn::Reference reference = attn::compute_reference(stress, {0});
    CHECK(max_difference(reference.log_sum_exp[0], plain_log_sum_exp(stress, 0)) < 1e-9);
  }

  TEST_CASE("one token: the output is that token's V row") {
    const HostTensors inputs = attn::make_inputs({1, 1, 1, 64}, 3);
    const std::vector<double> out = attn::reference_slice(inputs, 0);
    for (int c = 0; c < 64; ++c) CHECK(out[c] == at(inputs.v, c));
  }

  TEST_CASE("stable under large logits, where an unshifted softmax overflows") {
    const Shape shape{1, 1, 64, 64};
    const HostTensors inputs = attn::make_inputs(shape, 11, attn::kStressScale);
    const std::vector<double> out = attn::reference_slice(inputs, 0);
    for (double value : out) REQUIRE(std::isfinite(value));
    CHECK(max_difference(out, plain_attention(inputs, 0)) < 1e-9);

    // The point of the stress case: some scores are so large that exp() of an unshifted
    // score overflows fp32, so a kernel that skips the row maximum produces Inf/NaN.
    double largest_score = 0;
    for (int64_t j = 0; j < 64; ++j) {
      double dot = 0;
      for (int c = 0; c < 64; ++c) dot += at(inputs.q, c) * at(inputs.k, j * 64 + c);
      largest_score = std::max(largest_score, dot / 8.0);
    }
    CHECK(largest_score > 88.8);  // exp(88.8) overflows fp32
  }

  TEST_CASE("each output lies inside the range of its V column (convex combination)") {
    const Shape shape{1, 1, 50, 32};
    const HostTensors inputs = attn::make_inputs(shape, 5);
    const std::vector<double> out = attn::reference_slice(inputs, 0);
    for (int c = 0; c < 32; ++c) {
      double lo = INFINITY, hi = -INFINITY;
      for (int j = 0; j < 50; ++j) {
        lo = std::min(lo, at(inputs.v, j * 32 + c));
        hi = std::max(hi, at(inputs.v, j * 32 + c));
      }
      for (int i = 0; i < 50; ++i) {
        CHECK(out[i * 32 + c] >= lo - 1e-12);
        CHECK(out[i * 32 + c] <= hi + 1e-12);
      }
    }
  }

  TEST_CASE("inputs are seeded, never zero, and roughly standard normal") {
    const Shape shape{2, 3, 40, 64};
    const HostTensors a = attn::make_inputs(shape, 42), b = attn::make_inputs(shape, 42),
                      c = attn::make_inputs(shape, 43);
    double sum = 0, sum_sq = 0;
    int zeros = 0;
    bool differs = false;
    for (std::size_t i = 0; i < a.q.size(); ++i) {
      REQUIRE(__half2float(a.q[i]) == __half2float(b.q[i]));
      differs = differs || __half2float(a.q[i]) != __half2float(c.q[i]);
      const double x = at(a.v, int64_t(i));
      zeros += x == 0;
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / double(a.v.size()), var = sum_sq / double(a.v.size()) - mean * mean;
    CHECK(differs);
    CHECK(zeros < 10);
    CHECK(std::fabs(mean) < 0.05);
    CHECK(std::fabs(var - 1.0) < 0.05);
  }
}
