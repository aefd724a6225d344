// The fp64 backward reference against finite differences, against the formula written as plain
// loops, and against properties every correct backward has.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backward_reference.hpp"
#include "cpu_reference.hpp"
#include "inputs.hpp"

namespace {

std::vector<double> random_values(int64_t count, uint64_t seed, uint64_t stream) {
  std::vector<double> values(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = attn::normal_sample(seed, stream, uint64_t(i));
  return values;
}

// The loss whose gradients the backward returns: sum(dO o O), O from the same function.
double loss(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
            const std::vector<double>& d_o, const attn::Shape& slice, double scale,
            const uint8_t* key_padding = nullptr) {
  const std::vector<double> o = attn::attention_backward(q, k, v, d_o, slice, scale, key_padding).o;
  double total = 0;
  for (std::size_t i = 0; i < o.size(); ++i) total += d_o[i] * o[i];
  return total;
}

// dQ, dK, dV straight from the formula (long double): P from the scores, not from L, over the
// keys each row sees (the slice's causal mask, the padding); a row that sees none has P = 0.
struct PlainGradients {
  std::vector<double> dq, dk, dv;
};
PlainGradients plain_backward(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& d_o,
                              const attn::Shape& slice, double scale,
                              const uint8_t* key_padding = nullptr) {
  const int64_t n = slice.tokens, keys = slice.keys(), d = slice.head_dim;
  auto sees = [&](int64_t i, int64_t j) {
    return slice.sees(i, j) && (key_padding == nullptr || key_padding[j] == 0);
  };
  std::vector<std::vector<long double>> p(n, std::vector<long double>(keys, 0.0L)), ds = p;
  for (int64_t i = 0; i < n; ++i) {
    long double row_max = -INFINITY, sum = 0;
    for (int64_t j = 0; j < keys; ++j) {
      if (!sees(i, j)) continue;
      long double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += (long double)q[i * d + c] * k[j * d + c];
      p[i][j] = dot * scale;
      row_max = std::max(row_max, p[i][j]);
    }
    if (row_max == -INFINITY) continue;  // no key: P, and so dS, stay 0
    for (int64_t j = 0; j < keys; ++j) sum += (p[i][j] = sees(i, j) ? std::exp(p[i][j] - row_max) : 0.0L);
    for (int64_t j = 0; j < keys; ++j) p[i][j] /= sum;
    // dS_ij = P_ij (dP_ij - sum_l P_il dP_il), dP_ij = dO_i . V_j
    std::vector<long double> d_p(keys);
    long double weighted = 0;
    for (int64_t j = 0; j < keys; ++j) {
      for (int64_t c = 0; c < d; ++c) d_p[j] += (long double)d_o[i * d + c] * v[j * d + c];
      weighted += p[i][j] * d_p[j];
    }
    for (int64_t j = 0; j < keys; ++j) ds[i][j] = p[i][j] * (d_p[j] - weighted);
  }
  PlainGradients g{std::vector<double>(n * d), std::vector<double>(keys * d), std::vector<double>(keys * d)};
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t i = 0; i < n; ++i) {
      long double dq = 0;
      for (int64_t j = 0; j < keys; ++j) dq += ds[i][j] * k[j * d + c];
      g.dq[i * d + c] = double(dq * scale);
    }
    for (int64_t j = 0; j < keys; ++j) {
      long double dk = 0, dv = 0;
      for (int64_t i = 0; i < n; ++i) {
        dk += ds[i][j] * q[i * d + c];
        dv += p[i][j] * d_o[i * d + c];
      }
      g.dk[j * d + c] = double(dk * scale);
      g.dv[j * d + c] = double(dv);
    }
  }
  return g;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST_SUITE("backward_reference") {
  TEST_CASE("every gradient matches central finite differences of sum(dO o O)") {
    // Self-attention; then 5 queries over 7 keys, bottom-right causal (rows 0 and 1 see keys up
    // to 2 and 3) with key 4 padding: the masked scores are constants, so the gradients are the
    // same function's.
    const uint8_t padding[7] = {0, 0, 0, 0, 1, 0, 0};
    const attn::Shape self{1, 1, 5, 8}, cross{1, 1, 5, 8, attn::DType::fp16, 7, true, attn::Causal::bottom_right};
    for (const auto& [slice, key_padding] : {std::pair<attn::Shape, const uint8_t*>{self, nullptr}, {cross, padding}}) {
      const int64_t n = slice.tokens, keys = slice.keys(), d = slice.head_dim;
      CAPTURE(keys);
      const double scale = 1.0 / std::sqrt(double(d));
      std::vector<double> q = random_values(n * d, 3, 1), k = random_values(keys * d, 3, 2),
                          v = random_values(keys * d, 3, 3);
      const std::vector<double> d_o = random_values(n * d, 3, 4);
      const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, slice, scale, key_padding);
      const double h = 1e-5;
      for (auto [name, tensor, gradient] :
           {std::tuple<const char*, std::vector<double>*, const std::vector<double>*>{"q", &q, &g.dq},
            {"k", &k, &g.dk}, {"v", &v, &g.dv}}) {
        for (std::size_t i = 0; i < tensor->size(); ++i) {
          CAPTURE(name);
          CAPTURE(i);
          const double kept = (*tensor)[i];
          (*tensor)[i] = kept + h;
          const double up = loss(q, k, v, d_o, slice, scale, key_padding);
          (*tensor)[i] = kept - h;
          const double down = loss(q, k, v, d_o, slice, scale, key_padding);
          (*tensor)[i] = kept;
          // Central differences err by O(h^2) and by rounding of about 1e-16 / h: 1e-8 bounds both.
          CHECK(std::fabs((up - down) / (2 * h) - (*gradient)[i]) < 1e-8);
        }
      }
    }
  }

