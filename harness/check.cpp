#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace attn {

std::vector<int64_t> slices_to_check(const Shape& shape, CheckMode mode, uint64_t seed) {
  const int64_t count = shape.slices();
  std::vector<int64_t> slices;
  if (mode == CheckMode::none) return slices;
  if (mode == CheckMode::full || count <= 4) {
    for (int64_t s = 0; s < count; ++s) slices.push_back(s);
    return slices;
  }
  std::set<int64_t> chosen{0, count - 1};
  for (uint64_t draw = 0; chosen.size() < 4; ++draw) {
    const float u = std::fabs(normal_sample(seed, 99, draw));  // any hashed value will do
    chosen.insert(1 + int64_t(u * 1e6) % (count - 2));
  }
  return {chosen.begin(), chosen.end()};
}

namespace {

// Whether row `row` of slice `slice` (b H + h) is an output: every row is, but past the end of a
// packed sequence (Shape::lengths), whose padded rows the step never writes.
bool is_output_row(const Shape& shape, int64_t slice, int64_t row) {
  return !shape.packed() || row < shape.length(slice / shape.heads);
}

// The slices of a [B, H, rows, D] tensor as a failure names their elements: O, dQ (N rows, each
// a query's: "row") or dK and dV (N_k rows, each a key's: "key").
struct SliceRows {
  int64_t rows, head_dim;
  const char* row_name;
  int64_t size() const { return rows * head_dim; }
};
SliceRows query_rows(const Shape& shape) { return {shape.tokens, shape.head_dim, "row"}; }
SliceRows key_rows(const Shape& shape) { return {shape.keys(), shape.head_dim, "key"}; }

std::string location(const SliceRows& layout, int64_t index) {
  const int64_t within = index % layout.size();
  return "slice " + std::to_string(index / layout.size()) + ", " + layout.row_name + " " +
         std::to_string(within / layout.head_dim) + ", column " +
         std::to_string(within % layout.head_dim);
}

// Every element against the GPU reference, with the tolerances of the fp64 part.
void compare_all_slices(const HostTensors& inputs, const std::vector<__half>& output,
                        const std::vector<float>& all_slices, CheckResult& result) {
  double error_sq = 0, reference_sq = 0, max_abs_v = 0;
  int64_t nonfinite = 0, worst_index = -1, first_nonfinite = -1;
  for (__half value : inputs.v) max_abs_v = std::max(max_abs_v, std::fabs(double(__half2float(value))));
  const Shape& shape = inputs.shape;
  for (std::size_t i = 0; i < output.size(); ++i) {
    const int64_t row_index = int64_t(i) / shape.head_dim;
    if (!is_output_row(shape, row_index / shape.tokens, row_index % shape.tokens)) continue;
    const double value = double(__half2float(output[i]));
    if (!std::isfinite(value)) {
      if (nonfinite++ == 0) first_nonfinite = int64_t(i);
      continue;
    }
    const double want = double(all_slices[i]);
    const double error = std::fabs(value - want);
    error_sq += error * error;
    reference_sq += want * want;
    if (error > result.all_max_abs_error) {
      result.all_max_abs_error = error;
      worst_index = int64_t(i);
    }
  }
  result.all_checked_slices = inputs.shape.slices();
  result.all_relative_error = reference_sq > 0 ? std::sqrt(error_sq / reference_sq) : std::sqrt(error_sq);
  result.all_abs_tolerance = absolute_factor(inputs.shape.dtype) * max_abs_v;
  const bool passed = nonfinite == 0 &&
                      result.all_relative_error <= relative_tolerance(inputs.shape.dtype) &&
                      result.all_max_abs_error <= result.all_abs_tolerance;
  result.nonfinite = std::max(result.nonfinite, nonfinite);
  if (!passed && result.passed) {  // the fp64 part passed: say where this part failed
    result.worst = nonfinite > 0
                       ? "first non-finite output at " + location(query_rows(inputs.shape), first_nonfinite)
                       : "largest error against the GPU reference at " +
                             location(query_rows(inputs.shape), worst_index) + ": got " +
                             std::to_string(__half2float(output[worst_index])) + ", want " +
                             std::to_string(all_slices[worst_index]) + " (relative error " +
                             std::to_string(result.all_relative_error) + " over all slices)";
  }
  result.passed = result.passed && passed;
}

}  // namespace

