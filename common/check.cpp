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

CheckResult compare(const HostTensors& inputs, const Reference& reference,
                    const std::vector<__half>& output) {
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
  return result;
}

}  // namespace attn
