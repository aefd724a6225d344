// Step v7: Hopper's copy engine and asynchronous tensor cores. The algorithm is v6's (K and V
// streamed tile by tile, an online softmax, P kept in registers); what moves the data and what
// multiplies it changes:
//
//   - the tensor memory accelerator (TMA) copies whole Q, K and V tiles from device memory into
//     shared memory. One thread issues a copy of a box of a tensor map; the hardware computes
//     the addresses, zero-fills rows past N and reports the bytes on an mbarrier. No thread
//     spends instructions on addresses, and loads need no tail test;
//   - wgmma: a warpgroup of 4 warps multiplies a 64-row tile in one asynchronous instruction
//     stream. S = Q K^T reads both operands straight from shared memory through descriptors (no
//     ldmatrix); O += P V takes P from registers, as v6 did, and V from shared memory;
//   - two stages of K and V: tile j + 1 lands while tile j is used, as with v6's cp.async, but a
//     thread waits on a barrier's phase instead of counting committed groups;
//   - O leaves through shared memory and a TMA store, which drops rows past N (L, when asked
//     for, with plain stores, as in v6).
//
// Two warpgroups share each K and V tile: 128 query rows per block. Every thread computes; one
// of them also issues the copies. Serves head dims 64 and 128 (whole 64-column swizzle blocks).
// The wrappers of the new instructions, and the typed pieces built on them (rings of stages,
// matrix descriptors, the staging buffer, the epilogue), are in steps/hopper/, shared with the
// later steps; the online softmax and the block-to-tile mapping are steps/policies/, shared with
// step 8.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.hpp"
#include "dispatch.hpp"
#include "hopper/epilogue.cuh"
#include "hopper/hopper.cuh"
#include "policies/online_softmax.cuh"
#include "policies/tile_scheduler.cuh"
#include "step.hpp"

