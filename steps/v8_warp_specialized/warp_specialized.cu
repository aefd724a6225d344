// Step v8: warp specialization. v7 gave every warpgroup two jobs, copying and computing, and
// made all of them meet at a __syncthreads after every K/V tile, so the tensor cores sat idle
// while the softmax ran and while the block waited for its slowest warp. Here each warpgroup
// has one job and the jobs talk only through mbarriers:
//
//   - a producer warpgroup whose one thread issues every TMA copy, running ahead of the math
//     as far as the shared-memory stages allow. It needs few registers, and gives them up
//     (setmaxnreg.dec) to the two consumer warpgroups, which take them (setmaxnreg.inc);
//   - two consumer warpgroups, 64 query rows each, that only compute. Each tells the producer
//     when it has finished with a K/V stage or a Q buffer ("empty" barriers, the reverse of v7's
//     "full" ones), so a stage is refilled the moment both are done with it, not at a barrier
//     of the whole block;
//   - inside each consumer, the next tile's S = Q K^T is issued before this tile's softmax, and
//     P V of the previous tile runs on the tensor cores while the softmax of the next runs on
//     the other units (intra-warpgroup overlap). The K/V tiles are visited last to first, so
//     the only partial tile, the last, is the first one, peeled off the loop with its mask;
//   - persistent blocks: one per SM, each walking a list of (slice, 128-row tile) work tiles.
//     The producer loads the next tile's Q (double-buffered) and K/V while the consumers finish
//     the current one, and O leaves through a staging buffer and an asynchronous TMA store.
//
// Serves head dims 64 and 128; tile sizes per head dim chosen by measurement (chapter 10).
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda_check.hpp"
#include "step.hpp"
#include "v7_tma_wgmma/hopper.cuh"

