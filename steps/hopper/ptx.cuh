// Hopper's instructions for feeding the tensor cores, as thin wrappers over PTX (sm_90a), shared
// by the Hopper steps. Each wrapper is one instruction; chapter 09 explains them in order:
//
//   tensor maps        the host describes a [B, H, N, D] tensor once; the copy engine (TMA) then
//                      moves whole boxes of it, zero-filling rows past the end of a slice
//   mbarrier           a shared-memory barrier that counts arrivals and bytes: a TMA copy
//                      "completes a transaction" on it, a waiting thread spins on its phase bit
//   async proxy        TMA and wgmma read and write shared memory through the async proxy: ordinary
//                      stores that they read next need fence.proxy.async first
//   wgmma              a warpgroup (4 warps, 128 threads) multiplies a 64-row tile: A from shared
//                      memory or registers, B from shared memory through a 64-bit descriptor,
//                      fp32 accumulators in registers; issued asynchronously, awaited in groups
//   setmaxnreg         a warpgroup gives registers back to the pool, or takes them from it
//   griddepcontrol     a kernel launched as a dependent starts while the one before it finishes,
//                      and waits for that one's writes only where it reads them (chapter 17)
//
// The typed pieces built on them are beside this file: layout.cuh (the swizzled tile layout and
// the matrix descriptors), pipeline.cuh (rings of stages, wgmma groups, the O staging buffer,
// named barriers) and checked.cuh (what the checked build adds). Steps include hopper.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: no libcuda link, see tensor_map())
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda_check.hpp"
#include "step.hpp"
#include "ampere/fragment_math.cuh"
#include "hopper/wgmma.cuh"

namespace hopper {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Step 6's helpers: fp16 (or bf16) pairs for the A operand, 2^x in one instruction, a row's
// log-sum-exp.
using fragment_math::fast_exp2;
using fragment_math::log_sum_exp;
using fragment_math::pack_half2;
using fragment_math::pack_pair;

// ---- Tensor maps (host) ------------------------------------------------------------------------

// The driver's cuTensorMapEncodeTiled, reached through the runtime so nothing links libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      throw attn::CudaError("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver for CUDA 12 or newer)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

// A [B, H, N, D] tensor of `dtype` (fp16 or bf16) whose rows of D values are contiguous (`strides` in elements:
// between batches, heads and tokens; a packed view works as well as a contiguous tensor) as
// boxes of box_rows tokens by box_columns columns of one (b, h), swizzled in shared memory as
// `swizzle` says (CU_TENSOR_MAP_SWIZZLE_128B, _64B or _32B; box_columns * 2 bytes must equal the
// swizzle's width). A box that reaches past token N - 1 is zero-filled on loads and clipped on
// stores: tails need no masks.
inline CUtensorMap tensor_map(const void* base, attn::DType dtype, int batch, int heads, int tokens,
                              int head_dim, attn::TensorStrides strides, int box_rows,
                              int box_columns, CUtensorMapSwizzle swizzle) {
  const bool aligned = reinterpret_cast<uintptr_t>(base) % 16 == 0 && strides.batch % 8 == 0 &&
                       strides.head % 8 == 0 && strides.token % 8 == 0;
  if (!aligned) {
    throw attn::CudaError("TMA needs 16-byte aligned tensors and strides; this one is not");
  }
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(tokens), cuuint64_t(heads),
                              cuuint64_t(batch)};
  constexpr cuuint64_t kElementBytes = 2;  // fp16 and bf16 alike
  const cuuint64_t byte_strides[3] = {cuuint64_t(strides.token) * kElementBytes,  // dims 1, 2, 3
                                      cuuint64_t(strides.head) * kElementBytes,
                                      cuuint64_t(strides.batch) * kElementBytes};
  const cuuint32_t box[4] = {cuuint32_t(box_columns), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = tensor_map_encoder()(
      &map,
      dtype == attn::DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(base), dims, byte_strides,
      box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw attn::CudaError("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(result)) +
                          ") for a [" + std::to_string(batch) + ", " + std::to_string(heads) + ", " +
                          std::to_string(tokens) + ", " + std::to_string(head_dim) + "] tensor");
  }
  return map;
}

// ---- mbarrier ----------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)),
               "r"(arrivals));
}

// Makes initialised barriers visible to the async proxy (the copy engine completes on them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier))
               : "memory");
}

// One arrival, and `bytes` more that copies must deliver before the phase can complete.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

// Whether the phase with this parity has completed; the instruction itself waits a little
// (a hardware time limit) before it answers no. A barrier starts in phase 0, and the phase
// before it (parity 1) counts as complete: a producer's first wait for a free slot passes.
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* barrier, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n.reg .pred complete;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
      "selp.u32 %0, 1, 0, complete;\n}\n"
      : "=r"(done)
      : "r"(shared_address(barrier)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits until the phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  bool done = false;
  do {
    done = mbarrier_try_wait(barrier, parity);
  } while (!done);
}

// ---- The copy engine (TMA) and the async proxy -------------------------------------------------

// The box at (column, token) of head `head` of batch `batch` of the tensor into shared memory;
// its bytes complete a transaction on `barrier`.
__device__ __forceinline__ void tma_load(void* destination, const CUtensorMap* map,
                                         uint64_t* barrier, int column, int token, int head,
                                         int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(barrier)), "r"(column), "r"(token),
      "r"(head), "r"(batch)
      : "memory");
}

