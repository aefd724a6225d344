// The result check: a step's fp16 output against the fp64 reference.
//
// Tolerances, from fp16 rounding (unit roundoff u = 2^-11 ~ 4.9e-4). A correct kernel that
// accumulates in fp32 makes two rounding errors that matter:
//   1. O itself is stored in fp16: |error| <= u * |o| per element.
//   2. Tensor-core steps round the probabilities P to fp16 before P V: each p_j carries
//      a relative error <= u, so o = sum_j p_j v_j moves by at most u * max_j |v_j|.
// Everything else (fp32 dot products of exact fp16 products, exp in fp32) is ~1e-6 relative.
// So per element |error| <= u * |o| + u * max|v| <= 2u * max|V|, since |o| <= max|V|
// (o is a convex combination of rows of V). We allow 2x that bound on the largest error.
// The errors are independent across j, so the relative Frobenius error of a correct kernel
// is ~u/2 (measured: 1e-4 to 3e-4); we allow 4u. Both bounds are the same for every step.
// A planted error of one element, a skipped row, a NaN, or a wrong scale (tests/) fail them.
//
// Every element of every slice is checked: the fp64 CPU reference covers the sampled slices
// (or all, with --check full), and the GPU reference (gpu_reference.hpp: fp64 arithmetic on the
// GPU, rounded to fp32, ~1e-7 relative, so it adds nothing that matters to the bound above)
// covers all of them with the same two tolerances. A step passes only when both parts pass.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backward_reference.hpp"
#include "cpu_reference.hpp"
#include "inputs.hpp"
#include "options.hpp"

namespace attn {

constexpr double kUnitRoundoff = 0x1.0p-11;             // fp16
static_assert(kUnitRoundoff == unit_roundoff(DType::fp16));
constexpr double kRelativeTolerance = 4 * kUnitRoundoff;  // on ||O - ref||_F / ||ref||_F
constexpr double kAbsoluteFactor = 4 * kUnitRoundoff;     // max |O - ref| <= this * max|V|
// bf16 (Shape::dtype): the same derivation with its u = 2^-8. The inputs are drawn as bf16
// values, so the reference sees exactly what the step does, and O and P are rounded to bf16.
constexpr double relative_tolerance(DType dtype) { return 4 * unit_roundoff(dtype); }
constexpr double absolute_factor(DType dtype) { return 4 * unit_roundoff(dtype); }
// L, the log-sum-exp of each row's scaled scores that a step writes for a backward pass
// (AttentionArgs::log_sum_exp), is used as P = exp(s - L): an error e in L is a relative error e
// in every p of its row. A correct kernel's L carries its fp32 scores' error, the same error
// that moves its P (and O) in the forward, and the fp32 row sum's (~1e-6): both far below 4u,
// the bound we allow, so a P rebuilt from L is as good as the P the forward used. fp16's u for
// bf16 inputs too: L is computed in fp32 from the inputs either way, never rounded to 16 bits.
constexpr double kLogSumExpTolerance = 4 * kUnitRoundoff;  // max |L - ref|, natural-log units

struct CheckResult {
  bool checked = false;  // false for --check none
  bool passed = false;
  double relative_error = 0;  // ||O - ref||_F / ||ref||_F over the checked slices
  double max_abs_error = 0;
  double relative_tolerance = kRelativeTolerance;
  double abs_tolerance = 0;
  int64_t nonfinite = 0;       // NaN or Inf outputs from finite inputs: always a failure
  int64_t checked_slices = 0;  // against the fp64 CPU reference
  int64_t total_slices = 0;
  // Every slice against the GPU reference (0 slices when it was not run).
  int64_t all_checked_slices = 0;
  double all_relative_error = 0;
  double all_max_abs_error = 0;
  double all_abs_tolerance = 0;
  // L of every checked row (0 rows: the step was not asked for L): against the CPU reference for
  // the sampled slices and the GPU reference for all.
  int64_t log_sum_exp_rows = 0;
  double log_sum_exp_max_error = 0;
  // A backward step's check (compare_gradients): every element against its own error bound.
  // worst_bound_ratio is the largest error over its bound (it passes up to kGradientBoundFactor);
  // max_abs_error and abs_tolerance are that element's error and allowance.
  bool elementwise = false;
  double worst_bound_ratio = 0, all_worst_bound_ratio = 0;
  std::string pipeline_violation;  // a Hopper step's checked build: the first rule it broke
  std::string worst;  // where the largest error is, for the failure message
};

// The (b, h) slices a check covers: all for full; for sample, the first, the last and two
// more drawn from the seed (fewer when there are fewer slices).
std::vector<int64_t> slices_to_check(const Shape& shape, CheckMode mode, uint64_t seed);

// `all_slices`: the GPU reference's O for every slice ([B, H, N, D] fp32), or empty.
CheckResult compare(const HostTensors& inputs, const Reference& reference,
                    const std::vector<__half>& output, const std::vector<float>& all_slices = {});

// A step's L ([B, H, N] fp32) into `result`: the reference's slices against its log_sum_exp,
// and every row against `all_rows` (the GPU reference's L, or empty). A non-finite L or one off
// by more than kLogSumExpTolerance fails the result.
void compare_log_sum_exp(const Shape& shape, const Reference& reference,
                         const std::vector<float>& log_sum_exp, const std::vector<float>& all_rows,
                         CheckResult& result);

// A backward step's dQ, dK and dV against the fp64 backward reference, on its slices, element by
// element: each error within kGradientBoundFactor times the bound the reference gives for that
// element (backward_reference.hpp derives it: P and dS rounded to 16 bits for the products, D
// from the forward's 16-bit O, fp32 sums, 16-bit stores). No tolerance relative to a gradient's
// own size can serve: where the softmax saturates (large scores, few keys), dQ and dK are small
// differences of rounded terms, and a correct kernel's relative error reaches thousands of u
// there. The bound adds worst cases to first order; the factor 2 leaves room for the terms of
// second order. The result holds the worst element (`worst` names it: slice, row and column of
// dQ, slice, key and column of dK or dV); relative_error is the largest relative Frobenius error
// of the three, reported, not judged. dq is [B, H, N, D], dk and dv [B, H, N_k, D]
// (Shape::keys()). `all`: the GPU backward reference's gradients and bounds of every slice
// (gpu_reference.hpp), checked the same way into the all_* fields; empty vectors: not run.
constexpr double kGradientBoundFactor = 2.0;
struct AllSliceGradients {
  std::vector<float> dq;                            // [B, H, N, D]
  std::vector<float> dk, dv;                        // [B, H, N_k, D] each
  std::vector<float> dq_bound, dk_bound, dv_bound;  // as dq, dk, dv: each element's error bound
};
CheckResult compare_gradients(const Shape& shape, const BackwardReference& reference,
                              const std::vector<__half>& dq, const std::vector<__half>& dk,
                              const std::vector<__half>& dv, const AllSliceGradients& all = {});

}  // namespace attn
