// Shared by the GPU suite: the step chosen with --step=ID on the command line, and the limits of
// the GPU it runs on (what the harness judges refusals against).
#pragma once

#include "step.hpp"

const attn::StepInfo& step_under_test();
const attn::DeviceLimits& device_under_test();
