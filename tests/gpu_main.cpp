// The GPU suite's main: gpu_tests --step=ID [doctest options]. Without a CUDA device, or on a GPU
// the step cannot run on (its compute capability), it says so and exits 77, which ctest reports
// as skipped (SKIP_RETURN_CODE), never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <cuda_runtime.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "ceilings.hpp"
#include "cuda_check.hpp"
#include "gpu_support.hpp"
#include "runner.hpp"

namespace {
const attn::StepInfo* selected = nullptr;
attn::DeviceLimits device;
constexpr int kSkipped = 77;
}  // namespace

const attn::StepInfo& step_under_test() { return *selected; }
const attn::DeviceLimits& device_under_test() { return device; }

int main(int argc, char** argv) {
  std::string id;
  std::vector<char*> doctest_args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--step=", 7) == 0) {
      id = argv[i] + 7;
    } else {
      doctest_args.push_back(argv[i]);
    }
  }
  selected = attn::find_step(id);
  if (selected == nullptr) {
    std::cerr << "gpu_tests: --step=ID names no registered step ('" << id << "')\n";
    return 2;
  }
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::cout << "SKIPPED: no CUDA device ("
              << (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status))
              << "); the GPU suite for " << id << " did not run\n";
    return kSkipped;
  }
  try {
    device = attn::open_device(0).limits();
  } catch (const attn::CudaError& error) {
    std::cerr << "gpu_tests: " << error.what() << "\n";
    return 3;
  }
  // A GPU the step's instructions do not run on: skipped with the reason, never passed or failed.
  if (auto reason = selected->refuses_device(device)) {
    std::cout << "SKIPPED: " << *reason << "; the GPU suite for " << id << " did not run\n";
    return kSkipped;
  }
  // A backward step runs the backward suite (test_backward_gpu.cpp), every other step the rest.
  std::string suite_filter = attn::is_backward(selected->kind)
                                 ? "--test-suite=backward" : "--test-suite-exclude=backward";
  doctest_args.push_back(suite_filter.data());
  doctest::Context context(int(doctest_args.size()), doctest_args.data());
  const int result = context.run();
  attn::exit_if_gpu_hung(result);  // a hung step: exit without waiting for its kernel
  return result;
}
