// What every step executable does, as a function the tests can call: parse the command line,
// refuse what the step cannot serve, run, check, report. Returns the exit code:
//   0 passed (or --check none), 1 check failed, 2 usage error, 3 CUDA or runtime error.
// Every error is one line on `err`.
#pragma once

#include <ostream>

#include "step.hpp"

namespace attn {

enum ExitCode { kExitPassed = 0, kExitCheckFailed = 1, kExitUsage = 2, kExitRuntime = 3 };

int run_step_program(const StepInfo& step, int argc, const char* const* argv, std::ostream& out,
                     std::ostream& err);

}  // namespace attn
