// The GPU's two ceilings, measured once per run on the GPU at hand rather than typed in from a
// datasheet: device-memory bandwidth (a large device-to-device copy, bytes read + written) and
// the fp16 tensor-core rate (a large cuBLAS GEMM, fp16 in, fp32 accumulate, random data).
#pragma once

#include <string>

namespace attn {

struct GpuInfo {
  std::string name;
  int sm_count = 0;
  int l2_bytes = 0;
  int compute_capability = 0;  // e.g. 90
};

struct Ceilings {
  double copy_gbps = 0;       // GB/s, 1e9 bytes
  double tensor_tflops = 0;   // TFLOP/s, 1e12 FLOPs
};

// Selects the device, or throws CudaError ("no CUDA device ...") with one clear line.
GpuInfo open_device(int device);
Ceilings measure_ceilings();

}  // namespace attn
