// What every step executable does, as a function the tests can call: parse the command line,
// refuse what the step cannot serve, run, check, report. Returns the exit code:
//   0 passed (or --check none), 1 check failed, 2 usage error, 3 CUDA or runtime error.
// Every error is one line on `err`.
#pragma once

#include <ostream>

#include "ceilings.hpp"
#include "step.hpp"

namespace attn {

enum ExitCode { kExitPassed = 0, kExitCheckFailed = 1, kExitUsage = 2, kExitRuntime = 3 };

// `open` selects the device and says what it is: open_device, or in a CPU test a stand-in for
// a GPU that is not there (its refusals need no device; anything past them does).
int run_step_program(const StepInfo& step, int argc, const char* const* argv, std::ostream& out,
                     std::ostream& err, GpuInfo (*open)(int device) = open_device);

}  // namespace attn
