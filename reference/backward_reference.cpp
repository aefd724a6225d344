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

Rounding rounding_of(DType dtype) {
  return {unit_roundoff(dtype), dtype == DType::bf16 ? 0x1.0p-134 : 0x1.0p-25, 0x1.0p-25, 0x1.0p-23};
}

SliceGradients attention_backward(const std::vector<double>& q_values,
                                  const std::vector<double>& k_values,
                                  const std::vector<double>& v_values,
                                  const std::vector<double>& d_o_values, const Shape& slice,
                                  double scale, const uint8_t* key_padding) {
  const int64_t tokens = slice.tokens, keys = slice.keys(), head_dim = slice.head_dim;
  const ConstMap q(q_values.data(), tokens, head_dim), k(k_values.data(), keys, head_dim),
      v(v_values.data(), keys, head_dim), d_o(d_o_values.data(), tokens, head_dim);
  const Rounding r = rounding_of(slice.dtype);
  const double n = double(std::max(tokens, keys)), d = double(head_dim);
  const RowMatrix abs_q = q.cwiseAbs(), abs_k = k.cwiseAbs(), abs_v = v.cwiseAbs();
  SliceGradients result;
  result.o.assign(std::size_t(tokens * head_dim), 0.0);
  result.log_sum_exp.assign(std::size_t(tokens), 0.0);
  result.dq.assign(std::size_t(tokens * head_dim), 0.0);
  result.dq_bound.assign(std::size_t(tokens * head_dim), 0.0);
  RowMatrix dk = RowMatrix::Zero(keys, head_dim), dv = RowMatrix::Zero(keys, head_dim);
  RowMatrix dk_bound = RowMatrix::Zero(keys, head_dim), dv_bound = RowMatrix::Zero(keys, head_dim);
  for (int64_t begin = 0; begin < tokens; begin += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, tokens - begin);
    // The forward for these rows: S, L, P, O.
    RowMatrix p = (q.middleRows(begin, rows) * k.transpose()) * scale;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < keys; ++j) {
        const bool padded = key_padding != nullptr && key_padding[j] != 0;
        if (padded || !slice.sees(begin + r, j)) p(r, j) = -INFINITY;  // exp(-inf - L) = 0 below
      }
      const double row_max = p.row(r).maxCoeff();
      if (row_max == -INFINITY) {  // no key: O = 0, L = -inf, P = 0 (not exp(-inf + inf))
        result.log_sum_exp[begin + r] = -INFINITY;
        p.row(r).setZero();
        continue;
      }
      const double row_sum = (p.row(r).array() - row_max).exp().sum();
      const double lse = row_max + std::log(row_sum);
      result.log_sum_exp[begin + r] = lse;
      // P = exp(S - L), and exactly 0 for a key the row does not see (Eigen's vectorised exp
      // gives about 1e-308 for -inf, not 0)
      p.row(r) = (p.row(r).array() == -INFINITY).select(0.0, (p.row(r).array() - lse).exp()).matrix();
    }
    const RowMatrix o = p * v;
    Eigen::Map<RowMatrix>(result.o.data() + begin * head_dim, rows, head_dim) = o;
    // The backward for these rows.
    const auto d_o_rows = d_o.middleRows(begin, rows);
    dv += p.transpose() * d_o_rows;
    const RowMatrix d_p = d_o_rows * v.transpose();
    const Eigen::VectorXd row_dot = (d_o_rows.array() * o.array()).rowwise().sum();  // D
    const RowMatrix d_p_minus_d = d_p.colwise() - row_dot;
    const RowMatrix d_s = (p.array() * d_p_minus_d.array()).matrix();
    const RowMatrix dq_rows = scale * d_s * k;
    Eigen::Map<RowMatrix>(result.dq.data() + begin * head_dim, rows, head_dim) = dq_rows;
    dk += scale * d_s.transpose() * q.middleRows(begin, rows);

    // The bounds for these rows (backward_reference.hpp gives the terms).
    const RowMatrix abs_q_rows = abs_q.middleRows(begin, rows);
    const RowMatrix abs_d_o_rows = d_o_rows.cwiseAbs();
    const RowMatrix sigma = scale * abs_q_rows * abs_k.transpose();
    const Eigen::VectorXd sigma_max = sigma.rowwise().maxCoeff();
    const RowMatrix rho = (d * r.fp32) * (sigma.colwise() + sigma_max);
    const RowMatrix p_error = ((p.array() * (rho.array() + r.u)) + r.tau).matrix();
    const RowMatrix w = (p_error.array() + (n * r.fp32) * p.array()).matrix();
    const RowMatrix o_error = ((w * abs_v).array() + r.u * o.cwiseAbs().array() + r.tau).matrix();
    const Eigen::VectorXd d_error =
        (abs_d_o_rows.array() * o_error.array()).rowwise().sum() +
        (d * r.fp32) * (abs_d_o_rows.array() * o.cwiseAbs().array()).rowwise().sum();
    const RowMatrix d_p_error = (d * r.fp32) * abs_d_o_rows * abs_v.transpose();
    const RowMatrix d_s_error =
        (p_error.array() * d_p_minus_d.cwiseAbs().array() +
         p.array() * (d_p_error.colwise() + d_error).array() +
         (r.u + n * r.fp32) * d_s.cwiseAbs().array() + r.tau)
            .matrix();
    Eigen::Map<RowMatrix>(result.dq_bound.data() + begin * head_dim, rows, head_dim) =
        ((scale * d_s_error * abs_k).array() + r.u * dq_rows.cwiseAbs().array() + r.stored_tau).matrix();
    dk_bound += scale * d_s_error.transpose() * abs_q_rows;
    dv_bound += w.transpose() * abs_d_o_rows;
  }
  dk_bound = (dk_bound.array() + r.u * dk.cwiseAbs().array() + r.stored_tau).matrix();
  dv_bound = (dv_bound.array() + r.u * dv.cwiseAbs().array() + r.stored_tau).matrix();
  result.dk.assign(dk.data(), dk.data() + dk.size());
  result.dv.assign(dv.data(), dv.data() + dv.size());
  result.dk_bound.assign(dk_bound.data(), dk_bound.data() + dk_bound.size());
  result.dv_bound.assign(dv_bound.data(), dv_bound.data() + dv_bound.size());
  return result;
}


BackwardReference compute_backward_reference(const HostTensors& inputs,
                                             const std::vector<__half>& d_o,
                                             const std::vector<int64_t>& slices) {
  const Shape& shape = inputs.shape;
  const int64_t n = shape.tokens, n_k = shape.keys(), d = shape.head_dim;
  BackwardReference reference;
  reference.slices = slices;
  reference.gradients.resize(slices.size());
  parallel_for(int64_t(slices.size()), [&](int64_t begin, int64_t end) {
    for (int64_t which = begin; which < end; ++which) {
      const int64_t slice = slices[which], batch = slice / shape.heads;
      // The key-padding mask, or for packed sequences the keys past each one's end (inputs.hpp).
      const uint8_t* padding =
          inputs.key_padding_mask.empty() ? nullptr : inputs.key_padding_mask.data() + batch * n_k;
      reference.gradients[which] = attention_backward(
          as_doubles(inputs.q, slice * n * d, n * d), as_doubles(inputs.k, slice * n_k * d, n_k * d),
          as_doubles(inputs.v, slice * n_k * d, n_k * d), as_doubles(d_o, slice * n * d, n * d),
          shape, 1.0 / std::sqrt(double(d)), padding);
    }
  });
  return reference;
}

}  // namespace attn
