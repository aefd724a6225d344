// The C++ type behind a DType, for launches that instantiate a kernel per element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "problem.hpp"

namespace attn {

// Calls body(__half{}) or body(__nv_bfloat16{}), as `dtype` says; the body takes
// decltype(element) as its kernel's element type.
template <typename Body>
void with_element_type(DType dtype, Body&& body) {
  if (dtype == DType::bf16) {
    body(__nv_bfloat16{});
  } else {
    body(__half{});
  }
}

}  // namespace attn
