// The one main() of every step executable: stepN links exactly one step, found in the registry.
#include <iostream>

#include "runner.hpp"
#include "step_program.hpp"

int main(int argc, char** argv) {
  const auto& steps = attn::registered_steps();
  if (steps.size() != 1) {
    std::cerr << argv[0] << ": built with " << steps.size() << " steps; expected exactly one\n";
    return attn::kExitRuntime;
  }
  const int status = attn::run_step_program(steps.front(), argc, argv, std::cout, std::cerr);
  attn::exit_if_gpu_hung(status);
  return status;
}
