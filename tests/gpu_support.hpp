// Shared by the GPU suite: the step chosen with --step=ID on the command line.
#pragma once

#include "step.hpp"

const attn::StepInfo& step_under_test();
