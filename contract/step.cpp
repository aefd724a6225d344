#include "step.hpp"

#include <algorithm>
#include <stdexcept>

namespace attn {
namespace {

std::vector<StepInfo>& registry() {
  static std::vector<StepInfo> steps;  // function-local: safe from static-initialisation order
  return steps;
}

// "v10" sorts after "v9"; baselines after all steps.
bool comes_before(const StepInfo& a, const StepInfo& b) {
  const bool a_numbered = !is_baseline(a.kind), b_numbered = !is_baseline(b.kind);
  if (a_numbered != b_numbered) return a_numbered;
  auto number = [](const std::string& id) {
    return id.size() > 1 && id[0] == 'v' ? std::stoi(id.substr(1)) : 0;
  };
  if (a_numbered && number(a.id) != number(b.id)) return number(a.id) < number(b.id);
  return a.id < b.id;
}

}  // namespace

std::string join_numbers(const std::vector<int>& values, const std::string& separator) {
  std::string text;
  for (int value : values) text += (text.empty() ? "" : separator) + std::to_string(value);
  return text;
}

std::string dtype_names(const std::vector<DType>& dtypes) {
  std::string text;
  for (DType dtype : dtypes) text += (text.empty() ? "" : ", ") + dtype_name(dtype);
  return text;
}

std::string compute_capability_text(int value) {
  return std::to_string(value / 10) + "." + std::to_string(value % 10);
}

std::string StepInfo::compute_capability_range() const {
  const std::string min = compute_capability_text(min_compute_capability);
  if (max_compute_capability == 0) return min + "+";
  if (max_compute_capability == min_compute_capability) return min;
  return min + "-" + compute_capability_text(max_compute_capability);
}

std::optional<std::string> StepInfo::refuses(const Shape& shape) const {
  if (std::find(head_dims.begin(), head_dims.end(), shape.head_dim) == head_dims.end()) {
    return id + " does not serve --head-dim " + std::to_string(shape.head_dim) +
           " (it serves head dims " + join_numbers(head_dims, ", ") + ")";
  }
  if (std::find(dtypes.begin(), dtypes.end(), shape.dtype) == dtypes.end()) {
    return id + " does not serve --dtype " + dtype_name(shape.dtype) + " (it takes " +
           dtype_names(dtypes) + ")";
  }
  if (shape.key_padding && !takes_key_padding_mask) {
    return id + " does not serve --key-padding (it takes no key-padding mask)";
  }
  if (shape.causal != Causal::none && !takes_causal) {
    return id + " does not serve --causal (it takes no causal mask)";
  }
  if (shape.packed() && !takes_packed_sequences) {
    return id + " does not serve --lengths (it takes no packed sequences of different lengths)";
  }
  if (shape.cross() && !takes_kv_tokens) {
    return id + " does not serve --kv-tokens " + std::to_string(shape.keys()) +
           " (it serves self-attention: as many keys as queries, " + std::to_string(shape.tokens) + ")";
  }
  return std::nullopt;
}

std::optional<std::string> StepInfo::refuses_device(const DeviceLimits& device) const {
  const bool too_old = device.compute_capability < min_compute_capability;
  const bool too_new = max_compute_capability > 0 && device.compute_capability > max_compute_capability;
  if (!too_old && !too_new) return std::nullopt;
  std::string needs = "compute capability " + compute_capability_text(min_compute_capability);
  if (max_compute_capability == 0) {
    needs += " or newer";
  } else if (max_compute_capability == min_compute_capability) {
    needs += " exactly (its code is built for that GPU family alone)";
  } else {
    needs += " to " + compute_capability_text(max_compute_capability);
  }
  return id + " needs a GPU of " + needs + "; this GPU, " + device.name + ", is " +
         compute_capability_text(device.compute_capability);
}

std::optional<std::string> StepInfo::refuses(const Shape& shape, const DeviceLimits& device) const {
  if (auto reason = refuses(shape)) return reason;
  if (auto reason = refuses_device(device)) return reason;
  const Shape probe{shape.batch, shape.heads, std::min(shape.tokens, kLargestTokensProbed),
                    shape.head_dim, shape.dtype,
                    shape.cross() ? std::min(shape.keys(), kLargestTokensProbed) : 0,
                    shape.key_padding, shape.causal};
  const std::size_t needed = shared_bytes_for(probe);
  if (needed <= device.shared_bytes_per_block) return std::nullopt;
  const std::string needs = "it needs " + std::to_string(needed) +
                            " bytes of shared memory per block, " + device.name + " allows " +
                            std::to_string(device.shared_bytes_per_block);
  const std::optional<int64_t> largest = max_tokens(shape.head_dim, device.shared_bytes_per_block);
  if (largest && *largest == 0) {  // no N fits: the head dim is what this GPU cannot serve
    return id + " does not serve --head-dim " + std::to_string(shape.head_dim) +
           " on this GPU: at any N " + needs;
  }
  return id + " does not serve --tokens " + std::to_string(shape.tokens) + " on this GPU: " +
         needs + " (the largest N it serves here is " + std::to_string(largest.value_or(0)) + ")";
}

std::optional<int64_t> StepInfo::max_tokens(int64_t head_dim, std::size_t shared_budget) const {
  auto fits = [&](int64_t tokens) {
    return shared_bytes_for(Shape{1, 1, tokens, head_dim}) <= shared_budget;
  };
  if (fits(kLargestTokensProbed)) return std::nullopt;
  if (!fits(1)) return 0;
  int64_t fitting = 1, too_many = kLargestTokensProbed;  // shared memory never shrinks as N grows
  while (too_many - fitting > 1) {
    const int64_t middle = fitting + (too_many - fitting) / 2;
    (fits(middle) ? fitting : too_many) = middle;
  }
  return fitting;
}

bool register_step(StepInfo info) {
  if (find_step(info.id) != nullptr) throw std::logic_error("step registered twice: " + info.id);
  registry().push_back(std::move(info));
  std::stable_sort(registry().begin(), registry().end(), comes_before);
  return true;
}

const std::vector<StepInfo>& registered_steps() { return registry(); }

const StepInfo* find_step(const std::string& id) {
  for (const StepInfo& step : registry()) {
    if (step.id == id) return &step;
  }
  return nullptr;
}

}  // namespace attn
