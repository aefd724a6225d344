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

std::string location(const Shape& shape, int64_t index) {
  const int64_t slice_size = shape.tokens * shape.head_dim;
  const int64_t within = index % slice_size;
  return "slice " + std::to_string(index / slice_size) + ", row " +
         std::to_string(within / shape.head_dim) + ", column " +
         std::to_string(within % shape.head_dim);
}

// Every element against the GPU reference, with the tolerances of the fp64 part.
void compare_all_slices(const HostTensors& inputs, const std::vector<__half>& output,
                        const std::vector<float>& all_slices, CheckResult& result) {
  double error_sq = 0, reference_sq = 0, max_abs_v = 0;
  int64_t nonfinite = 0, worst_index = -1, first_nonfinite = -1;
  for (std::size_t i = 0; i < output.size(); ++i) {
    max_abs_v = std::max(max_abs_v, std::fabs(double(__half2float(inputs.v[i]))));
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
  result.all_abs_tolerance = kAbsoluteFactor * max_abs_v;
  const bool passed = nonfinite == 0 && result.all_relative_error <= kRelativeTolerance &&
                      result.all_max_abs_error <= result.all_abs_tolerance;
  result.nonfinite = std::max(result.nonfinite, nonfinite);
  if (!passed && result.passed) {  // the fp64 part passed: say where this part failed
    result.worst = nonfinite > 0
                       ? "first non-finite output at " + location(inputs.shape, first_nonfinite)
                       : "largest error against the GPU reference at " +
                             location(inputs.shape, worst_index) + ": got " +
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

  double error_sq = 0, reference_sq = 0, max_abs_v = 0;
  for (std::size_t which = 0; which < reference.slices.size(); ++which) {
    const int64_t slice = reference.slices[which];
    const __half* got = output.data() + slice * slice_size;
    const __half* v = inputs.v.data() + slice * slice_size;
    const std::vector<double>& want = reference.output[which];
    for (int64_t i = 0; i < slice_size; ++i) {
      max_abs_v = std::max(max_abs_v, std::fabs(double(__half2float(v[i]))));
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
  result.abs_tolerance = kAbsoluteFactor * max_abs_v;
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
    const double got = double(log_sum_exp[std::size_t(row_index)]);
    const double error = std::isfinite(got) ? std::fabs(got - want) : INFINITY;
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

CheckResult compare_gradients(const Shape& shape, const BackwardReference& reference,
                              const std::vector<__half>& dq, const std::vector<__half>& dk,
                              const std::vector<__half>& dv) {
  const int64_t slice_size = shape.tokens * shape.head_dim;
  CheckResult result;
  result.checked = true;
  result.passed = true;
  result.checked_slices = int64_t(reference.slices.size());
  result.total_slices = shape.slices();
  result.relative_tolerance = kGradientRelativeTolerance;
  double worst_ratio = -1;  // of the gradients' max abs errors to their tolerances
  const std::vector<double> SliceGradients::*wanted[] = {&SliceGradients::dq, &SliceGradients::dk,
                                                          &SliceGradients::dv};
  const std::vector<__half>* gotten[] = {&dq, &dk, &dv};
  const char* names[] = {"dQ", "dK", "dV"};
  // dV's largest value sets a floor under every gradient's: where a row has one key (N = 1), dQ
  // and dK vanish, and what a kernel returns is the rounding of terms of dV's size that cancel.
  double dv_largest = 0;
  for (std::size_t s = 0; s < reference.slices.size(); ++s) {
    for (double value : reference.gradients[s].dv) dv_largest = std::max(dv_largest, std::fabs(value));
  }
  for (int which = 0; which < 3; ++which) {
    double error_sq = 0, reference_sq = 0, largest = dv_largest, max_abs_error = 0;
    int64_t nonfinite = 0;
    std::string where, first_nonfinite;
    for (std::size_t s = 0; s < reference.slices.size(); ++s) {
      const int64_t slice = reference.slices[s];
      const std::vector<double>& want = reference.gradients[s].*wanted[which];
      const __half* got = gotten[which]->data() + slice * slice_size;
      for (int64_t i = 0; i < slice_size; ++i) {
        largest = std::max(largest, std::fabs(want[i]));
        const double value = double(__half2float(got[i]));
        if (!std::isfinite(value)) {
          if (nonfinite++ == 0) first_nonfinite = location(shape, slice * slice_size + i);
          continue;
        }
        const double error = std::fabs(value - want[i]);
        error_sq += error * error;
        reference_sq += want[i] * want[i];
        if (error > max_abs_error) {
          max_abs_error = error;
          where = location(shape, slice * slice_size + i) + ": got " + std::to_string(value) +
                  ", want " + std::to_string(want[i]);
        }
      }
    }
    const double relative = reference_sq > 0 ? std::sqrt(error_sq / reference_sq) : std::sqrt(error_sq);
    const double abs_tolerance = kGradientAbsoluteFactor * largest;
    const bool passed = nonfinite == 0 && relative <= kGradientRelativeTolerance &&
                        max_abs_error <= abs_tolerance;
    result.nonfinite += nonfinite;
    result.relative_error = std::max(result.relative_error, relative);
    const double ratio = abs_tolerance > 0 ? max_abs_error / abs_tolerance : max_abs_error;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      result.max_abs_error = max_abs_error;
      result.abs_tolerance = abs_tolerance;
    }
    if (!passed && result.passed) {
      result.worst = nonfinite > 0 ? std::string(names[which]) + ": first non-finite value at " + first_nonfinite
                                   : std::string(names[which]) + ": relative error " +
                                         std::to_string(relative) + ", largest error at " + where;
    }
    if (result.worst.empty() || (passed && result.passed && ratio >= worst_ratio)) {
      result.worst = std::string(names[which]) + ": relative error " + std::to_string(relative) +
                     ", largest error at " + where;
    }
    result.passed = result.passed && passed;
  }
  return result;
}

}  // namespace attn