  TEST_CASE("matches the formula as plain loops, N = 1 and tails past a row block included") {
    for (const auto& [n, d] : {std::pair<int64_t, int64_t>{1, 8}, {17, 16}, {65, 32}, {300, 16}}) {
      CAPTURE(n);
      const double scale = 1.0 / std::sqrt(double(d));
      const std::vector<double> q = random_values(n * d, 5, 1), k = random_values(n * d, 5, 2),
                                v = random_values(n * d, 5, 3), d_o = random_values(n * d, 5, 4);
      const attn::Shape slice{1, 1, n, d};
      const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, slice, scale);
      const PlainGradients plain = plain_backward(q, k, v, d_o, slice, scale);
      CHECK(max_difference(g.dq, plain.dq) < 1e-12);
      CHECK(max_difference(g.dk, plain.dk) < 1e-12);
      CHECK(max_difference(g.dv, plain.dv) < 1e-12);
    }
  }

  TEST_CASE("the plain loops again: N_k != N, both causal alignments, a key-padding mask") {
    const int64_t d = 16;
    const double scale = 1.0 / std::sqrt(double(d));
    for (const auto& [n, keys] : {std::pair<int64_t, int64_t>{17, 40}, {40, 17}, {300, 65}}) {
      std::vector<uint8_t> padding(static_cast<std::size_t>(keys));
      for (int64_t j = 0; j < keys; ++j) padding[j] = j % 3 == 1 || j == keys - 1;
      for (attn::Causal causal : {attn::Causal::none, attn::Causal::top_left, attn::Causal::bottom_right}) {
        for (const uint8_t* key_padding : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(padding.data())}) {
          CAPTURE(n);
          CAPTURE(keys);
          CAPTURE(int(causal));
          CAPTURE(key_padding != nullptr);
          const attn::Shape slice{1, 1, n, d, attn::DType::fp16, keys, key_padding != nullptr, causal};
          const std::vector<double> q = random_values(n * d, 6, 1), k = random_values(keys * d, 6, 2),
                                    v = random_values(keys * d, 6, 3), d_o = random_values(n * d, 6, 4);
          const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, slice, scale, key_padding);
          const PlainGradients plain = plain_backward(q, k, v, d_o, slice, scale, key_padding);
          REQUIRE(g.dk.size() == std::size_t(keys * d));
          CHECK(max_difference(g.dq, plain.dq) < 1e-12);
          CHECK(max_difference(g.dk, plain.dk) < 1e-12);
          CHECK(max_difference(g.dv, plain.dv) < 1e-12);
        }
      }
    }
  }

  TEST_CASE("a row that sees no key: O = 0, L = -inf, zero gradients and no NaN; a padded key: dK = dV = 0") {
    // 6 queries over 4 keys, bottom right: row i sees keys j <= i - 2, so rows 0 and 1 see none;
    // key 3 is padding, so no row sees it.
    const int64_t n = 6, keys = 4, d = 8;
    const uint8_t padding[keys] = {0, 0, 0, 1};
    const attn::Shape slice{1, 1, n, d, attn::DType::fp16, keys, true, attn::Causal::bottom_right};
    const std::vector<double> q = random_values(n * d, 8, 1), k = random_values(keys * d, 8, 2),
                              v = random_values(keys * d, 8, 3), d_o = random_values(n * d, 8, 4);
    const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, slice, 0.35, padding);
    for (int64_t row : {0, 1}) {
      CHECK(g.log_sum_exp[row] == -INFINITY);
      for (int64_t c = 0; c < d; ++c) {
        CHECK(g.o[row * d + c] == 0.0);
        CHECK(g.dq[row * d + c] == 0.0);
      }
    }
    CHECK(std::isfinite(g.log_sum_exp[2]));
    for (int64_t c = 0; c < d; ++c) {
      CHECK(g.dk[3 * d + c] == 0.0);
      CHECK(g.dv[3 * d + c] == 0.0);
    }
    for (const std::vector<double>* values : {&g.o, &g.dq, &g.dk, &g.dv, &g.dq_bound, &g.dk_bound, &g.dv_bound}) {
      for (double value : *values) CHECK(std::isfinite(value));
    }
    // Only rows that see a key reach dK and dV: the gradients equal those of the rows 2..5 alone.
    const PlainGradients plain = plain_backward(q, k, v, d_o, slice, 0.35, padding);
    CHECK(max_difference(g.dk, plain.dk) < 1e-12);
    CHECK(max_difference(g.dv, plain.dv) < 1e-12);
  }

  TEST_CASE("one token: dV is dO, and dQ and dK are zero (a softmax of one score is constant)") {
    const int64_t d = 8;
    const std::vector<double> q = random_values(d, 7, 1), k = random_values(d, 7, 2),
                              v = random_values(d, 7, 3), d_o = random_values(d, 7, 4);
    const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, attn::Shape{1, 1, 1, d}, 0.3);
    CHECK(max_difference(g.dv, d_o) == 0.0);
    CHECK(max_difference(g.dq, std::vector<double>(d, 0.0)) < 1e-15);
    CHECK(max_difference(g.dk, std::vector<double>(d, 0.0)) < 1e-15);
  }

  TEST_CASE("the rows of dK sum to zero: moving every key by one vector leaves each row's softmax") {
    const int64_t n = 65, d = 16;
    const std::vector<double> q = random_values(n * d, 9, 1), k = random_values(n * d, 9, 2),
                              v = random_values(n * d, 9, 3), d_o = random_values(n * d, 9, 4);
    const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, attn::Shape{1, 1, n, d}, 0.25);
    for (int64_t c = 0; c < d; ++c) {
      double column = 0, size = 0;
      for (int64_t j = 0; j < n; ++j) {
        column += g.dk[j * d + c];
        size += std::fabs(g.dk[j * d + c]);
      }
      CHECK(std::fabs(column) < 1e-12 * size);
    }
  }

  TEST_CASE("on the fp16 test inputs: O and L are the forward reference's") {
    // Self-attention, and DETR's kind of call: N_k != N with a key-padding mask (causal too).
    for (const attn::Shape& shape :
         {attn::Shape{2, 3, 65, 64},
          attn::Shape{2, 3, 65, 64, attn::DType::fp16, 77, true, attn::Causal::bottom_right}}) {
      CAPTURE(shape.str());
      const attn::HostTensors inputs = attn::make_inputs(shape, 11);
      const std::vector<__half> d_o = attn::make_output_gradient(shape, 11);
      const std::vector<int64_t> slices{0, 5};
      const attn::BackwardReference backward = attn::compute_backward_reference(inputs, d_o, slices);
      const attn::Reference forward = attn::compute_reference(inputs, slices);
      for (std::size_t i = 0; i < slices.size(); ++i) {
        CHECK(max_difference(backward.gradients[i].o, forward.output[i]) < 1e-12);
        CHECK(max_difference(backward.gradients[i].log_sum_exp, forward.log_sum_exp[i]) < 1e-12);
        CHECK(backward.gradients[i].dk.size() == std::size_t(shape.keys() * shape.head_dim));
      }
      bool any_nonzero = false;  // dO is drawn from its own stream: never all zero
      for (__half value : d_o) any_nonzero |= __half2float(value) != 0.0f;
      CHECK(any_nonzero);
    }
  }
}