CheckResult compare(const HostTensors& inputs, const Reference& reference,
                    const std::vector<__half>& output, const std::vector<float>& all_slices) {
  const Shape& shape = inputs.shape;
  const int64_t slice_size = shape.tokens * shape.head_dim;
  CheckResult result;
  result.checked = true;
  result.checked_slices = int64_t(reference.slices.size());
  result.total_slices = shape.slices();
  result.relative_tolerance = relative_tolerance(shape.dtype);

  double error_sq = 0, reference_sq = 0, max_abs_v = 0;
  for (std::size_t which = 0; which < reference.slices.size(); ++which) {
    const int64_t slice = reference.slices[which];
    const __half* got = output.data() + slice * slice_size;
    const int64_t v_slice_size = shape.keys() * shape.head_dim;  // V has N_k rows a slice
    const __half* v = inputs.v.data() + slice * v_slice_size;
    for (int64_t i = 0; i < v_slice_size; ++i) {
      max_abs_v = std::max(max_abs_v, std::fabs(double(__half2float(v[i]))));
    }
    const std::vector<double>& want = reference.output[which];
    for (int64_t i = 0; i < slice_size; ++i) {
      if (!is_output_row(shape, slice, i / shape.head_dim)) continue;
      const double value = double(__half2float(got[i]));
      if (!std::isfinite(value)) {
        if (result.nonfinite++ == 0) {
          result.worst = "first non-finite output at slice " + std::to_string(slice) + ", row " +
                         std::to_string(i / shape.head_dim) + ", column " +
                         std::to_string(i % shape.head_dim);
        }
        continue;
      }
      const double error = std::fabs(value - want[i]);
      error_sq += error * error;
      reference_sq += want[i] * want[i];
      if (error > result.max_abs_error) {
        result.max_abs_error = error;
        if (result.nonfinite == 0) {
          result.worst = "largest error at slice " + std::to_string(slice) + ", row " +
                         std::to_string(i / shape.head_dim) + ", column " +
                         std::to_string(i % shape.head_dim) + ": got " + std::to_string(value) +
                         ", want " + std::to_string(want[i]);
        }
      }
    }
  }
  result.relative_error = reference_sq > 0 ? std::sqrt(error_sq / reference_sq) : std::sqrt(error_sq);
  result.abs_tolerance = absolute_factor(shape.dtype) * max_abs_v;
  result.passed = result.nonfinite == 0 && result.relative_error <= result.relative_tolerance &&
                  result.max_abs_error <= result.abs_tolerance;
  if (!all_slices.empty()) compare_all_slices(inputs, output, all_slices, result);
  return result;
}