// Shared memory into the box at (column, token, head, batch); tokens past N are not written.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* source, int column,
                                          int token, int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(shared_address(source)), "r"(column), "r"(token), "r"(head), "r"(batch)
      : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until the committed stores have read their shared memory (it may be written again).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Until the committed stores are complete.
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned) from global into
// shared memory, completing a transaction on `barrier`: the 1-D bulk copy, for a tile's row
// vector (v10's L and D), which needs no tensor map.
__device__ __forceinline__ void bulk_load(void* destination, const void* source, uint32_t bytes,
                                          uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(source)), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
}

// Adds `bytes` of fp32 values in shared memory into global memory, element by element, in L2
// (the copy engine's reduce-add: no atomics issued by threads). A bulk group, like tma_store:
// tma_store_commit, then tma_store_wait_read before the source is written again.
__device__ __forceinline__ void bulk_reduce_add(float* destination, const float* source,
                                                uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
          reinterpret_cast<uint64_t>(destination)),
      "r"(shared_address(source)), "r"(bytes)
      : "memory");
}

// Ordinary shared-memory stores by this thread become visible to the async proxy (TMA, wgmma).
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A barrier among `threads` threads (a multiple of 32) with id 1..15 (0 is __syncthreads):
// sync waits until `threads` threads have arrived, counting itself; arrive counts itself and
// goes on. pipeline.cuh names the ids the steps use (NamedBarrier).
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ------------------------------------------------------------------------------------
// The operands in shared memory are named by 64-bit matrix descriptors (layout.cuh).

// Orders this warpgroup's register accesses before the wgmma that follow (accumulators, A).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Tells the compiler that registers an asynchronous wgmma reads or writes change here, so it
// neither moves their uses across this point nor reuses them while the wgmma runs.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&registers)[kCount]) {
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(registers[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void fence_registers(uint32_t (&registers)[kCount]) {
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(registers[i])::"memory");
}

// ---- Register reallocation (warp specialization, v8) --------------------------------------------

template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- Programmatic dependent launch (the frame of step 10) ----------------------------------------
// Two kernels in a stream normally run one after the other: the second is launched once the first
// has finished, its blocks start on empty SMs. Launched with launch_dependent, the second kernel's
// blocks may start (set up their barriers, claim registers) while the first one's last blocks still
// run; before reading anything the first one wrote, the second waits for it to finish and its
// writes to be visible (wait_for_previous_grid). The first lets that happen once each of its blocks
// has started (allow_dependent_launch): its blocks are then all on the GPU, so the waiting blocks of
// the second never keep one of them from starting.
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
template <typename... KernelParameters, typename... Arguments>
void launch_dependent(void (*kernel)(KernelParameters...), unsigned blocks, unsigned threads,
                      std::size_t shared_bytes, cudaStream_t stream, Arguments&&... arguments) {
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...));
}

// ---- The wgmma instructions: one template over N ---------------------------------------------
// A warpgroup's 64 x N fp32 accumulator is N/2 registers per thread. Thread t (warp w = t / 32 of
// the group, lane l) holds, for each 8-column block i, d[4i + 0, 1] = row 16w + l/4, columns
// 8i + 2(l%4) + {0, 1}, and d[4i + 2, 3] the same columns of row 16w + l/4 + 8: the layout of
// mma.sync's m16n8 accumulator, one per warp. PTX names every accumulator register, so each N has
// its asm statement written out, in wgmma.cuh, which scripts/gen_wgmma.py generates for N = 16,
// 32, ..., 256; the array's length picks it. `accumulate` false means D = A * B (the old contents
// are ignored), true means D += A * B.

// The N a wgmma below takes: a tile of keys or a head dim must be one of these.
constexpr bool has_wgmma(int n) { return wgmma_shapes::generated(n); }

// D[64 x N] (+)= A * B, both operands in shared memory, N = 2 x the accumulator's length. K-major
// (kMNMajor false: A * B^T, as S = Q K^T reads Q and K) or both MN-major (true: imm-trans-a and
// imm-trans-b, as v10's dQ = dS K reads dS^T and K from tiles whose rows are the k dimension).
template <typename Element = __half, bool kMNMajor = false, int kRegisters>
__device__ __forceinline__ void wgmma_ss(float (&d)[kRegisters], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(has_wgmma(2 * kRegisters), "no wgmma of this N: add it in scripts/gen_wgmma.py");
  wgmma_shapes::Shape<2 * kRegisters>::template ss<Element, kMNMajor, kMNMajor>(d, a, b, accumulate);
}

// D[64 x N] (+)= A * B, A in registers (the m16n8k16 A layout per warp, as P is packed), B
// MN-major in shared memory (imm-trans-b = 1: V's rows, the keys, are the k dimension).
template <typename Element = __half, int kRegisters>
__device__ __forceinline__ void wgmma_rs(float (&d)[kRegisters], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
  static_assert(has_wgmma(2 * kRegisters), "no wgmma of this N: add it in scripts/gen_wgmma.py");
  wgmma_shapes::Shape<2 * kRegisters>::template rs<Element, 1>(d, a, b, accumulate);
}

}  // namespace hopper
