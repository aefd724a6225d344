// Checked CUDA and cuBLAS calls. A failing call throws CudaError with the call, the file and
// line, and the runtime's own message; the executables turn it into one line and exit code 3.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace attn {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// GPU work that did not finish within its limit (a kernel waiting on a barrier no one completes).
// The kernel still runs, so the GPU stays busy: nothing that waits for the device may follow.
class GpuHang : public CudaError {
 public:
  using CudaError::CudaError;
};

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

}  // namespace attn

#define CUDA_CHECK(call)                                                    \
  do {                                                                      \
    const cudaError_t status_ = (call);                                     \
    if (status_ != cudaSuccess) {                                           \
      ::attn::throw_cuda_error(status_, #call, __FILE__, __LINE__);         \
    }                                                                       \
  } while (0)

// After a kernel launch: a bad configuration shows up here, a fault at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                  \
  do {                                                                      \
    const cublasStatus_t status_ = (call);                                  \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                 \
      ::attn::throw_cublas_error(status_, #call, __FILE__, __LINE__);       \
    }                                                                       \
  } while (0)
