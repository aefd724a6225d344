#include "cpu_reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

namespace attn {
namespace {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int64_t kRowBlock = 256;

// One slice of a tensor of `rows` rows per slice (N for Q, N_k for K and V).
RowMatrix load_slice(const std::vector<__half>& tensor, int64_t rows, int64_t d, int64_t slice) {
  const int64_t n = rows;
  RowMatrix m(n, d);
  const __half* base = tensor.data() + slice * n * d;
  for (int64_t i = 0; i < n * d; ++i) m.data()[i] = double(__half2float(base[i]));
  return m;
}

// Rows [row_begin, row_end) of O for one slice, written into out (N x D row-major), and their
// log-sum-exp into log_sum_exp (N values). `padding` (N_k values, or nullptr): keys marked 1 get
// no weight, and so do the keys past a row's causal diagonal (shape.sees). A row with no key
// left has no weights at all: its O is 0 and its L -inf (the log of an empty sum), the
// definition every step that takes a mask follows.
void attend_rows(const Shape& shape, const RowMatrix& q, const RowMatrix& k, const RowMatrix& v,
                 const uint8_t* padding, int64_t row_begin, int64_t row_end, double* out,
                 double* log_sum_exp) {
  const double scale = 1.0 / std::sqrt(double(q.cols()));
  RowMatrix scores = (q.middleRows(row_begin, row_end - row_begin) * k.transpose()) * scale;
  if (padding != nullptr) {
    for (int64_t j = 0; j < scores.cols(); ++j) {
      if (padding[j] != 0) scores.col(j).setConstant(-INFINITY);
    }
  }
  for (int64_t r = 0; r < scores.rows(); ++r) {
    for (int64_t j = 0; j < scores.cols(); ++j) {
      if (!shape.sees(row_begin + r, j)) scores(r, j) = -INFINITY;
    }
  }
  for (int64_t r = 0; r < scores.rows(); ++r) {
    const double row_max = scores.row(r).maxCoeff();
    if (row_max == -INFINITY) {  // every key is masked
      scores.row(r).setZero();
      log_sum_exp[row_begin + r] = -INFINITY;
      continue;
    }
    scores.row(r) = (scores.row(r).array() - row_max).exp().matrix();
    const double row_sum = scores.row(r).sum();
    log_sum_exp[row_begin + r] = row_max + std::log(row_sum);
    scores.row(r) /= row_sum;
  }
  Eigen::Map<RowMatrix>(out + row_begin * v.cols(), row_end - row_begin, v.cols()) = scores * v;
}

}  // namespace

std::vector<double> reference_slice(const HostTensors& inputs, int64_t slice) {
  Reference reference = compute_reference(inputs, {slice});
  return std::move(reference.output.front());
}

Reference compute_reference(const HostTensors& inputs, const std::vector<int64_t>& slices) {
  const Shape& shape = inputs.shape;
  const int64_t n = shape.tokens, d = shape.head_dim;
  const int64_t blocks_per_slice = (n + kRowBlock - 1) / kRowBlock;

  Reference reference;
  reference.slices = slices;
  reference.output.assign(slices.size(), std::vector<double>(std::size_t(n * d)));
  reference.log_sum_exp.assign(slices.size(), std::vector<double>(std::size_t(n)));

  // Work items are (slice, row block) pairs, so one long slice still spreads over all cores.
  // Each item converts its slice's K and V again: cheap next to the N x N x D products.
  parallel_for(int64_t(slices.size()) * blocks_per_slice, [&](int64_t begin, int64_t end) {
    int64_t loaded = -1;
    RowMatrix q, k, v;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t which = item / blocks_per_slice, block = item % blocks_per_slice;
      if (which != loaded) {
        q = load_slice(inputs.q, n, d, slices[which]);
        k = load_slice(inputs.k, shape.keys(), d, slices[which]);
        v = load_slice(inputs.v, shape.keys(), d, slices[which]);
        loaded = which;
      }
      const uint8_t* padding =
          inputs.key_padding_mask.empty()
              ? nullptr
              : inputs.key_padding_mask.data() + (slices[which] / shape.heads) * shape.keys();
      attend_rows(shape, q, k, v, padding, block * kRowBlock, std::min(n, (block + 1) * kRowBlock),
                  reference.output[which].data(), reference.log_sum_exp[which].data());
    }
  });
  return reference;
}

}  // namespace attn