void compare_log_sum_exp(const Shape& shape, const Reference& reference,
                         const std::vector<float>& log_sum_exp, const std::vector<float>& all_rows,
                         CheckResult& result) {
  const int64_t tokens = shape.tokens;
  std::string worst;
  // One row of the step's L against a reference value; `against` names the reference.
  auto check_row = [&](int64_t row_index, double want, const char* against) {
    if (!is_output_row(shape, row_index / tokens, row_index % tokens)) return;
    const double got = double(log_sum_exp[std::size_t(row_index)]);
    // A row whose keys are all padding has L = -inf (cpu_reference.hpp): a step must say so.
    const double error = want == -INFINITY ? (got == -INFINITY ? 0.0 : INFINITY)
                         : std::isfinite(got) ? std::fabs(got - want)
                                              : INFINITY;
    if (error > result.log_sum_exp_max_error) {  // a NaN's error is infinite: the first is named
      result.log_sum_exp_max_error = error;
      worst = "largest error of L (the log-sum-exp) against the " + std::string(against) +
              " at slice " + std::to_string(row_index / tokens) + ", row " +
              std::to_string(row_index % tokens) + ": got " + std::to_string(got) + ", want " +
              std::to_string(want);
    }
  };
  for (std::size_t which = 0; which < reference.slices.size(); ++which) {
    for (int64_t row = 0; row < tokens; ++row) {
      check_row(reference.slices[which] * tokens + row, reference.log_sum_exp[which][std::size_t(row)],
                "fp64 reference");
    }
  }
  for (std::size_t row_index = 0; row_index < all_rows.size(); ++row_index) {
    check_row(int64_t(row_index), double(all_rows[row_index]), "GPU reference");
  }
  result.log_sum_exp_rows =
      all_rows.empty() ? int64_t(reference.slices.size()) * tokens : int64_t(all_rows.size());
  const bool passed = result.log_sum_exp_max_error <= kLogSumExpTolerance;
  if (!passed && result.passed) result.worst = worst;  // O passed: say where L failed
  result.passed = result.passed && passed;
}

namespace {

// One gradient, whose slices are `layout`, against its reference values and their error bounds
// over some slices: want(position in `slices`, index within the slice) gives {value, bound}.
struct GradientError {
  double relative = 0;      // ||error||_F / ||reference||_F, for the report
  double worst_ratio = 0;   // the largest error over its element's bound
  double worst_error = 0, worst_bound = 0;  // at that element
  int64_t nonfinite = 0;
  std::string where, first_nonfinite;
};
struct Wanted {
  double value, bound;
};
template <typename Want>
GradientError gradient_error(const SliceRows& layout, const std::vector<int64_t>& slices,
                             const std::vector<__half>& got, Want&& want) {
  const int64_t slice_size = layout.size();
  GradientError result;
  double error_sq = 0, reference_sq = 0;
  for (std::size_t s = 0; s < slices.size(); ++s) {
    const int64_t slice = slices[s];
    for (int64_t i = 0; i < slice_size; ++i) {
      const Wanted wanted = want(s, i);
      const double value = double(__half2float(got[std::size_t(slice * slice_size + i)]));
      if (!std::isfinite(value)) {
        if (result.nonfinite++ == 0) result.first_nonfinite = location(layout, slice * slice_size + i);
        continue;
      }
      const double error = std::fabs(value - wanted.value);
      error_sq += error * error;
      reference_sq += wanted.value * wanted.value;
      const double ratio = error / wanted.bound;  // bounds are > 0: each holds a tau
      if (ratio > result.worst_ratio || result.where.empty()) {
        result.worst_ratio = ratio;
        result.worst_error = error;
        result.worst_bound = wanted.bound;
        result.where = location(layout, slice * slice_size + i) + ": got " + std::to_string(value) +
                       ", want " + std::to_string(wanted.value) + ", bound " + std::to_string(wanted.bound);
      }
    }
  }
  result.relative = reference_sq > 0 ? std::sqrt(error_sq / reference_sq) : std::sqrt(error_sq);
  return result;
}

// dQ, dK and dV's errors judged together: each passes when no element is non-finite and every
// element's error is within kGradientBoundFactor times its bound. Returns whether all three
// passed; the worst (or first failing) is described.
struct GradientVerdict {
  bool passed = true;
  double relative_error = 0, worst_ratio = 0, max_abs_error = 0, abs_tolerance = 0;
  int64_t nonfinite = 0;
  std::string worst;
};
GradientVerdict judge(const GradientError (&errors)[3], const char* against) {
  const char* names[] = {"dQ", "dK", "dV"};
  GradientVerdict verdict;
  double worst_ratio = -1;
  for (int which = 0; which < 3; ++which) {
    const GradientError& error = errors[which];
    const bool passed = error.nonfinite == 0 && error.worst_ratio <= kGradientBoundFactor;
    verdict.nonfinite += error.nonfinite;
    verdict.relative_error = std::max(verdict.relative_error, error.relative);
    const std::string described =
        error.nonfinite > 0
            ? std::string(names[which]) + ": first non-finite value at " + error.first_nonfinite
            : std::string(names[which]) + ": largest error " + std::to_string(error.worst_ratio) +
                  " times its bound against the " + against + ", at " + error.where;
    if (error.worst_ratio > worst_ratio) {
      worst_ratio = error.worst_ratio;
      verdict.worst_ratio = error.worst_ratio;
      verdict.max_abs_error = error.worst_error;
      verdict.abs_tolerance = kGradientBoundFactor * error.worst_bound;
      if (verdict.passed) verdict.worst = described;
    }
    if (!passed && verdict.passed) verdict.worst = described;  // the first failure is named
    verdict.passed = verdict.passed && passed;
  }
  return verdict;
}

}  // namespace

