#include "backward_reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

namespace attn {
namespace {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;

// Query rows go in blocks: memory stays O(block * N), and dK and dV sum over the blocks.
constexpr int64_t kRowBlock = 256;

std::vector<double> as_doubles(const std::vector<__half>& tensor, int64_t offset, int64_t count) {
  std::vector<double> values(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = double(__half2float(tensor[offset + i]));
  return values;
}

}  // namespace

SliceGradients attention_backward(const std::vector<double>& q_values,
                                  const std::vector<double>& k_values,
                                  const std::vector<double>& v_values,
                                  const std::vector<double>& d_o_values, int64_t tokens,
                                  int64_t head_dim, double scale) {
  const ConstMap q(q_values.data(), tokens, head_dim), k(k_values.data(), tokens, head_dim),
      v(v_values.data(), tokens, head_dim), d_o(d_o_values.data(), tokens, head_dim);
  SliceGradients result;
  result.o.assign(std::size_t(tokens * head_dim), 0.0);
  result.log_sum_exp.assign(std::size_t(tokens), 0.0);
  result.dq.assign(std::size_t(tokens * head_dim), 0.0);
  RowMatrix dk = RowMatrix::Zero(tokens, head_dim), dv = RowMatrix::Zero(tokens, head_dim);
  for (int64_t begin = 0; begin < tokens; begin += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, tokens - begin);
    // The forward for these rows: S, L, P, O.
    RowMatrix p = (q.middleRows(begin, rows) * k.transpose()) * scale;
    for (int64_t r = 0; r < rows; ++r) {
      const double row_max = p.row(r).maxCoeff();
      const double row_sum = (p.row(r).array() - row_max).exp().sum();
      const double lse = row_max + std::log(row_sum);
      result.log_sum_exp[begin + r] = lse;
      p.row(r) = (p.row(r).array() - lse).exp().matrix();  // P = exp(S - L)
    }
    const RowMatrix o = p * v;
    Eigen::Map<RowMatrix>(result.o.data() + begin * head_dim, rows, head_dim) = o;
    // The backward for these rows.
    const auto d_o_rows = d_o.middleRows(begin, rows);
    dv += p.transpose() * d_o_rows;
    const RowMatrix d_p = d_o_rows * v.transpose();
    const Eigen::VectorXd row_dot = (d_o_rows.array() * o.array()).rowwise().sum();  // D
    const RowMatrix d_s = (p.array() * (d_p.colwise() - row_dot).array()).matrix();
    Eigen::Map<RowMatrix>(result.dq.data() + begin * head_dim, rows, head_dim) = scale * d_s * k;
    dk += scale * d_s.transpose() * q.middleRows(begin, rows);
  }
  result.dk.assign(dk.data(), dk.data() + dk.size());
  result.dv.assign(dv.data(), dv.data() + dv.size());
  return result;
}

std::vector<__half> make_output_gradient(const Shape& shape, uint64_t seed) {
  std::vector<__half> d_o(std::size_t(shape.elements()));
  parallel_for(int64_t(d_o.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) d_o[i] = to_dtype(normal_sample(seed, 4, uint64_t(i)), shape.dtype);
  });
  return d_o;
}

BackwardReference compute_backward_reference(const HostTensors& inputs,
                                             const std::vector<__half>& d_o,
                                             const std::vector<int64_t>& slices) {
  const int64_t n = inputs.shape.tokens, d = inputs.shape.head_dim;
  BackwardReference reference;
  reference.slices = slices;
  reference.gradients.resize(slices.size());
  parallel_for(int64_t(slices.size()), [&](int64_t begin, int64_t end) {
    for (int64_t which = begin; which < end; ++which) {
      const int64_t offset = slices[which] * n * d;
      reference.gradients[which] = attention_backward(
          as_doubles(inputs.q, offset, n * d), as_doubles(inputs.k, offset, n * d),
          as_doubles(inputs.v, offset, n * d), as_doubles(d_o, offset, n * d), n, d,
          1.0 / std::sqrt(double(d)));
    }
  });
  return reference;
}

}  // namespace attn
