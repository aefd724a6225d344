// The GPU's two ceilings, measured once per run on the GPU at hand rather than typed in from a
// datasheet: device-memory bandwidth (a large device-to-device copy, bytes read + written) and
// the fp16 tensor-core rate (a large cuBLAS GEMM, fp16 in, fp32 accumulate, random data).
#pragma once

#include <cstddef>
#include <string>

#include "step.hpp"

namespace attn {

struct GpuInfo {
  std::string name;
  int sm_count = 0;
  int l2_bytes = 0;
  int compute_capability = 0;              // e.g. 90
  std::size_t shared_bytes_per_block = 0;  // opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin)

  DeviceLimits limits() const { return {name, compute_capability, shared_bytes_per_block}; }
};

struct Ceilings {
  double copy_gbps = 0;       // GB/s, 1e9 bytes
  double tensor_tflops = 0;   // TFLOP/s, 1e12 FLOPs
};

// Throws CudaError "no CUDA device found (...)" with one clear line when the CUDA runtime sees
// no device (leaving no error pending behind); returns the device count otherwise.
int require_cuda_device();
// Selects the device and reads what it is, or throws CudaError ("no CUDA device ...") with one
// clear line. Testing aids, to see a step refuse as it would on a smaller GPU: the environment
// variables ATTN_TEST_SHARED_MEMORY_BYTES and ATTN_TEST_COMPUTE_CAPABILITY (e.g. 101376, 80)
// lower the limits read off the device (never raise them), and the GPU's name then says so.
GpuInfo open_device(int device);
// The same facts (testing aids included) about an existing device, without selecting it.
GpuInfo describe_device(int device);
// The testing aids above, applied to any limits (bench --list applies them to the H100 it
// assumes when there is no GPU). Throws CudaError when a variable is not a non-negative integer.
DeviceLimits with_testing_aids(DeviceLimits limits);
// The testing aid ATTN_TEST_PERSISTENT_BLOCKS (e.g. 4): at most that many blocks for a step
// with persistent blocks (AttentionArgs::max_persistent_blocks), so that each block walks several
// work tiles whatever the GPU's SM count; 0 when unset. Throws CudaError unless it is a positive
// integer.
int persistent_blocks_testing_aid();
// What bench --list assumes when there is no GPU: an H100's limits.
inline DeviceLimits h100_limits() { return {"NVIDIA H100", 90, 232448}; }
Ceilings measure_ceilings();

}  // namespace attn
