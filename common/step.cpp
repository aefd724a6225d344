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
  if (a.kind != b.kind) return a.kind == StepKind::step;
  auto number = [](const std::string& id) {
    return id.size() > 1 && id[0] == 'v' ? std::stoi(id.substr(1)) : 0;
  };
  if (a.kind == StepKind::step && number(a.id) != number(b.id)) return number(a.id) < number(b.id);
  return a.id < b.id;
}

std::string join(const std::vector<int>& values) {
  std::string text;
  for (int value : values) text += (text.empty() ? "" : ", ") + std::to_string(value);
  return text;
}

}  // namespace

std::optional<std::string> StepInfo::refuses(const Shape& shape) const {
  if (std::find(head_dims.begin(), head_dims.end(), shape.head_dim) == head_dims.end()) {
    return id + " does not serve --head-dim " + std::to_string(shape.head_dim) +
           " (it serves head dims " + join(head_dims) + ")";
  }
  if (max_tokens > 0 && shape.tokens > max_tokens) {
    return id + " does not serve --tokens " + std::to_string(shape.tokens) + " (it serves N <= " +
           std::to_string(max_tokens) + "; its chapter says why)";
  }
  return std::nullopt;
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