namespace {

__device__ __forceinline__ uint32_t pack_half2(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- Tile geometry and shared memory --------------------------------------------------------

template <int kHeadDim, int kBlockN_, int kStages_>
struct Tiles {
  static constexpr int kConsumers = 2;                 // consumer warpgroups
  static constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 is the producer
  static constexpr int kBlockM = 64 * kConsumers;      // query rows per work tile
  static constexpr int kBlockN = kBlockN_;             // keys per K and V tile
  static constexpr int kStages = kStages_;             // K/V stages in flight
  static constexpr int kQBuffers = 2;                  // the next tile's Q lands during this one
  static constexpr int kColumnBlocks = kHeadDim / hopper::kSwizzleColumns;
  static constexpr int kDSteps = kHeadDim / 16;
  static constexpr int kKeySteps = kBlockN / 16;
  // Registers per thread after the hand-over: the producer keeps 24, each consumer gets 240
  // (128 * 24 + 256 * 240 = 64,512 of the SM's 65,536).
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(__half);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(__half);
  // Q buffers, O staging, K stages, V stages (multiples of 1024 bytes), then the barriers:
  // q_full, q_empty per Q buffer; kv_full, kv_empty per stage.
  static constexpr uint32_t kOOffset = kQBuffers * kQBytes;
  static constexpr uint32_t kKOffset = kOOffset + kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kKVBytes;
  static constexpr uint32_t kSharedBytes =
      kBarrierOffset + 2 * (kQBuffers + kStages) * sizeof(uint64_t) + 1024;
  static_assert(kHeadDim % hopper::kSwizzleColumns == 0, "whole 64-column swizzle blocks");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma's N: a multiple of 16 up to 256");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep 1024-byte alignment");
};

// Barrier arrivals that free a buffer: one per consumer warp (a warp's wgmma.wait_group covers
// its own share of the warpgroup's instruction, so every warp says it is done).
constexpr uint32_t kConsumerWarps = 8;

// The work tiles of a launch, walked the same way by the producer and the consumers.
struct WorkTile {
  int slice, row0;
};
__device__ __forceinline__ WorkTile work_tile(int index, int row_tiles, int block_m) {
  return {index / row_tiles, (index % row_tiles) * block_m};  // neighbours share a slice's K, V
}

// ---- The kernel -----------------------------------------------------------------------------

// A thread of consumer c holds two rows of c's 64 (hopper.cuh gives the accumulator layout):
// row lane/4 of its warp's 16 ("half" 0) and that row + 8 (half 1), a quarter of their columns.
template <int kHeadDim, int kBlockN, int kStages>
__global__ void __launch_bounds__(Tiles<kHeadDim, kBlockN, kStages>::kThreads, 1)
    warp_specialized_attention_kernel(const __grid_constant__ CUtensorMap q_map,
                                      const __grid_constant__ CUtensorMap k_map,
                                      const __grid_constant__ CUtensorMap v_map,
                                      const __grid_constant__ CUtensorMap o_map, int tokens,
                                      int row_tiles, int work_tiles, float scale_log2) {
  using T = Tiles<kHeadDim, kBlockN, kStages>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = shared_raw + (1024 - hopper::shared_address(shared_raw) % 1024) % 1024;
  __half* q_tiles = reinterpret_cast<__half*>(shared);                  // [buffer][column block][kBlockM][64]
  __half* o_stage = reinterpret_cast<__half*>(shared + T::kOOffset);    // [column block][kBlockM][64]
  __half* k_tiles = reinterpret_cast<__half*>(shared + T::kKOffset);    // [stage][column block][kBlockN][64]
  __half* v_tiles = reinterpret_cast<__half*>(shared + T::kVOffset);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(shared + T::kBarrierOffset);
  uint64_t* q_empty = q_full + T::kQBuffers;
  uint64_t* kv_full = q_empty + T::kQBuffers;
  uint64_t* kv_empty = kv_full + kStages;
  constexpr int kQHalves = T::kQBytes / sizeof(__half);
  constexpr int kKVHalves = T::kKVBytes / sizeof(__half);

  const int warp_group = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int kv_tiles = (tokens + kBlockN - 1) / kBlockN;

  if (threadIdx.x == 0) {
    for (int b = 0; b < T::kQBuffers; ++b) {
      hopper::mbarrier_init(&q_full[b], 1);
      hopper::mbarrier_init(&q_empty[b], kConsumerWarps);
    }
    for (int stage = 0; stage < kStages; ++stage) {
      hopper::mbarrier_init(&kv_full[stage], 1);
      hopper::mbarrier_init(&kv_empty[stage], kConsumerWarps);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles meet only at mbarriers

  // Counters shared by both roles' walks: work tiles done by this block, K/V stage uses. The
  // buffer is the counter modulo the buffer count; the phase parity flips each time round.
  if (warp_group == 0) {
    // ---------------- Producer: one thread issues every copy ----------------
    hopper::release_registers<T::kProducerRegisters>();
    if (warp != 0 || lane != 0) return;
    int kv_count = 0;
    for (int index = blockIdx.x, done = 0; index < work_tiles; index += gridDim.x, ++done) {
      const WorkTile tile = work_tile(index, row_tiles, T::kBlockM);
      // BEGIN EXERCISE: load this work tile's Q, then its K/V tiles last to first, each into a free buffer
      const int q_buffer = done % T::kQBuffers;
      hopper::mbarrier_wait(&q_empty[q_buffer], ((done / T::kQBuffers) % 2) ^ 1);
      hopper::mbarrier_arrive_expect_bytes(&q_full[q_buffer], T::kQBytes);
      for (int c = 0; c < T::kColumnBlocks; ++c) {
        hopper::tma_load(q_tiles + q_buffer * kQHalves + c * T::kBlockM * hopper::kSwizzleColumns,
                         &q_map, &q_full[q_buffer], c * hopper::kSwizzleColumns, tile.row0, tile.slice);
      }
      for (int kv_tile = kv_tiles - 1; kv_tile >= 0; --kv_tile, ++kv_count) {
        const int stage = kv_count % kStages;
        hopper::mbarrier_wait(&kv_empty[stage], ((kv_count / kStages) % 2) ^ 1);
        hopper::mbarrier_arrive_expect_bytes(&kv_full[stage], 2 * T::kKVBytes);
        for (int c = 0; c < T::kColumnBlocks; ++c) {
          const int offset = stage * kKVHalves + c * kBlockN * hopper::kSwizzleColumns;
          hopper::tma_load(k_tiles + offset, &k_map, &kv_full[stage], c * hopper::kSwizzleColumns,
                           kv_tile * kBlockN, tile.slice);
          hopper::tma_load(v_tiles + offset, &v_map, &kv_full[stage], c * hopper::kSwizzleColumns,
                           kv_tile * kBlockN, tile.slice);
        }
      }
      // END EXERCISE
    }
    return;
  }

  // ---------------- Consumers: two warpgroups, 64 query rows each ----------------
  hopper::claim_registers<T::kConsumerRegisters>();
  const int consumer = warp_group - 1;
  const int thread_in_group = threadIdx.x % 128;
  const int quad_lane = lane % 4;
  // This warp is done with a buffer: one arrival on its empty barrier.
  auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) hopper::mbarrier_arrive(empty);
  };

  int kv_count = 0;
  for (int index = blockIdx.x, done = 0; index < work_tiles; index += gridDim.x, ++done) {
    const WorkTile tile = work_tile(index, row_tiles, T::kBlockM);
    const int q_buffer = done % T::kQBuffers;
    const int my_row0 = tile.row0 + consumer * 64;

    // A warpgroup whose 64 rows all lie past N (the last tile of N = 1025, say) only keeps the
    // barrier counts: it waits for each stage to fill before releasing it, never running ahead.
    if (my_row0 >= tokens) {
      for (int kv_tile = 0; kv_tile < kv_tiles; ++kv_tile, ++kv_count) {
        const int stage = kv_count % kStages;
        hopper::mbarrier_wait(&kv_full[stage], (kv_count / kStages) % 2);
        release(&kv_empty[stage]);
      }
      hopper::mbarrier_wait(&q_full[q_buffer], (done / T::kQBuffers) % 2);
      release(&q_empty[q_buffer]);
      continue;
    }

    const uint64_t q_descriptor = hopper::matrix_descriptor(
        q_tiles + q_buffer * kQHalves + consumer * 64 * hopper::kSwizzleColumns, 0, 1024);
    float o_acc[kHeadDim / 2] = {};
    float row_max[2] = {-INFINITY, -INFINITY};  // raw score units
    float row_sum[2] = {0.0f, 0.0f};            // this lane's share; the quad's sum at the end
    float s_acc[kBlockN / 2];                   // S, then exp(S - max) in place
    uint32_t p_fragments[T::kKeySteps][4];      // P in fp16: the A operand of P V
    float correction[2];                        // how much O shrinks for the newest tile

    // S = Q K^T for the tile in `stage`, issued and committed, not awaited.
    auto issue_scores = [&](int stage) {
      const uint64_t k_descriptor = hopper::matrix_descriptor(k_tiles + stage * kKVHalves, 0, 1024);
      hopper::wgmma_fence();
      for (int step = 0; step < T::kDSteps; ++step) {
        const uint32_t column_block = step / 4, within_row = (step % 4) * 32;  // bytes
        hopper::wgmma_ss(s_acc,
                         hopper::advance(q_descriptor, column_block * T::kBlockM * 128 + within_row),
                         hopper::advance(k_descriptor, column_block * kBlockN * 128 + within_row),
                         step > 0);
      }
      hopper::wgmma_commit();
    };
    // O += P V for the tile in `stage`, issued and committed, not awaited. Until it completes,
    // neither O nor P (read from registers by the tensor cores) may change.
    auto issue_output = [&](int stage) {
      const uint64_t v_descriptor =
          hopper::matrix_descriptor(v_tiles + stage * kKVHalves, kBlockN * 128, 1024);
      for (int step = 0; step < T::kKeySteps; ++step) hopper::fence_registers(p_fragments[step]);
      hopper::fence_registers(o_acc);
      hopper::wgmma_fence();
      for (int step = 0; step < T::kKeySteps; ++step) {
        hopper::wgmma_rs(o_acc, p_fragments[step], hopper::advance(v_descriptor, step * 16 * 128), true);
      }
      hopper::wgmma_commit();
    };
    auto await_output = [&]() {
      hopper::wgmma_wait<0>();
      hopper::fence_registers(o_acc);
      for (int step = 0; step < T::kKeySteps; ++step) hopper::fence_registers(p_fragments[step]);
    };
    // The online softmax of v6 and v7 on s_acc, in place: the new row maxima and sums, and in
    // `correction` the factor for O, applied once the P V in flight has finished.
    auto softmax = [&]() {
      for (int half = 0; half < 2; ++half) {
        float tile_max = row_max[half];
        for (int i = 0; i < kBlockN / 8; ++i) {
          tile_max = fmaxf(tile_max, fmaxf(s_acc[4 * i + 2 * half], s_acc[4 * i + 2 * half + 1]));
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float max_scaled = tile_max * scale_log2;
        correction[half] = fast_exp2(row_max[half] * scale_log2 - max_scaled);  // 0 at first
        row_max[half] = tile_max;
        row_sum[half] *= correction[half];
        for (int i = 0; i < kBlockN / 8; ++i) {
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            s_acc[4 * i + e] = fast_exp2(fmaf(s_acc[4 * i + e], scale_log2, -max_scaled));
            row_sum[half] += s_acc[4 * i + e];
          }
        }
      }
    };
    // P in fp16, laid out as wgmma's A operand (two 8-key accumulator blocks per 16-key step).
    auto pack_probabilities = [&]() {
      for (int step = 0; step < T::kKeySteps; ++step) {
        p_fragments[step][0] = pack_half2(s_acc[8 * step + 0], s_acc[8 * step + 1]);
        p_fragments[step][1] = pack_half2(s_acc[8 * step + 2], s_acc[8 * step + 3]);
        p_fragments[step][2] = pack_half2(s_acc[8 * step + 4], s_acc[8 * step + 5]);
        p_fragments[step][3] = pack_half2(s_acc[8 * step + 6], s_acc[8 * step + 7]);
      }
    };

    hopper::mbarrier_wait(&q_full[q_buffer], (done / T::kQBuffers) % 2);

    // The last K/V tile first: the only one that can hold keys past N (their K rows are TMA's
    // zeros), which get -inf, so p = 0.
    int stage = kv_count % kStages;
    hopper::mbarrier_wait(&kv_full[stage], (kv_count / kStages) % 2);
    issue_scores(stage);
    hopper::wgmma_wait<0>();
    hopper::fence_registers(s_acc);
    const int last_tile_keys = tokens - (kv_tiles - 1) * kBlockN;
    if (last_tile_keys < kBlockN) {
      for (int i = 0; i < kBlockN / 8; ++i) {
        for (int e = 0; e < 4; ++e) {
          if (8 * i + 2 * quad_lane + e % 2 >= last_tile_keys) s_acc[4 * i + e] = -INFINITY;
        }
      }
    }
    softmax();  // O is still zero: nothing to correct
    pack_probabilities();
    int pv_stage = stage;
    ++kv_count;

    // Every other tile, all full: its S = Q K^T and the previous tile's P V go to the tensor
    // cores together, and the softmax of this S runs while that P V does.
    for (int kv_tile = kv_tiles - 2; kv_tile >= 0; --kv_tile, ++kv_count) {
      stage = kv_count % kStages;
      hopper::mbarrier_wait(&kv_full[stage], (kv_count / kStages) % 2);
      issue_scores(stage);
      issue_output(pv_stage);
      hopper::wgmma_wait<1>();  // S is ready; P V may still run
      hopper::fence_registers(s_acc);
      softmax();
      await_output();  // now the previous stage is free, and O and P may change
      release(&kv_empty[pv_stage]);
      for (int half = 0; half < 2; ++half) {
        for (int d = 0; d < kHeadDim / 8; ++d) {
          o_acc[4 * d + 2 * half] *= correction[half];
          o_acc[4 * d + 2 * half + 1] *= correction[half];
        }
      }
      pack_probabilities();
      pv_stage = stage;
    }
    release(&q_empty[q_buffer]);  // every S = Q K^T of this work tile is complete
    issue_output(pv_stage);
    await_output();
    release(&kv_empty[pv_stage]);

    // Normalise and stage this warpgroup's rows of O (once the previous tile's store has read
    // the staging buffer), then one thread stores them; the store runs on while the next tile
    // starts. Rows past N are dropped by the store.
    float inverse[2];
    for (int half = 0; half < 2; ++half) {
      float total = row_sum[half];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      inverse[half] = 1.0f / total;
    }
    if (thread_in_group == 0) hopper::tma_store_wait_read();
    hopper::named_barrier_sync(1 + consumer, 128);
    unsigned char* o_bytes = reinterpret_cast<unsigned char*>(o_stage);
    for (int d = 0; d < kHeadDim / 8; ++d) {
      for (int half = 0; half < 2; ++half) {
        const int row = consumer * 64 + warp * 16 + lane / 4 + 8 * half;
        *reinterpret_cast<__half2*>(o_bytes + hopper::swizzled_offset(row, 8 * d + 2 * quad_lane, T::kBlockM)) =
            __floats2half2_rn(o_acc[4 * d + 2 * half] * inverse[half],
                              o_acc[4 * d + 2 * half + 1] * inverse[half]);
      }
    }
    hopper::fence_async_shared();  // these ordinary stores are read next by the copy engine
    hopper::named_barrier_sync(1 + consumer, 128);
    if (thread_in_group == 0) {
      for (int c = 0; c < T::kColumnBlocks; ++c) {
        hopper::tma_store(&o_map, o_stage + (c * T::kBlockM + consumer * 64) * hopper::kSwizzleColumns,
                          c * hopper::kSwizzleColumns, my_row0, tile.slice);
      }
      hopper::tma_store_commit();
    }
  }
  if (thread_in_group == 0) hopper::tma_store_wait();  // shared memory must outlive the stores
}

// ---- Launch ---------------------------------------------------------------------------------

template <int kHeadDim, int kBlockN, int kStages>
void launch_for(Tiles<kHeadDim, kBlockN, kStages>, const attn::AttentionArgs& args) {
  using T = Tiles<kHeadDim, kBlockN, kStages>;
  const int64_t slices = int64_t(args.batch) * args.heads;
  const CUtensorMap q_map = hopper::tensor_map(args.q, slices, args.tokens, kHeadDim, T::kBlockM);
  const CUtensorMap k_map = hopper::tensor_map(args.k, slices, args.tokens, kHeadDim, kBlockN);
  const CUtensorMap v_map = hopper::tensor_map(args.v, slices, args.tokens, kHeadDim, kBlockN);
  const CUtensorMap o_map = hopper::tensor_map(args.o, slices, args.tokens, kHeadDim, 64);
  auto kernel = warp_specialized_attention_kernel<kHeadDim, kBlockN, kStages>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(T::kSharedBytes)));
  int device = 0, sm_count = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  const int row_tiles = (args.tokens + T::kBlockM - 1) / T::kBlockM;
  const int64_t work_tiles = int64_t(row_tiles) * slices;
  if (work_tiles > INT32_MAX) throw attn::CudaError("v8: more than 2^31 work tiles");
  const int blocks = int(std::min<int64_t>(work_tiles, sm_count));  // persistent: one per SM
  const float scale_log2 = float(M_LOG2E / std::sqrt(double(kHeadDim)));
  kernel<<<blocks, T::kThreads, T::kSharedBytes, args.stream>>>(
      q_map, k_map, v_map, o_map, args.tokens, row_tiles, int(work_tiles), scale_log2);
  CUDA_CHECK_LAUNCH();
}

// Calls body(Tiles<...>) with the tile shape of this head dim (chapter 10 records the sweep).
template <typename Body>
void with_tile_shape(int64_t head_dim, Body&& body) {
  switch (head_dim) {
    case 64: return body(Tiles<64, 128, 2>{});
    case 128: return body(Tiles<128, 128, 2>{});
  }
}

void launch_warp_specialized(const attn::AttentionArgs& args) {
  with_tile_shape(args.head_dim, [&](auto tiles) { launch_for(tiles, args); });
}

// Independent of N: two Q buffers, the O staging tile, the K and V stages.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  with_tile_shape(shape.head_dim, [&](auto tiles) { bytes = decltype(tiles)::kSharedBytes; });
  return bytes;
}

}  // namespace

ATTN_REGISTER_STEP(attn::StepInfo{ATTN_STEP_ID,
                                  "warp specialized: TMA producer, 2 wgmma consumers, overlap",
                                  {64, 128}, 90, 90, shared_bytes_needed, launch_warp_specialized})
