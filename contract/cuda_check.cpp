#include "cuda_check.hpp"

#include <sstream>

namespace attn {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  std::ostringstream message;
  message << "CUDA error " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status)
          << ") in " << call << " at " << file << ":" << line;
  throw CudaError(message.str());
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  std::ostringstream message;
  message << "cuBLAS error " << cublasGetStatusName(status) << " in " << call << " at " << file
          << ":" << line;
  throw CudaError(message.str());
}

}  // namespace attn
