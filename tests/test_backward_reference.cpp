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
            const std::vector<double>& d_o, int64_t n, int64_t d, double scale) {
  const std::vector<double> o = attn::attention_backward(q, k, v, d_o, n, d, scale).o;
  double total = 0;
  for (std::size_t i = 0; i < o.size(); ++i) total += d_o[i] * o[i];
  return total;
}

// dQ, dK, dV straight from the formula (long double): P from the scores, not from L.
struct PlainGradients {
  std::vector<double> dq, dk, dv;
};
PlainGradients plain_backward(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& d_o,
                              int64_t n, int64_t d, double scale) {
  std::vector<std::vector<long double>> p(n, std::vector<long double>(n)), ds = p;
  for (int64_t i = 0; i < n; ++i) {
    long double row_max = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      long double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += (long double)q[i * d + c] * k[j * d + c];
      p[i][j] = dot * scale;
      row_max = std::max(row_max, p[i][j]);
    }
    for (int64_t j = 0; j < n; ++j) sum += (p[i][j] = std::exp(p[i][j] - row_max));
    for (int64_t j = 0; j < n; ++j) p[i][j] /= sum;
    // dS_ij = P_ij (dP_ij - sum_l P_il dP_il), dP_ij = dO_i . V_j
    std::vector<long double> d_p(n);
    long double weighted = 0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < d; ++c) d_p[j] += (long double)d_o[i * d + c] * v[j * d + c];
      weighted += p[i][j] * d_p[j];
    }
    for (int64_t j = 0; j < n; ++j) ds[i][j] = p[i][j] * (d_p[j] - weighted);
  }
  PlainGradients g{std::vector<double>(n * d), std::vector<double>(n * d), std::vector<double>(n * d)};
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t c = 0; c < d; ++c) {
      long double dq = 0, dk = 0, dv = 0;
      for (int64_t b = 0; b < n; ++b) {
        dq += ds[a][b] * k[b * d + c];
        dk += ds[b][a] * q[b * d + c];
        dv += p[b][a] * d_o[b * d + c];
      }
      g.dq[a * d + c] = double(dq * scale);
      g.dk[a * d + c] = double(dk * scale);
      g.dv[a * d + c] = double(dv);
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
    const int64_t n = 5, d = 8;
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<double> q = random_values(n * d, 3, 1), k = random_values(n * d, 3, 2),
                        v = random_values(n * d, 3, 3);
    const std::vector<double> d_o = random_values(n * d, 3, 4);
    const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, n, d, scale);
    const double h = 1e-5;
    for (auto [name, tensor, gradient] :
         {std::tuple<const char*, std::vector<double>*, const std::vector<double>*>{"q", &q, &g.dq},
          {"k", &k, &g.dk}, {"v", &v, &g.dv}}) {
      for (int64_t i = 0; i < n * d; ++i) {
        CAPTURE(name);
        CAPTURE(i);
        const double kept = (*tensor)[i];
        (*tensor)[i] = kept + h;
        const double up = loss(q, k, v, d_o, n, d, scale);
        (*tensor)[i] = kept - h;
        const double down = loss(q, k, v, d_o, n, d, scale);
        (*tensor)[i] = kept;
        // Central differences err by O(h^2) and by rounding of about 1e-16 / h: 1e-8 bounds both.
        CHECK(std::fabs((up - down) / (2 * h) - (*gradient)[i]) < 1e-8);
      }
    }
  }

  TEST_CASE("matches the formula as plain loops, N = 1 and tails past a row block included") {
    for (const auto& [n, d] : {std::pair<int64_t, int64_t>{1, 8}, {17, 16}, {65, 32}, {300, 16}}) {
      CAPTURE(n);
      const double scale = 1.0 / std::sqrt(double(d));
      const std::vector<double> q = random_values(n * d, 5, 1), k = random_values(n * d, 5, 2),
                                v = random_values(n * d, 5, 3), d_o = random_values(n * d, 5, 4);
      const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, n, d, scale);
      const PlainGradients plain = plain_backward(q, k, v, d_o, n, d, scale);
      CHECK(max_difference(g.dq, plain.dq) < 1e-12);
      CHECK(max_difference(g.dk, plain.dk) < 1e-12);
      CHECK(max_difference(g.dv, plain.dv) < 1e-12);
    }
  }

  TEST_CASE("one token: dV is dO, and dQ and dK are zero (a softmax of one score is constant)") {
    const int64_t d = 8;
    const std::vector<double> q = random_values(d, 7, 1), k = random_values(d, 7, 2),
                              v = random_values(d, 7, 3), d_o = random_values(d, 7, 4);
    const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, 1, d, 0.3);
    CHECK(max_difference(g.dv, d_o) == 0.0);
    CHECK(max_difference(g.dq, std::vector<double>(d, 0.0)) < 1e-15);
    CHECK(max_difference(g.dk, std::vector<double>(d, 0.0)) < 1e-15);
  }

  TEST_CASE("the rows of dK sum to zero: moving every key by one vector leaves each row's softmax") {
    const int64_t n = 65, d = 16;
    const std::vector<double> q = random_values(n * d, 9, 1), k = random_values(n * d, 9, 2),
                              v = random_values(n * d, 9, 3), d_o = random_values(n * d, 9, 4);
    const attn::SliceGradients g = attn::attention_backward(q, k, v, d_o, n, d, 0.25);
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
    const attn::Shape shape{2, 3, 65, 64};
    const attn::HostTensors inputs = attn::make_inputs(shape, 11);
    const std::vector<__half> d_o = attn::make_output_gradient(shape, 11);
    const std::vector<int64_t> slices{0, 5};
    const attn::BackwardReference backward = attn::compute_backward_reference(inputs, d_o, slices);
    const attn::Reference forward = attn::compute_reference(inputs, slices);
    for (std::size_t i = 0; i < slices.size(); ++i) {
      CHECK(max_difference(backward.gradients[i].o, forward.output[i]) < 1e-12);
      CHECK(max_difference(backward.gradients[i].log_sum_exp, forward.log_sum_exp[i]) < 1e-12);
    }
    bool any_nonzero = false;  // dO is drawn from its own stream: never all zero
    for (__half value : d_o) any_nonzero |= __half2float(value) != 0.0f;
    CHECK(any_nonzero);
  }
}
