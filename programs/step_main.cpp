// The one main() of every step executable: stepN links exactly one step, found in the registry
// (a backward step's executable also links the forward step it runs first: it runs the backward).
#include <iostream>

#include "runner.hpp"
#include "step_program.hpp"

int main(int argc, char** argv) {
  const auto& steps = attn::registered_steps();
  const attn::StepInfo* chosen = steps.size() == 1 ? &steps.front() : nullptr;
  for (const attn::StepInfo& step : steps) {
    if (step.kind == attn::StepKind::backward && steps.size() == 2) chosen = &step;
  }
  if (chosen == nullptr) {
    std::cerr << argv[0] << ": built with " << steps.size()
              << " steps; expected one (or a backward step and its forward)\n";
    return attn::kExitRuntime;
  }
  const int status = attn::run_step_program(*chosen, argc, argv, std::cout, std::cerr);
  attn::exit_if_gpu_hung(status);
  return status;
}