namespace {

using hopper::Buffer;

// ---- Tile geometry and shared memory --------------------------------------------------------

template <int kHeadDim_>
struct Tiles {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = 2;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = 64 * kWarpGroups;  // query rows per block: wgmma's M per group
  static constexpr int kBlockN = 128;               // keys per K and V tile
  static constexpr int kStages = 2;
  static constexpr hopper::Swizzle kSwizzle = hopper::Swizzle::bytes128;
  static constexpr int kSwizzleColumns = hopper::row_columns(kSwizzle);
  static constexpr int kTileColumns = kHeadDim;
  static constexpr int kColumnBlocks = kHeadDim / kSwizzleColumns;
  static constexpr int kDSteps = kHeadDim / 16;     // k-steps of Q K^T
  static constexpr int kKeySteps = kBlockN / 16;    // k-steps of P V
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(__half);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(__half);  // one K or V tile
  static_assert(kHeadDim % kSwizzleColumns == 0, "whole 64-column swizzle blocks");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep 1024-byte alignment");
};

// Shared memory: Q, then the K stages, then the V stages (each a multiple of 1024 bytes, so every
// tile keeps the swizzle's 1024-byte alignment), then the barriers: Q's, and one per stage for
// the K and V tiles of that stage together.
template <int kHeadDim>
struct SharedStorage {
  using T = Tiles<kHeadDim>;
  __half q[T::kBlockM * kHeadDim];              // [column block][kBlockM][64]
  __half k[T::kStages][T::kBlockN * kHeadDim];  // [column block][kBlockN][64] each
  __half v[T::kStages][T::kBlockN * kHeadDim];
  uint64_t q_full[1];
  uint64_t kv_full[T::kStages];
};
// The bytes a block asks for: the storage, and room to align its start to 1024 bytes.
template <int kHeadDim>
constexpr uint32_t kSharedBytes = sizeof(SharedStorage<kHeadDim>) + 1024;

// ---- The kernel -----------------------------------------------------------------------------

// One block: kBlockM query rows of one (b, h) slice; warpgroup g owns rows 64g..64g+63 of them.
// A thread holds two of its warpgroup's rows (ptx.cuh gives the accumulator layout): row
// lane/4 of its warp's 16 ("half" 0) and that row + 8 (half 1), a quarter of each row's columns.
// kWritesLse: the epilogue also writes each row's L to row_lse (a kernel of its own, as in v6).
template <int kHeadDim, bool kWritesLse>
__global__ void __launch_bounds__(Tiles<kHeadDim>::kThreads, 1)
    tma_wgmma_attention_kernel(const __grid_constant__ CUtensorMap q_map,
                               const __grid_constant__ CUtensorMap k_map,
                               const __grid_constant__ CUtensorMap v_map,
                               const __grid_constant__ CUtensorMap o_map,
                               float* __restrict__ row_lse, int tokens,
                               const policies::TileScheduler<Tiles<kHeadDim>::kBlockM> scheduler,
                               float scale_log2) {
  using T = Tiles<kHeadDim>;
  constexpr int kSwizzleColumns = T::kSwizzleColumns;
  extern __shared__ unsigned char shared_raw[];
  SharedStorage<kHeadDim>& smem = *reinterpret_cast<SharedStorage<kHeadDim>*>(
      shared_raw + (1024 - hopper::shared_address(shared_raw) % 1024) % 1024);
  // Q is used once; a K/V stage once per K/V tile, refilled after a barrier of the whole block.
  hopper::Ring<1> q_ring(Buffer::q, smem.q_full, nullptr);
  hopper::Ring<T::kStages> kv_ring(Buffer::kv, smem.kv_full, nullptr);

  const int warp_group = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_lane = lane % 4;
  // Block b: row tile b % row_tiles of slice b / row_tiles (consecutive blocks share a slice's K
  // and V); the tensor maps take the slice's head and batch.
  const policies::WorkTile work = scheduler.this_block();
  const int head = work.head, batch = work.batch, row0 = work.row0;
  const int kv_tiles = (tokens + T::kBlockN - 1) / T::kBlockN;
  hopper::StagingBuffer o_staging(warp_group);  // O leaves through its rows of the Q tile

  // One thread sets up the barriers and issues every copy; all threads wait on the barriers.
  const bool copier = threadIdx.x == 0;
  auto load_kv_tile = [&](int tile) {
    uint64_t* full = kv_ring.arm(tile, 2 * T::kKVBytes);
    const int stage = kv_ring.slot(tile);
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      const int offset = c * T::kBlockN * kSwizzleColumns;
      hopper::tma_load(smem.k[stage] + offset, &k_map, full, c * kSwizzleColumns,
                       tile * T::kBlockN, head, batch);
      hopper::tma_load(smem.v[stage] + offset, &v_map, full, c * kSwizzleColumns,
                       tile * T::kBlockN, head, batch);
    }
  };
  if (copier) {
    q_ring.init_full();
    kv_ring.init_full();
    for (int g = 0; g < T::kWarpGroups; ++g) hopper::StagingBuffer(g).init();
    hopper::fence_barrier_init();
  }
  __syncthreads();
  if (copier) {
    uint64_t* q_full = q_ring.arm(0, T::kQBytes);
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      hopper::tma_load(smem.q + c * T::kBlockM * kSwizzleColumns, &q_map, q_full,
                       c * kSwizzleColumns, row0, head, batch);
    }
    for (int tile = 0; tile < min(T::kStages, kv_tiles); ++tile) load_kv_tile(tile);
  }

  hopper::WgmmaGroups groups;
  float o_acc[kHeadDim / 2] = {};  // this thread's share of the warpgroup's 64 x D output
  float row_max[2] = {-INFINITY, -INFINITY};  // raw score units
  float row_sum[2] = {0.0f, 0.0f};            // this lane's share; the quad's sum at the end
  q_ring.wait_full(0);

  for (int tile = 0; tile < kv_tiles; ++tile) {
    kv_ring.wait_full(tile);  // K and V have landed
    const int stage = kv_ring.read(tile, groups);
    // This warpgroup's 64 rows of Q and the stage's K are K-major (rows of D); V is MN-major
    // for P V (its rows are the k dimension). A k-step moves a descriptor along D (32 bytes
    // within a 128-byte swizzled row, or to the next column block) or, for V, down 16 keys.
    const hopper::KMajorOperand<T::kBlockM> q(smem.q + warp_group * 64 * kSwizzleColumns);
    const hopper::KMajorOperand<T::kBlockN> k(smem.k[stage]);
    const hopper::MNMajorOperand<T::kBlockN> v(smem.v[stage]);

    float s_acc[T::kBlockN / 2];  // this thread's share of the warpgroup's 64 x kBlockN scores
    // BEGIN EXERCISE: S = Q K^T for this warpgroup's 64 rows: one wgmma per 16 columns of D
    hopper::wgmma_fence();
    for (int step = 0; step < T::kDSteps; ++step) {
      hopper::wgmma_ss(s_acc, q.k_step(step), k.k_step(step), step > 0);
    }
    groups.commit();
    // SKELETON: for (float& score : s_acc) score = NAN;
    // END EXERCISE
    groups.wait<0>();
    hopper::fence_registers(s_acc);

    // Keys past N exist only in the last tile (TMA filled their K rows with zeros): -inf, p = 0.
    const int tile_keys = min(T::kBlockN, tokens - tile * T::kBlockN);
    if (tile_keys < T::kBlockN) {
      for (int i = 0; i < T::kBlockN / 8; ++i) {
        for (int e = 0; e < 4; ++e) {
          if (8 * i + 2 * quad_lane + e % 2 >= tile_keys) s_acc[4 * i + e] = -INFINITY;
        }
      }
    }

    // The online softmax of v6 (policies/online_softmax.cuh), for this thread's two rows: the
    // scores become p in place, and O shrinks by each row's correction.
    float correction[2];
    policies::online_softmax<T::kBlockN>(s_acc, row_max, row_sum, correction, scale_log2);
    policies::rescale_rows<kHeadDim>(o_acc, correction);

    // O += P V. As in v6, the accumulators of two neighbouring 8-key blocks, packed to fp16, are
    // the A operand of one 16-key step: wgmma takes P from registers.
    uint32_t p_fragments[T::kKeySteps][4];
    for (int step = 0; step < T::kKeySteps; ++step) {
      p_fragments[step][0] = hopper::pack_half2(s_acc[8 * step + 0], s_acc[8 * step + 1]);
      p_fragments[step][1] = hopper::pack_half2(s_acc[8 * step + 2], s_acc[8 * step + 3]);
      p_fragments[step][2] = hopper::pack_half2(s_acc[8 * step + 4], s_acc[8 * step + 5]);
      p_fragments[step][3] = hopper::pack_half2(s_acc[8 * step + 6], s_acc[8 * step + 7]);
      hopper::fence_registers(p_fragments[step]);
    }
    hopper::fence_registers(o_acc);
    hopper::wgmma_fence();  // o_acc was rescaled by ordinary instructions just now
    kv_ring.read(tile, groups);  // P V reads the stage's V
    for (int step = 0; step < T::kKeySteps; ++step) {
      hopper::wgmma_rs(o_acc, p_fragments[step], v.k_step(step), true);
    }
    groups.commit();
    groups.wait<0>();
    hopper::fence_registers(o_acc);
    for (int step = 0; step < T::kKeySteps; ++step) hopper::fence_registers(p_fragments[step]);

    // Both warpgroups are done with this stage (their wgmma have completed): one barrier of the
    // whole block, then the copier refills it.
    kv_ring.release_block(tile, groups);
    if (copier && tile + T::kStages < kv_tiles) load_kv_tile(tile + T::kStages);
  }

  // Normalise and stage this warpgroup's 64 rows of O in its own rows of the Q tile (only its
  // own S = Q K^T read them, all complete), then one thread stores them (hopper/epilogue.cuh).
  hopper::store_output<T, kWritesLse, /*kMaybeNoKey=*/false>(smem.q, o_staging, o_map, o_acc,
                                                             row_max, row_sum, row_lse, work, tokens,
                                                             warp_group, row0 + warp_group * 64,
                                                             warp, lane, scale_log2);
  if (threadIdx.x % 128 == 0) o_staging.wait();  // shared memory must outlive the copy's reads
}

