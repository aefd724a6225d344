// The backward of attention in fp64: given Q, K, V and dO (the gradient of a loss with respect
// to O), the gradients dQ, dK and dV. With S = s Q K^T (s = 1/sqrt(D)), P = softmax(S) by rows,
// O = P V:
//
//   dV = P^T dO                     each key's row: the weights it got, times the rows' dO
//   dP = dO V^T
//   D_i = sum_j P_ij dP_ij = dO_i . O_i        (the softmax's Jacobian, folded into one number a row)
//   dS = P o (dP - D)               o: elementwise; D subtracted from every entry of row i
//   dQ = s dS K,   dK = s dS^T Q
//
// P is rebuilt from L, each row's log-sum-exp: P_ij = exp(S_ij - L_i), as a flash backward does.
#pragma once

#include <cstdint>
#include <vector>

#include "inputs.hpp"

namespace attn {

// One (b, h) slice, row-major doubles: q, d_o are N x D, k, v are N x D.
struct SliceGradients {
  std::vector<double> o, log_sum_exp;  // the forward's O (N x D) and L (N)
  std::vector<double> dq, dk, dv;      // N x D each
};
SliceGradients attention_backward(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& d_o,
                                  int64_t tokens, int64_t head_dim, double scale);

// dO of the standard test inputs: standard normal, from its own stream of the seed.
std::vector<__half> make_output_gradient(const Shape& shape, uint64_t seed);

// The gradients of a set of slices of fp16 inputs (read as doubles), in parallel over slices.
struct BackwardReference {
  std::vector<int64_t> slices;  // b * H + h
  std::vector<SliceGradients> gradients;
};
BackwardReference compute_backward_reference(const HostTensors& inputs,
                                             const std::vector<__half>& d_o,
                                             const std::vector<int64_t>& slices);

}  // namespace attn