CheckResult compare_gradients(const Shape& shape, const BackwardReference& reference,
                              const std::vector<__half>& dq, const std::vector<__half>& dk,
                              const std::vector<__half>& dv, const AllSliceGradients& all) {
  using Member = const std::vector<double> SliceGradients::*;
  const Member values[] = {&SliceGradients::dq, &SliceGradients::dk, &SliceGradients::dv};
  const Member bounds[] = {&SliceGradients::dq_bound, &SliceGradients::dk_bound,
                           &SliceGradients::dv_bound};
  const std::vector<__half>* gotten[] = {&dq, &dk, &dv};
  const SliceRows layouts[] = {query_rows(shape), key_rows(shape), key_rows(shape)};
  GradientError errors[3];
  for (int which = 0; which < 3; ++which) {
    errors[which] = gradient_error(layouts[which], reference.slices, *gotten[which],
                                   [&](std::size_t s, int64_t i) {
      const SliceGradients& slice = reference.gradients[s];
      return Wanted{(slice.*values[which])[std::size_t(i)], (slice.*bounds[which])[std::size_t(i)]};
    });
  }
  const GradientVerdict verdict = judge(errors, "fp64 reference");
  CheckResult result;
  result.checked = true;
  result.passed = verdict.passed;
  result.elementwise = true;
  result.checked_slices = int64_t(reference.slices.size());
  result.total_slices = shape.slices();
  result.relative_error = verdict.relative_error;
  result.relative_tolerance = NAN;  // not judged: each element against its own bound
  result.worst_bound_ratio = verdict.worst_ratio;
  result.max_abs_error = verdict.max_abs_error;
  result.abs_tolerance = verdict.abs_tolerance;
  result.nonfinite = verdict.nonfinite;
  result.worst = verdict.worst;
  if (all.dq.empty()) return result;

  std::vector<int64_t> every_slice(std::size_t(shape.slices()));
  for (int64_t s = 0; s < shape.slices(); ++s) every_slice[std::size_t(s)] = s;
  const std::vector<float>* all_values[] = {&all.dq, &all.dk, &all.dv};
  const std::vector<float>* all_bounds[] = {&all.dq_bound, &all.dk_bound, &all.dv_bound};
  for (int which = 0; which < 3; ++which) {
    errors[which] = gradient_error(layouts[which], every_slice, *gotten[which],
                                   [&](std::size_t s, int64_t i) {
      const std::size_t at = std::size_t(int64_t(s) * layouts[which].size() + i);
      return Wanted{double((*all_values[which])[at]), double((*all_bounds[which])[at])};
    });
  }
  const GradientVerdict all_verdict = judge(errors, "GPU reference");
  result.all_checked_slices = shape.slices();
  result.all_relative_error = all_verdict.relative_error;
  result.all_worst_bound_ratio = all_verdict.worst_ratio;
  result.all_max_abs_error = all_verdict.max_abs_error;
  result.all_abs_tolerance = all_verdict.abs_tolerance;
  result.nonfinite = std::max(result.nonfinite, all_verdict.nonfinite);
  if (!all_verdict.passed && result.passed) result.worst = all_verdict.worst;
  result.passed = result.passed && all_verdict.passed;
  return result;
}

}  // namespace attn