// ---- Launch ---------------------------------------------------------------------------------

template <int kHeadDim>
void launch_for(const attn::AttentionArgs& args) {
  using T = Tiles<kHeadDim>;
  const int64_t slices = int64_t(args.batch) * args.heads;
  // Q in blocks of rows, K and V in tiles of keys, O in a warpgroup's 64 rows (views too).
  const hopper::AttentionMaps maps =
      hopper::attention_maps<T::kSwizzle>(args, T::kBlockM, T::kBlockN, 64);
  auto kernel = attn::with_flags(
      [](auto lse) { return tma_wgmma_attention_kernel<kHeadDim, decltype(lse)::value>; },
      args.log_sum_exp != nullptr);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(kSharedBytes<kHeadDim>)));
  const int row_tiles = (args.tokens + T::kBlockM - 1) / T::kBlockM;
  const float scale_log2 = float(M_LOG2E * args.scale);
  kernel<<<unsigned(int64_t(row_tiles) * slices), T::kThreads, kSharedBytes<kHeadDim>, args.stream>>>(
      maps.q, maps.k, maps.v, maps.o, args.log_sum_exp, args.tokens,
      policies::TileScheduler<T::kBlockM>{row_tiles, args.heads}, scale_log2);
  CUDA_CHECK_LAUNCH();
}

// The head dims this step serves, each with its tiles: the registration's head dims, the launch
// and the shared memory read this one list.
using TileTable = attn::TileTable<Tiles<64>, Tiles<128>>;

void launch_tma_wgmma(const attn::AttentionArgs& args) {
  TileTable::with_shape(args.head_dim, [&](auto tiles) { launch_for<decltype(tiles)::kHeadDim>(args); });
}

// Independent of N: Q, two K and two V tiles.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  TileTable::with_shape(shape.head_dim, [&](auto tiles) { bytes = kSharedBytes<decltype(tiles)::kHeadDim>; });
  return bytes;
}

// The tiles along N, for the tests (step.hpp): a block's query rows and a warpgroup's, a K/V tile.
attn::TileSizes tile_sizes(int head_dim) {
  attn::TileSizes sizes;
  TileTable::with_shape(head_dim, [&](auto tiles) {
    using T = decltype(tiles);
    sizes = {{T::kBlockM, 64}, {T::kBlockN}};
  });
  return sizes;
}

}  // namespace

ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID,
                                   "TMA + wgmma: the copy engine and asynchronous tensor cores",
                                   launch_tma_wgmma)
                       .serving(TileTable::head_dims())
                       .with_shared_bytes(shared_bytes_needed)
                       .with_tiles(tile_sizes)
                       .with_pipeline_report(hopper::kPipelineReport)
                       .taking_strides()
                       .writing_log_sum_exp())
