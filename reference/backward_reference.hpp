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
//
// Beside each gradient the reference gives a bound on the error a correct kernel may make in
// it (GradientBounds): a flash backward rounds P and dS to the 16-bit type for its products,
// builds D from the forward's 16-bit O, sums in fp32 and stores in 16 bits. Where the softmax is
// saturated (large scores, few keys), dQ and dK are small differences of such rounded terms, so
// no tolerance relative to the gradient's own size holds for every input; a bound element by
// element, from the same inputs, does.
#pragma once

#include <cstdint>
#include <vector>

#include "host_tensors.hpp"

namespace attn {

// The rounding a correct kernel does, for the bounds: u, the 16-bit type's unit roundoff (a
// value rounded to it moves by at most u |x| + tau); tau, half its smallest subnormal (fp16:
// 2^-25; bf16, with fp32's exponent range: 2^-134); stored_tau, the same for a gradient as the
// check reads it: the harness reads every output as fp16, bf16 ones too (inputs.hpp), so a
// stored value moves by up to 2^-25 where it falls below fp16's normal range; fp32, the
// relative error of one fp32 addition or product as tensor cores do them (2^-23, truncation
// allowed).
struct Rounding {
  double u, tau, stored_tau, fp32;
};
Rounding rounding_of(DType dtype);

// One (b, h) slice, row-major doubles: q and d_o are N x D, k and v are N_k x D, the sizes, the
// dtype and the causal mask `slice`'s (problem.hpp: N_k = N unless kv_tokens; the causal
// diagonal at the top left or bottom right). `key_padding`, N_k bytes or nullptr: the keys this
// slice's batch element pads (1), which no row sees. A row that sees no key at all (every key
// padding, or a bottom-right diagonal above it) has O = 0 and L = -inf, as the forward
// references define it, and contributes nothing: its dQ is 0, and it adds nothing to dK or dV
// (never a NaN from exp(-inf - (-inf))). A key no row sees gets dK = dV = 0.
//
// The bounds, to first order in u and fp32, with s the scale, P, dP = dO V^T, D and dS as above,
// and n the longer of N and N_k (the length of the longest sum):
//   sigma_ij = s |q_i| . |k_j|                  the size of score ij's terms
//   rho_ij   = D fp32 (sigma_ij + max_l sigma_il)   P's relative error: the score's fp32 sum
//                                                and L's (the forward sums the same scores)
//   P_err    = P o (rho + u) + tau               P rounded to 16 bits
//   w        = P_err + n fp32 P                  ... per unit of what it multiplies in a sum of n
//   O_err    = w |V| + u |O| + tau               the forward's O: P rounded, O stored
//   D_err_i  = |dO_i| . O_err_i + D fp32 |dO_i| . |O_i|
//   dS_err   = P_err o |dP - D| + P o (D fp32 |dO| |V|^T + D_err) + (u + n fp32) |dS| + tau
//              (P_err in the first term: a flash kernel forms dS from its fp32 P, an eager one
//              from the 16-bit P it stored; the bound serves both)
//   dq_bound = s dS_err |K| + u |dQ| + stored_tau
//   dk_bound = s dS_err^T |Q| + u |dK| + stored_tau
//   dv_bound = w^T |dO| + u |dV| + stored_tau
// A kernel's error may reach these (they add worst cases), and second-order terms go on top: the
// check allows kGradientBoundFactor times them (check.hpp).
struct SliceGradients {
  std::vector<double> o, log_sum_exp;  // the forward's O (N x D) and L (N)
  std::vector<double> dq;              // N x D
  std::vector<double> dk, dv;          // N_k x D each
  std::vector<double> dq_bound, dk_bound, dv_bound;  // as dq, dk, dv
};
SliceGradients attention_backward(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& d_o,
                                  const Shape& slice, double scale,
                                  const uint8_t* key_padding = nullptr);


// The gradients of a set of slices of fp16 inputs (read as doubles), in parallel over slices.
struct BackwardReference {
  std::vector<int64_t> slices;  // b * H + h
  std::vector<SliceGradients> gradients;
};
BackwardReference compute_backward_reference(const HostTensors& inputs,
                                             const std::vector<__half>& d_o,
                                             const std::vector<int64_t>& slices);

}  // namespace attn
