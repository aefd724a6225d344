#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "ceilings.hpp"
#include "cuda_check.hpp"
#include "device_buffer.hpp"
#include "timing.hpp"

namespace attn {
namespace {

// Fills a buffer with values in [-1, 1) from a hash of the index: random enough to keep the
// tensor cores honest (zeros run faster than real data).
__global__ void fill_hashed(__half* data, int64_t count) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  uint32_t x = uint32_t(i) * 0x9e3779b9u;
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  data[i] = __float2half(float(x & 0xffff) / 32768.0f - 1.0f);
}

double copy_bandwidth_gbps(cudaStream_t stream) {
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t bytes = std::min<std::size_t>(std::size_t(1) << 30, free_bytes / 4);
  DeviceBuffer<char> source(bytes), target(bytes);
  CUDA_CHECK(cudaMemsetAsync(source.data(), 1, bytes, stream));
  const TimingStats stats = time_launches(
      [&](int) {
        CUDA_CHECK(cudaMemcpyAsync(target.data(), source.data(), bytes, cudaMemcpyDeviceToDevice,
                                   stream));
      },
      stream, 3, 20);
  return 2.0 * double(bytes) / (stats.median_us * 1e-6) / 1e9;
}

double tensor_core_tflops(cudaStream_t stream) {
  constexpr int kSize = 8192;
  const int64_t count = int64_t(kSize) * kSize;
  DeviceBuffer<__half> a(count), b(count), c(count);
  fill_hashed<<<unsigned((count + 255) / 256), 256, 0, stream>>>(a.data(), count);
  CUDA_CHECK_LAUNCH();
  fill_hashed<<<unsigned((count + 255) / 256), 256, 0, stream>>>(b.data(), count);
  CUDA_CHECK_LAUNCH();

  cublasHandle_t handle = nullptr;
  CUBLAS_CHECK(cublasCreate(&handle));
  struct HandleGuard {
    cublasHandle_t handle;
    ~HandleGuard() { cublasDestroy(handle); }
  } guard{handle};
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float alpha = 1.0f, beta = 0.0f;
  const TimingStats stats = time_launches(
      [&](int) {
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kSize, kSize, kSize, &alpha,
                                  a.data(), CUDA_R_16F, kSize, b.data(), CUDA_R_16F, kSize, &beta,
                                  c.data(), CUDA_R_16F, kSize, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      },
      stream, 3, 10);
  return 2.0 * double(kSize) * kSize * kSize / (stats.median_us * 1e-6) / 1e12;
}

}  // namespace

int require_cuda_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();  // this call's own error: leave nothing pending behind
    throw CudaError(std::string("no CUDA device found (") +
                    (status == cudaSuccess ? "the driver reports 0 devices"
                                           : cudaGetErrorString(status)) +
                    "); run this on a machine with an NVIDIA GPU");
  }
  return count;
}

GpuInfo open_device(int device) {
  const int count = require_cuda_device();
  if (device >= count) {
    throw CudaError("--device " + std::to_string(device) + ": there are only " +
                    std::to_string(count) + " CUDA device(s)");
  }
  CUDA_CHECK(cudaSetDevice(device));
  return describe_device(device);
}

GpuInfo describe_device(int device) {
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  int shared_optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  GpuInfo gpu{properties.name, properties.multiProcessorCount, properties.l2CacheSize,
              properties.major * 10 + properties.minor, std::size_t(shared_optin)};
  const DeviceLimits limits = with_testing_aids(gpu.limits());
  gpu.name = limits.name;
  gpu.compute_capability = limits.compute_capability;
  gpu.shared_bytes_per_block = limits.shared_bytes_per_block;
  return gpu;
}

// A variable that is set lowers a limit (never raises it), and the name says so.
DeviceLimits with_testing_aids(DeviceLimits limits) {
  std::string lowered;
  auto lower = [&](const char* variable, auto& limit) {
    const char* text = std::getenv(variable);
    if (text == nullptr || *text == '\0') return;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (*end != '\0' || value < 0) {
      throw CudaError(std::string(variable) + "='" + text + "' is not a non-negative integer");
    }
    using Limit = std::decay_t<decltype(limit)>;
    if (Limit(value) < limit) {
      limit = Limit(value);
      lowered += std::string(lowered.empty() ? "" : ", ") + variable + "=" + text;
    }
  };
  lower("ATTN_TEST_SHARED_MEMORY_BYTES", limits.shared_bytes_per_block);
  lower("ATTN_TEST_COMPUTE_CAPABILITY", limits.compute_capability);
  if (!lowered.empty()) limits.name += " [limits lowered by " + lowered + "]";
  return limits;
}

int persistent_blocks_testing_aid() {
  const char* text = std::getenv("ATTN_TEST_PERSISTENT_BLOCKS");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 1 || value > INT32_MAX) {
    throw CudaError(std::string("ATTN_TEST_PERSISTENT_BLOCKS='") + text +
                    "' is not a positive integer");
  }
  return int(value);
}

Ceilings measure_ceilings() {
  const Stream owned_stream;
  const cudaStream_t stream = owned_stream.get();
  Ceilings ceilings;
  ceilings.copy_gbps = copy_bandwidth_gbps(stream);
  ceilings.tensor_tflops = tensor_core_tflops(stream);
  return ceilings;
}

}  // namespace attn
