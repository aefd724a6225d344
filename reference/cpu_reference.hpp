// The CPU reference: exact attention in fp64 (Eigen) from the same fp16 inputs the GPU sees.
#pragma once

#include <cstdint>
#include <vector>

#include "host_tensors.hpp"

namespace attn {

// O for one (b, h) slice, N x D row-major, computed in fp64 with the stable softmax
// (subtract each row's maximum before exp), over the slice's N_k keys (Shape::keys()). Rows go
// in blocks so memory stays O(block * N_k). With a key-padding mask (HostTensors), the keys it
// marks get no weight, as do the keys past a row's causal diagonal (Shape::causal); a row with
// no key left is O = 0 with L = -inf.
std::vector<double> reference_slice(const HostTensors& inputs, int64_t slice);

// The reference for a set of slices, computed in parallel over slices and row blocks.
struct Reference {
  std::vector<int64_t> slices;             // which (b, h) slices, as b * H + h
  std::vector<std::vector<double>> output;  // output[i]: N x D for slices[i]
  // log_sum_exp[i]: N values for slices[i], L = log(sum_j exp(s_j)) of each row's scaled scores
  // s = q K^T / sqrt(D): what a backward pass needs to rebuild P = exp(s - L) without O.
  std::vector<std::vector<double>> log_sum_exp;
};
Reference compute_reference(const HostTensors& inputs, const std::vector<int64_t>& slices);

}  // namespace attn
