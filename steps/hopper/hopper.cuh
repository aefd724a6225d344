// Everything a Hopper step includes: the PTX wrappers (ptx.cuh), the swizzled layout and matrix
// descriptors (layout.cuh), the pipeline pieces (pipeline.cuh) and the checked build
// (checked.cuh). Chapter 09 explains the instructions, chapters 10 and 11 the pipeline and its checks.
#pragma once

#include "hopper/checked.cuh"
#include "hopper/layout.cuh"
#include "hopper/pipeline.cuh"
#include "hopper/ptx.cuh"
