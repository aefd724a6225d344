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

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda_check.hpp"
#include "step.hpp"
#include "ampere/fragment_math.cuh"

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

// ---- The wgmma instructions, one overload per accumulator length ---------------------------------
// Each is a template on the element type of A and B, __half (the default) or __nv_bfloat16: the
// instruction names its types (.f16.f16 or .bf16.bf16) and nothing else changes, so its asm
// statement is written once, as the macro HOPPER_WGMMA(TYPES), and HOPPER_WGMMA_FOR picks the
// types.
#define HOPPER_WGMMA_FOR(Element)                          \
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) { \
    HOPPER_WGMMA(".bf16.bf16");                            \
  } else {                                                 \
    static_assert(std::is_same_v<Element, __half>);        \
    HOPPER_WGMMA(".f16.f16");                              \
  }
// The N of the SS (shared x shared) overloads below: a tile of keys must be one of these.
constexpr bool has_wgmma_ss(int n) {
  return n == 32 || n == 64 || n == 128 || n == 144 || n == 160 || n == 176 || n == 192 ||
         n == 208;
}

// A warpgroup's 64 x N fp32 accumulator is N/2 registers per thread. Thread t (warp w = t / 32 of
// the group, lane l) holds, for each 8-column block i, d[4i + 0, 1] = row 16w + l/4, columns
// 8i + 2(l%4) + {0, 1}, and d[4i + 2, 3] the same columns of row 16w + l/4 + 8: the layout of
// mma.sync's m16n8 accumulator, one per warp. PTX names every accumulator register, so the
// operand lists are long; the array's length picks the instruction. `accumulate` false means
// D = A * B (the old contents are ignored), true means D += A * B.
// D[64 x 32] and D[64 x 64] (+)= A * B, both operands in shared memory, K-major (kMNMajor false:
// A * B^T, as the wider overloads below) or both MN-major (true: imm-trans-a and imm-trans-b, as
// v10's dQ = dS K reads dS^T and K from tiles whose rows are the k dimension).
template <typename Element = __half, bool kMNMajor = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " {"                                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                     \
      "}, %16, %17, p, 1, 1, %19, %19;\n}\n"                                                                     \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])     \
      : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(kMNMajor)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}
template <typename Element = __half, bool kMNMajor = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " {"                                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                           \
      "}, %32, %33, p, 1, 1, %35, %35;\n}\n"                                                                     \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])   \
      : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(kMNMajor)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 128] (+)= A * B^T, A and B K-major in shared memory: m64n128k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32" TYPES " {"                                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                           \
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                         \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])   \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 144] (+)= A * B^T, A and B K-major in shared memory: m64n144k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_ss(float (&d)[72], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n144k16.f32" TYPES " {"                                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                         \
      "%64, %65, %66, %67, %68, %69, %70, %71"                                                                   \
      "}, %72, %73, p, 1, 1, 0, 0;\n}\n"                                                                         \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])   \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 160] (+)= A * B^T, A and B K-major in shared memory: m64n160k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_ss(float (&d)[80], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n160k16.f32" TYPES " {"                                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                         \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"                           \
      "}, %80, %81, p, 1, 1, 0, 0;\n}\n"                                                                         \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])   \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 176] (+)= A * B^T, A and B K-major in shared memory: m64n176k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_ss(float (&d)[88], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n176k16.f32" TYPES " {"                                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                         \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                         \
      "%80, %81, %82, %83, %84, %85, %86, %87"                                                                   \
      "}, %88, %89, p, 1, 1, 0, 0;\n}\n"                                                                         \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])   \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 192] (+)= A * B^T, A and B K-major in shared memory: m64n192k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_ss(float (&d)[96], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n192k16.f32" TYPES " {"                                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                         \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                         \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"                           \
      "}, %96, %97, p, 1, 1, 0, 0;\n}\n"                                                                         \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),  \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])   \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 208] (+)= A * B^T, A and B K-major in shared memory: m64n208k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_ss(float (&d)[104], uint64_t a, uint64_t b, bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                         \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %106, 0;\n"                                                                 \
      "wgmma.mma_async.sync.aligned.m64n208k16.f32" TYPES " {"                                                      \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                      \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                            \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                            \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                            \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                            \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                            \
      "%96, %97, %98, %99, %100, %101, %102, %103"                                                                  \
      "}, %104, %105, p, 1, 1, 0, 0;\n}\n"                                                                          \
      :                                                                                                             \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),             \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),       \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),     \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),     \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),     \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),     \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),     \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),     \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),     \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),     \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),     \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),     \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])  \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 32] (+)= A * B, A in registers (the m16n8k16 A layout per warp), B MN-major in
// shared memory (transposed: imm-trans-b = 1): m64n32k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                   \
  asm volatile(                                                                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                            \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " {"                                                 \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                  \
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"                                                        \
      :                                                                                                       \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 64] (+)= A * B, A in registers (the m16n8k16 A layout per warp), B MN-major in
// shared memory (transposed: imm-trans-b = 1): m64n64k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " {"                                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                           \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                           \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 96] (+)= A * B, A in registers (the m16n8k16 A layout per warp), B MN-major in
// shared memory (transposed: imm-trans-b = 1): m64n96k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_rs(float (&d)[48], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n96k16.f32" TYPES " {"                                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"                           \
      "}, {%48, %49, %50, %51}, %52, p, 1, 1, 1;\n}\n"                                                           \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

// D[64 x 128] (+)= A * B, A in registers (the m16n8k16 A layout per warp), B MN-major in
// shared memory (transposed: imm-trans-b = 1): m64n128k16.
template <typename Element = __half>
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
#define HOPPER_WGMMA(TYPES)                                                                                      \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32" TYPES " {"                                                   \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                           \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                           \
      :                                                                                                          \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
  HOPPER_WGMMA_FOR(Element);
#undef HOPPER_WGMMA
}

}  // namespace hopper
