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
//     "full" ones), so a stage is refilled the moment all are done with it, not at a barrier
//     of the whole block (three consumers under the causal mask at D = 64: below);
//   - inside each consumer, the next tile's S = Q K^T is issued before this tile's softmax, and
//     P V of the previous tile runs on the tensor cores while the softmax of the next runs on
//     the other units (intra-warpgroup overlap). The K/V tiles are visited last to first, so
//     the only partial tile, the last, is the first one, peeled off the loop with its mask;
//   - the consumers take turns on the tensor cores (ping-pong): each issues its two GEMMs
//     only after the other has issued its own, so one's softmax (the exponentials' special
//     function unit) runs while the other's GEMMs run, instead of both waiting on the same unit;
//   - persistent blocks: one per SM, each walking a list of (slice, 128-row tile) work tiles.
//     The producer loads the next tile's Q (double-buffered) and K/V while the consumers finish
//     the current one, and O leaves through a staging buffer and an asynchronous TMA store (L,
//     when asked for, with plain stores, as in v6 and v7).
//
// Serves head dims 32, 64, 80, 96, 128 and 256 (those not a multiple of 64 in 32-column blocks
// with the 64-byte swizzle, 80 padded to 96 in shared memory; at D = 256 O is staged in the Q
// buffer, below), in fp16 or bf16 (the kernel is a template on the element type, which the
// tensor maps and the wgmma instructions name; chapter 16), N_k keys for N queries
// (cross-attention: K's and V's maps have N_k rows, the K/V walk counts them), and sequences of
// different lengths packed one after another (each work tile's sequence from
// policies/sequences.cuh; chapter 21). Tile sizes per
// head dim are chosen by measurement (chapters 10 and 20); under the causal mask at D = 64,
// three consumers share 192-row tiles against 128-key ones (chapter 12). The rings, wgmma groups
// and staging buffer are the pieces of steps/hopper/pipeline.cuh, which the checked build
// (cmake -DATTN_CHECKED_PIPELINE=ON) turns into a checker of the protocol.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.hpp"
#include "dispatch.hpp"
#include "element_type.hpp"
#include "hopper/epilogue.cuh"
#include "hopper/hopper.cuh"
#include "policies/mask.cuh"
#include "policies/online_softmax.cuh"
#include "policies/sequences.cuh"
#include "policies/tile_scheduler.cuh"
#include "step.hpp"

namespace {

using hopper::Buffer;
using hopper::NamedBarrier;
using policies::kPaddedScore;
using policies::SequenceSpan;
using policies::WorkTile;
// The persistent walk over (slice, 128-row tile) work tiles; under the causal mask the longest
// row tiles of every slice first, its rounds alternating direction; for packed sequences of
// different lengths, the row tiles that exist, sequence by sequence (policies/tile_scheduler.cuh).
template <typename T, bool kCausal, bool kPacked = false>
using Scheduler = std::conditional_t<kPacked, policies::PackedScheduler<T::kBlockM>,
                                     policies::PersistentScheduler<T::kBlockM, kCausal>>;

// ---- Tile geometry and shared memory --------------------------------------------------------

template <int kHeadDim_, int kBlockN_, int kStages_, int kQBuffers_, int kConsumers_ = 2>
struct Tiles {
  static constexpr int kHeadDim = kHeadDim_;
  // Tiles in swizzle blocks of 64 or 32 columns, padded to whole blocks (hopper/layout.cuh): the
  // zero columns past D add 0 to S = Q K^T, give O columns that are 0, and the store of O clips
  // them. (D = 80 in five 16-column blocks, no padding, measured slower than in 96 columns:
  // chapter 20.)
  static constexpr hopper::Swizzle kSwizzle = hopper::head_dim_swizzle(kHeadDim);
  static constexpr int kSwizzleColumns = hopper::row_columns(kSwizzle);
  static constexpr int kTileColumns = hopper::tile_columns(kHeadDim);
  static constexpr int kConsumers = kConsumers_;       // consumer warpgroups: 2, or 3
  static constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 is the producer
  static constexpr int kBlockM = 64 * kConsumers;      // query rows per work tile
  static constexpr int kBlockN = kBlockN_;             // keys per K and V tile
  static constexpr int kStages = kStages_;             // K stages, and as many V stages
  static constexpr int kQBuffers = kQBuffers_;         // 2: the next tile's Q lands during this one
  static constexpr int kColumnBlocks = kTileColumns / kSwizzleColumns;
  static constexpr int kDSteps = kTileColumns / 16;
  static constexpr int kKeySteps = kBlockN / 16;
  // Registers per thread after the hand-over: the producer keeps 24, the consumers share the
  // rest of the SM's 65,536 in multiples of 8: 240 each for two (128 * 24 + 256 * 240 = 64,512),
  // 160 each for three (64,512 too).
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = (65536 - 128 * kProducerRegisters) / (128 * kConsumers) / 8 * 8;
  static constexpr uint32_t kElementBytes = 2;  // fp16 or bf16
  static constexpr uint32_t kQBytes = kBlockM * kTileColumns * kElementBytes;  // whole boxes,
  static constexpr uint32_t kKVBytes = kBlockN * kTileColumns * kElementBytes;  // zeros included
  static_assert(hopper::has_wgmma(kBlockN), "a key tile that ptx.cuh has a wgmma for");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep 1024-byte alignment");
  // O leaves through a staging tile of its own, unless Q, O and the K/V stages would not fit in
  // the SM's 227 KB (D = 256): then each consumer stages its O in its own rows of the Q buffer,
  // which its S = Q K^T no longer reads, and frees the buffer once the store has read them.
  // (1024 bytes of the budget are left for the barriers and 1024 for aligning the storage.)
  static constexpr uint32_t kTilesBytes = (kQBuffers + 1) * kQBytes + 2 * kStages * kKVBytes;
  static constexpr bool kOutputInQ = kTilesBytes + 2048 > hopper::kMaxSharedBytesPerBlock;
  static_assert(!kOutputInQ || kQBuffers == 1, "O staged in Q only with one Q buffer");
};

// Shared memory: the Q buffers, the K stages, the V stages and the O staging tile (each a
// multiple of 1024 bytes, so every tile keeps the swizzle's 1024-byte alignment; no staging tile
// when O is staged in Q), then a full and an empty barrier per Q buffer, per K stage and per V stage.
// Element: __half or __nv_bfloat16, the same size, so the bytes below are the same for both.
struct NoStagingTile {};
template <typename T, typename Element = __half>
struct SharedStorage {
  Element q[T::kQBuffers][T::kBlockM * T::kTileColumns];  // [column block][kBlockM][64 or 32]
  Element k[T::kStages][T::kBlockN * T::kTileColumns];    // [column block][kBlockN][64 or 32]
  Element v[T::kStages][T::kBlockN * T::kTileColumns];
  std::conditional_t<T::kOutputInQ, NoStagingTile, Element[T::kBlockM * T::kTileColumns]> o;
  uint64_t q_full[T::kQBuffers], q_empty[T::kQBuffers];
  uint64_t k_full[T::kStages], k_empty[T::kStages];
  uint64_t v_full[T::kStages], v_empty[T::kStages];
};
// The bytes a block asks for: the storage, and room to align its start to 1024 bytes.
template <typename T>
constexpr uint32_t kSharedBytes = sizeof(SharedStorage<T>) + 1024;

// Barrier arrivals that free a buffer: one per consumer warp (a warp's wgmma.wait_group covers
// its own share of the warpgroup's instruction, so every warp says it is done).
template <typename T>
constexpr uint32_t kConsumerWarps = 4 * T::kConsumers;

// The online softmax (policies/online_softmax.cuh) keeps its maxima and sums in four independent
// chains: while one consumer's softmax runs, the other's warps mostly wait on their wgmma, so a
// warp's own instruction-level parallelism decides its speed.
constexpr int kSoftmaxChains = 4;

// The K/V tiles of a work tile, the same number for the producer and every consumer: those
// the mask policy (of the tile's sequence) says its 128 rows see. Without a causal mask, in
// sequences of one length, that is all of N_k's for every work tile (whole_kv_tiles, counted
// once before the walk).
template <typename T, bool kCausal, bool kPacked>
__device__ __forceinline__ int kv_tiles_of(const policies::Mask<kCausal>& mask, const WorkTile& tile,
                                           int whole_kv_tiles) {
  if (!kCausal && !kPacked) return whole_kv_tiles;
  return mask.kv_tiles(tile.row0, T::kBlockM, T::kBlockN);
}

// Every barrier of the block, by one thread: the rings' full and empty barriers (an empty one
// completes when every consumer warp has released its stage) and the O staging buffers'.
template <typename T>
__device__ __forceinline__ void init_barriers(hopper::Ring<T::kQBuffers>& q_ring,
                                              hopper::Ring<T::kStages>& k_ring,
                                              hopper::Ring<T::kStages>& v_ring) {
  q_ring.init(kConsumerWarps<T>);
  k_ring.init(kConsumerWarps<T>);
  v_ring.init(kConsumerWarps<T>);
  for (int c = 0; c < T::kConsumers; ++c) hopper::StagingBuffer(c).init();
  hopper::fence_barrier_init();
}

// The producer: one thread issues every copy, Q once per work tile, then K and V of its K/V
// tiles, walking the same work tiles as the consumers.
template <typename T, typename Element, bool kCausal, bool kPacked>
__device__ __forceinline__ void produce(SharedStorage<T, Element>& smem,
                                        hopper::Ring<T::kQBuffers>& q_ring,
                                        hopper::Ring<T::kStages>& k_ring,
                                        hopper::Ring<T::kStages>& v_ring, const CUtensorMap& q_map,
                                        const CUtensorMap& k_map, const CUtensorMap& v_map,
                                        const policies::Mask<kCausal>& launch_mask,
                                        const policies::Sequences<kPacked>& sequences, int tokens,
                                        const Scheduler<T, kCausal, kPacked>& scheduler) {
  constexpr int kTileColumns = T::kTileColumns, kBlockN = T::kBlockN, kStages = T::kStages;
  constexpr int kSwizzleColumns = T::kSwizzleColumns;
  // Rows [kv_tile * kBlockN, ...) of K or V into the buffer of this use of the ring.
  auto load = [&](hopper::Ring<kStages>& ring, Element (*tiles)[kBlockN * kTileColumns],
                  const CUtensorMap* map, int use, int kv_tile, const WorkTile& tile,
                  const SequenceSpan& span, const policies::Mask<kCausal>& mask) {
    hopper::check_tile_seen(mask, kv_tile, kBlockN, tile.row0, T::kBlockM);
    ring.wait_empty(use);
    uint64_t* full = ring.arm(use, T::kKVBytes);
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      hopper::tma_load(tiles[ring.slot(use)] + c * kBlockN * kSwizzleColumns, map, full,
                       c * kSwizzleColumns, span.kv_start + kv_tile * kBlockN, tile.head, span.batch);
    }
  };
  const int whole_kv_tiles = (launch_mask.kv_tokens + kBlockN - 1) / kBlockN;
  int kv_use = 0, q_use = 0;
  for (int index = scheduler.first(); index < scheduler.work_tiles; index = scheduler.next(index)) {
    const WorkTile tile = scheduler.at(index);
    const SequenceSpan span = sequences.of(tile.batch, tokens, launch_mask.kv_tokens);
    if (kPacked && tile.row0 >= span.tokens) continue;  // past its sequence's end (the walk's spare): no work
    const policies::Mask<kCausal> mask = sequences.mask(span, launch_mask);
    const int kv_tiles = kv_tiles_of<T, kCausal, kPacked>(mask, tile, whole_kv_tiles);
    // BEGIN EXERCISE: load the work tile's Q, then K and V of its K/V tiles, last tile first
    q_ring.wait_empty(q_use);
    uint64_t* q_full = q_ring.arm(q_use, T::kQBytes);
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      hopper::tma_load(smem.q[q_ring.slot(q_use)] + c * T::kBlockM * kSwizzleColumns, &q_map,
                       q_full, c * kSwizzleColumns, span.q_start + tile.row0, tile.head, span.batch);
    }
    // Visit i (0 = the last K/V tile) uses K/V tile kv_tiles - 1 - i. A work tile above the
    // causal diagonal has none, and so has one of a packed sequence without keys.
    if ((!kCausal && !kPacked) || kv_tiles > 0) {
      load(k_ring, smem.k, &k_map, kv_use, kv_tiles - 1, tile, span, mask);
      for (int i = 1; i < kv_tiles; ++i) {
        load(k_ring, smem.k, &k_map, kv_use + i, kv_tiles - 1 - i, tile, span, mask);
        load(v_ring, smem.v, &v_map, kv_use + i - 1, kv_tiles - i, tile, span, mask);
      }
      load(v_ring, smem.v, &v_map, kv_use + kv_tiles - 1, 0, tile, span, mask);
    }
    kv_use += kv_tiles;
    ++q_use;
    // END EXERCISE
  }
}

// A consumer warpgroup whose 64 rows of a work tile all lie past N (the last tile of N = 1025,
// say) only keeps the barrier counts: it waits for each stage to fill before releasing it, never
// running ahead, and takes its turns without GEMMs.
template <typename T>
__device__ __forceinline__ void keep_counts(hopper::Ring<T::kQBuffers>& q_ring,
                                            hopper::Ring<T::kStages>& k_ring,
                                            hopper::Ring<T::kStages>& v_ring,
                                            hopper::PingPong& turns, hopper::WgmmaGroups& groups,
                                            int q_use, int kv_use, int kv_tiles, int lane) {
  for (int i = 0; i < kv_tiles; ++i) {
    k_ring.wait_full(kv_use + i);
    k_ring.release(kv_use + i, lane, groups);
    v_ring.wait_full(kv_use + i);
    v_ring.release(kv_use + i, lane, groups);
    if (i > 0) {
      turns.wait_for_turn();
      turns.pass_turn();
    }
  }
  q_ring.wait_full(q_use);
  q_ring.release(q_use, lane, groups);
}

// The tensor-core work of a consumer on one K/V visit, issued and committed, not awaited.
// S = Q K^T for the consumer's 64 rows of Q and a K tile.
template <typename T, typename Element>
__device__ __forceinline__ void wgmma_scores(float (&s_acc)[T::kBlockN / 2], const Element* q_rows,
                                             const Element* k_tile, hopper::WgmmaGroups& groups) {
  const hopper::KMajorOperand<T::kBlockM, T::kSwizzle> q(q_rows);
  const hopper::KMajorOperand<T::kBlockN, T::kSwizzle> k(k_tile);
  hopper::wgmma_fence();
  for (int step = 0; step < T::kDSteps; ++step) {
    hopper::wgmma_ss<Element>(s_acc, q.k_step(step), k.k_step(step), step > 0);
  }
  groups.commit();
}
// O += P V with a V tile. Until it completes, neither O nor P (read from registers by the
// tensor cores) may change: await_output waits for it.
template <typename T, typename Element>
__device__ __forceinline__ void wgmma_output(float (&o_acc)[T::kTileColumns / 2],
                                             uint32_t (&p_fragments)[T::kKeySteps][4],
                                             const Element* v_tile, hopper::WgmmaGroups& groups) {
  const hopper::MNMajorOperand<T::kBlockN, T::kSwizzle> v(v_tile);
  for (int step = 0; step < T::kKeySteps; ++step) hopper::fence_registers(p_fragments[step]);
  hopper::fence_registers(o_acc);
  hopper::wgmma_fence();
  for (int step = 0; step < T::kKeySteps; ++step) {
    hopper::wgmma_rs<Element>(o_acc, p_fragments[step], v.k_step(step), true);
  }
  groups.commit();
}
template <typename T>
__device__ __forceinline__ void await_output(hopper::WgmmaGroups& groups, float (&o_acc)[T::kTileColumns / 2],
                                             uint32_t (&p_fragments)[T::kKeySteps][4]) {
  groups.wait<0>();
  hopper::fence_registers(o_acc);
  for (int step = 0; step < T::kKeySteps; ++step) hopper::fence_registers(p_fragments[step]);
}
// P in fp16 (or bf16), laid out as wgmma's A operand (two 8-key accumulator blocks per 16-key step).
template <typename T, typename Element>
__device__ __forceinline__ void pack_probabilities(uint32_t (&p_fragments)[T::kKeySteps][4],
                                                   const float (&s_acc)[T::kBlockN / 2]) {
  for (int step = 0; step < T::kKeySteps; ++step) {
    p_fragments[step][0] = hopper::pack_pair<Element>(s_acc[8 * step + 0], s_acc[8 * step + 1]);
    p_fragments[step][1] = hopper::pack_pair<Element>(s_acc[8 * step + 2], s_acc[8 * step + 3]);
    p_fragments[step][2] = hopper::pack_pair<Element>(s_acc[8 * step + 4], s_acc[8 * step + 5]);
    p_fragments[step][3] = hopper::pack_pair<Element>(s_acc[8 * step + 6], s_acc[8 * step + 7]);
  }
}
// The element masks of a consumer thread's S accumulators (its warp's 16 rows of a K/V tile, in
// wgmma's layout: element e of 8-key block i is key 8 i + 2 quad_lane + e % 2 of the tile, row
// lane / 4 + 8 (e / 2) of the warp's 16). Keys past N_k, keys the key-padding mask marks
// (kMasked) and keys past a row's causal diagonal (kCausal) lose their weight.
template <typename T, bool kMasked, bool kCausal>
struct ScoreMasks {
  static constexpr int kBlockN = T::kBlockN;
  static constexpr int kPaddingWords = (kBlockN + 31) / 32;
  struct PaddingBytes {
    uint8_t bytes[kPaddingWords];
  };
  struct Padding {
    uint32_t words[kPaddingWords];
  };
  const policies::Mask<kCausal>& mask;
  const uint8_t* padding_row;  // the work tile's batch element's [N_k] bytes (kMasked)
  int row0;                    // this thread's first row: row0 + 8 is its second
  int lane;

  // The key-padding mask of K/V tile kv_tile, one bit per key (bit j of word w: key 32 w + j),
  // the same in every lane of the warp: each lane reads one key in 32 (a warp's loads are 32
  // consecutive bytes), and a ballot shares the answers. The bytes of the next tile are fetched
  // while this one is computed, so neither the softmax nor the ping-pong's hand-over waits on a
  // load. A lane past N_k reads the tile's last key instead (in bounds) and votes no.
  __device__ __forceinline__ PaddingBytes fetch_padding(int kv_tile) const {
    PaddingBytes fetched{};
    if constexpr (kMasked) {
      const int kv_tokens = mask.kv_tokens;
      const uint8_t* padding = padding_row + kv_tile * kBlockN;
      const int tile_keys = min(kBlockN, kv_tokens - kv_tile * kBlockN);
      for (int w = 0; w < kPaddingWords; ++w) {
        fetched.bytes[w] = padding[min(32 * w + lane, tile_keys - 1)];
      }
    }
    return fetched;
  }
  __device__ __forceinline__ Padding vote_padding(const PaddingBytes& fetched, int kv_tile) const {
    Padding padded{};
    if constexpr (kMasked) {
      const int tile_keys = min(kBlockN, mask.kv_tokens - kv_tile * kBlockN);
      for (int w = 0; w < kPaddingWords; ++w) {
        padded.words[w] =
            __ballot_sync(0xffffffffu, fetched.bytes[w] != 0 && 32 * w + lane < tile_keys);
      }
    }
    return padded;
  }
  // Keys the mask marks as padding get kPaddedScore. This thread's keys of 8-key block i are
  // 8 i + 2 quad_lane + {0, 1}: bits of word i / 4, since a block never straddles two words.
  __device__ __forceinline__ void mask_padding(float (&s_acc)[kBlockN / 2], const Padding& padded) const {
    if constexpr (kMasked) {
      const int quad_lane = lane % 4;
      for (int i = 0; i < kBlockN / 8; ++i) {
        const uint32_t mine = padded.words[i / 4] >> (8 * (i % 4) + 2 * quad_lane);
        for (int column = 0; column < 2; ++column) {
          if ((mine >> column) & 1) {
            s_acc[4 * i + column] = kPaddedScore;
            s_acc[4 * i + column + 2] = kPaddedScore;
          }
        }
      }
    }
  }
  // Without the causal mask, keys past N_k exist only in the last K/V tile, the first visited
  // (their K rows are TMA's zeros): -inf, so p = 0.
  __device__ __forceinline__ void mask_tail(float (&s_acc)[kBlockN / 2], int kv_tiles) const {
    const int quad_lane = lane % 4, kv_tokens = mask.kv_tokens;
    const int last_tile_keys = kv_tokens - (kv_tiles - 1) * kBlockN;
    if (last_tile_keys < kBlockN) {
      for (int i = 0; i < kBlockN / 8; ++i) {
        for (int e = 0; e < 4; ++e) {
          if (8 * i + 2 * quad_lane + e % 2 >= last_tile_keys) s_acc[4 * i + e] = -INFINITY;
        }
      }
    }
  }
  // Under the causal mask, the keys of K/V tile kv_tile that a row does not see (past its
  // diagonal or past N_k) get kPaddedScore. A row sees keys [0, key_end): counted from this
  // thread's first key of the tile, one compare per element against a column the compiler
  // knows (8 i + e % 2), where mask.sees would add and compare twice.
  __device__ __forceinline__ void mask_causal(float (&s_acc)[kBlockN / 2], int kv_tile) const {
    const int first_key = kv_tile * kBlockN + 2 * (lane % 4);
    const int seen[2] = {mask.key_end(row0, 1) - first_key, mask.key_end(row0 + 8, 1) - first_key};
    for (int i = 0; i < kBlockN / 8; ++i) {
      for (int e = 0; e < 4; ++e) {
        if (8 * i + e % 2 >= seen[e / 2]) s_acc[4 * i + e] = kPaddedScore;
      }
    }
  }
};

// ---- The kernel -----------------------------------------------------------------------------

// A thread of consumer c holds two rows of c's 64 (ptx.cuh gives the accumulator layout):
// row lane/4 of its warp's 16 ("half" 0) and that row + 8 (half 1), a quarter of their columns.
// kWritesLse: the epilogue also writes each row's L to row_lse (a kernel of its own, as in v6).
// Element: __half or __nv_bfloat16, the type the tensor maps and the wgmma instructions name.
// kMasked: key_padding ([B, N_k] bytes, 1: padding) marks keys that get no weight, as in v6
// (kPaddedScore), a kernel of its own too. kCausal: the causal mask (policies/mask.cuh) decides
// which K/V tiles a work tile walks, and its boundary tiles mask their keys with kPaddedScore.
// kPacked: sequences of different lengths packed one after another (policies/sequences.cuh):
// each work tile's sequence gives its rows' place, its keys and its mask, and O leaves through
// the threads' own copies (output_rows) instead of the TMA store.
template <typename T, bool kWritesLse, typename Element, bool kMasked, bool kCausal, bool kPacked>
__global__ void __launch_bounds__(T::kThreads, 1)
    warp_specialized_attention_kernel(const __grid_constant__ CUtensorMap q_map,
                                      const __grid_constant__ CUtensorMap k_map,
                                      const __grid_constant__ CUtensorMap v_map,
                                      const __grid_constant__ CUtensorMap o_map,
                                      float* __restrict__ row_lse,
                                      const uint8_t* __restrict__ key_padding, int tokens,
                                      const policies::Mask<kCausal> launch_mask,
                                      const Scheduler<T, kCausal, kPacked> scheduler, float scale_log2,
                                      const policies::Sequences<kPacked> sequences,
                                      const hopper::OutputRows<kPacked> output_rows) {
  constexpr int kTileColumns = T::kTileColumns, kBlockN = T::kBlockN, kStages = T::kStages;
  constexpr int kSwizzleColumns = T::kSwizzleColumns;
  extern __shared__ unsigned char shared_raw[];
  SharedStorage<T, Element>& smem = *reinterpret_cast<SharedStorage<T, Element>*>(
      shared_raw + (1024 - hopper::shared_address(shared_raw) % 1024) % 1024);
  hopper::Ring<T::kQBuffers> q_ring(Buffer::q, smem.q_full, smem.q_empty);
  hopper::Ring<kStages> k_ring(Buffer::k, smem.k_full, smem.k_empty);
  hopper::Ring<kStages> v_ring(Buffer::v, smem.v_full, smem.v_empty);

  const int warp_group = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int whole_kv_tiles = (launch_mask.kv_tokens + kBlockN - 1) / kBlockN;
  hopper::StagingBuffer o_staging(warp_group - 1);  // the consumers' (c = warp_group - 1)

  if (threadIdx.x == 0) init_barriers<T>(q_ring, k_ring, v_ring);
  __syncthreads();  // the last block-wide barrier: from here on the roles meet only at mbarriers

  // Both roles walk the same work tiles, and count the same uses of each ring: Q once per work
  // tile, K and V once per K/V tile. K and V have rings of their own because the i-th K/V tile
  // visited needs K one step before V (S = Q K^T of step i runs beside P V of step i - 1): a K
  // stage is free as soon as its S is, without waiting for the V beside it.
  if (warp_group == 0) {
    // ---------------- Producer: one thread issues every copy ----------------
    hopper::release_registers<T::kProducerRegisters>();
    if (warp != 0 || lane != 0) return;
    produce<T, Element>(smem, q_ring, k_ring, v_ring, q_map, k_map, v_map, launch_mask, sequences,
                        tokens, scheduler);
    return;
  }

  // ---------------- Consumers: two (or three) warpgroups, 64 query rows each ----------------
  hopper::claim_registers<T::kConsumerRegisters>();
  const int consumer = warp_group - 1;
  const int thread_in_group = threadIdx.x % 128;
  hopper::WgmmaGroups groups;
  // Ping-pong: wait for my turn to issue GEMMs, then hand the turn to the next consumer.
  // Consumer 0 goes first: the last one hands it the first turn.
  hopper::PingPong turns(consumer, T::kConsumers);
  if (consumer == T::kConsumers - 1) turns.hand_over_first_turn();

  // A mask may leave a row no key: a causal diagonal, the key-padding mask, a packed sequence
  // without keys.
  constexpr bool kMaybeNoKey = kMasked || kCausal || kPacked;
  int kv_use = 0, q_use = 0;
  for (int index = scheduler.first(); index < scheduler.work_tiles; index = scheduler.next(index)) {
    const WorkTile tile = scheduler.at(index);
    const SequenceSpan span = sequences.of(tile.batch, tokens, launch_mask.kv_tokens);
    if (kPacked && tile.row0 >= span.tokens) continue;  // past its sequence's end (the walk's spare): no work
    const policies::Mask<kCausal> mask = sequences.mask(span, launch_mask);
    const int my_row0 = tile.row0 + consumer * 64;
    const int kv_tiles = kv_tiles_of<T, kCausal, kPacked>(mask, tile, whole_kv_tiles);

    // A warpgroup with no rows before N in this work tile only keeps the barrier counts.
    if (my_row0 >= span.tokens) {
      keep_counts<T>(q_ring, k_ring, v_ring, turns, groups, q_use, kv_use, kv_tiles, lane);
      kv_use += kv_tiles;
      ++q_use;
      continue;
    }

    float o_acc[kTileColumns / 2] = {};
    // Raw score units. Under the causal mask a row may see no key of a tile, or none at all:
    // starting from kPaddedScore, its maximum stays finite, and stays kPaddedScore if it sees none.
    const float no_score = kCausal || kPacked ? kPaddedScore : -INFINITY;
    float row_max[2] = {no_score, no_score};
    float row_sum[2] = {0.0f, 0.0f};            // this lane's share; the quad's sum at the end
    float s_acc[kBlockN / 2];                   // S, then exp(S - max) in place
    uint32_t p_fragments[T::kKeySteps][4];      // P in fp16: the A operand of P V
    float correction[2];                        // how much O shrinks for the newest tile

    // S = Q K^T with this work tile's Q (this warpgroup's 64 rows of it) and the K of this use
    // of the ring, issued and committed, not awaited.
    auto issue_scores = [&](int use) {
      wgmma_scores<T, Element>(s_acc, smem.q[q_ring.read(q_use, groups)] + consumer * 64 * kSwizzleColumns,
                               smem.k[k_ring.read(use, groups)], groups);
    };
    // O += P V with the V of this use of the ring, issued and committed, not awaited.
    auto issue_output = [&](int use) {
      wgmma_output<T, Element>(o_acc, p_fragments, smem.v[v_ring.read(use, groups)], groups);
    };
    const ScoreMasks<T, kMasked, kCausal> masks{mask, key_padding + int64_t(tile.batch) * mask.kv_tokens,
                                                my_row0 + warp * 16 + lane / 4, lane};

    q_ring.wait_full(q_use);
    if ((kCausal || kPacked) && kv_tiles == 0) {  // every row above the diagonal, or no key: O = 0, L = -inf
      if constexpr (!T::kOutputInQ) q_ring.release(q_use, lane, groups);
    } else {
      // Visit 0 is the last K/V tile: the only one that can hold keys past N_k (their K rows are
      // TMA's zeros), which get -inf, so p = 0. Under the causal mask the first visits, from the
      // first_partial_tile of the warp's own 16 rows on, hold keys past its rows' diagonal too.
      const int partial_visits = kv_tiles - mask.first_partial_tile(my_row0 + warp * 16, kBlockN);
      auto fetched = masks.fetch_padding(kv_tiles - 1);
      k_ring.wait_full(kv_use);
      issue_scores(kv_use);
      groups.wait<0>();
      hopper::fence_registers(s_acc);
      k_ring.release(kv_use, lane, groups);
      if constexpr (kCausal) {
        masks.mask_causal(s_acc, kv_tiles - 1);
      } else {
        masks.mask_tail(s_acc, kv_tiles);
      }
      masks.mask_padding(s_acc, masks.vote_padding(fetched, kv_tiles - 1));
      if (kv_tiles > 1) fetched = masks.fetch_padding(kv_tiles - 2);
      policies::online_softmax<kBlockN, kSoftmaxChains>(s_acc, row_max, row_sum, correction, scale_log2);  // O is still zero
      pack_probabilities<T, Element>(p_fragments, s_acc);

      // Every other visit, to full tiles: its S = Q K^T and the previous visit's P V go to the
      // tensor cores together (in this consumer's turn), and the softmax of this S runs while
      // that P V does.
      for (int i = 1; i < kv_tiles; ++i) {
        k_ring.wait_full(kv_use + i);
        v_ring.wait_full(kv_use + i - 1);
        turns.wait_for_turn();
        issue_scores(kv_use + i);
        issue_output(kv_use + i - 1);
        turns.pass_turn();
        groups.wait<1>();  // S is ready; P V may still run
        hopper::fence_registers(s_acc);
        k_ring.release(kv_use + i, lane, groups);
        if (kCausal && i < partial_visits) masks.mask_causal(s_acc, kv_tiles - 1 - i);
        masks.mask_padding(s_acc, masks.vote_padding(fetched, kv_tiles - 1 - i));
        if (i + 1 < kv_tiles) fetched = masks.fetch_padding(kv_tiles - 2 - i);
        policies::online_softmax<kBlockN, kSoftmaxChains>(s_acc, row_max, row_sum, correction, scale_log2);
        await_output<T>(groups, o_acc, p_fragments);  // now the V buffer is free, and O and P may change
        v_ring.release(kv_use + i - 1, lane, groups);
        policies::rescale_rows<kTileColumns>(o_acc, correction);
        pack_probabilities<T, Element>(p_fragments, s_acc);
      }
      // Every S = Q K^T of this work tile is complete: Q is free (or, staging O, free to take it).
      if constexpr (!T::kOutputInQ) q_ring.release(q_use, lane, groups);
      v_ring.wait_full(kv_use + kv_tiles - 1);
      issue_output(kv_use + kv_tiles - 1);
      await_output<T>(groups, o_acc, p_fragments);
      v_ring.release(kv_use + kv_tiles - 1, lane, groups);
    }
    kv_use += kv_tiles;

    Element* o_tile;
    if constexpr (T::kOutputInQ) {
      o_tile = smem.q[q_ring.slot(q_use)];
    } else {
      o_tile = smem.o;
    }
    hopper::OutputRows<kPacked> rows = output_rows;
    if constexpr (kPacked) rows.q_start = span.q_start;
    hopper::store_output<T, kWritesLse, kMaybeNoKey>(o_tile, o_staging, o_map, o_acc, row_max, row_sum,
                                                     row_lse, tile, span.tokens, consumer, my_row0,
                                                     warp, lane, scale_log2, rows);
    if constexpr (T::kOutputInQ) {  // the Q buffer is free once the store has read this O
      if (thread_in_group == 0) o_staging.wait_read();
      o_staging.sync();
      q_ring.release(q_use, lane, groups);
    }
    ++q_use;
  }
  if (consumer == 0) turns.wait_for_turn();  // the turn the last consumer passed last: every arrival is met
  if (thread_in_group == 0) o_staging.wait();  // shared memory must outlive the stores
}

// ---- Launch ---------------------------------------------------------------------------------

template <typename Element, typename T, bool kCausal>
void launch_for(const attn::AttentionArgs& args) {
  // Packed sequences with no query at all leave nothing to compute (the C ABI refuses a batch
  // with queries but no key anywhere, where a tensor map of zero rows cannot be made).
  if (args.sequences.packed() && args.sequences.total_tokens == 0) return;
  const int64_t slices = int64_t(args.batch) * args.heads;
  // Q in work tiles of rows, K and V in tiles of keys, O in a consumer's 64 rows (views too).
  const hopper::AttentionMaps maps =
      hopper::attention_maps<T::kSwizzle>(args, T::kBlockM, T::kBlockN, 64);
  int device = 0, sm_count = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  const int row_tiles = (args.tokens + T::kBlockM - 1) / T::kBlockM;
  const int64_t work_tiles = int64_t(row_tiles) * slices;
  if (work_tiles > INT32_MAX) throw attn::CudaError("v8: more than 2^31 work tiles");
  int blocks = int(std::min<int64_t>(work_tiles, sm_count));  // persistent: one per SM
  if (args.max_persistent_blocks > 0) blocks = std::min(blocks, args.max_persistent_blocks);
  const float scale_log2 = float(M_LOG2E * args.scale);
  const int diagonal = int(attn::causal_diagonal(args.causal, args.tokens, args.kv_tokens));
  // A causal walk hands out the longest row tiles first where each slice still has at least 4
  // blocks at once, which read its K/V tiles from L2 together; with fewer the blocks fetch them
  // from HBM one by one, and at D = 128 that cost more than the balance won (chapter 20).
  const bool longest_first = kCausal && blocks >= 4 * slices;
  const policies::Mask<kCausal> launch_mask{args.kv_tokens, diagonal};
  auto launch = [&](auto kernel, auto scheduler, auto sequences, auto output_rows) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kSharedBytes<T>)));
    kernel<<<blocks, T::kThreads, kSharedBytes<T>, args.stream>>>(
        maps.q, maps.k, maps.v, maps.o, args.log_sum_exp, args.key_padding_mask, args.tokens,
        launch_mask, scheduler, scale_log2, sequences, output_rows);
  };
  if (args.sequences.packed()) {
    // Packed sequences: a work tile per (sequence, head, 128 rows), found from the prefix sums
    // (PackedScheduler), O copied out row by row into [total, H, D] (its strides in bytes, as the
    // maps have them). Walked over the longest sequence's row tiles instead, a block kept one
    // row tile of every slice and the blocks whose row tile lay in every short sequence did all
    // their work (chapter 21).
    if (args.key_padding_mask != nullptr) {
      throw std::invalid_argument("v8: packed sequences take no key-padding mask (each sequence's keys are its own)");
    }
    const attn::TensorStrides o =
        hopper::packed_strides(args.o_strides, args.heads, args.head_dim, args.sequences.total_tokens);
    const hopper::OutputRows<true> output_rows{reinterpret_cast<unsigned char*>(args.o),
                                               o.token * int64_t(sizeof(Element)),
                                               o.head * int64_t(sizeof(Element)),
                                               args.sequences.total_tokens, 0};
    const policies::Sequences<true> sequences{args.sequences.cu_seqlens_q, args.sequences.cu_seqlens_k,
                                              args.causal == attn::Causal::bottom_right};
    const int64_t packed_tiles =
        int64_t(args.heads) * (args.sequences.total_tokens / T::kBlockM + args.batch);
    if (packed_tiles > INT32_MAX) throw attn::CudaError("v8: more than 2^31 work tiles");
    blocks = int(std::min<int64_t>(packed_tiles, sm_count));
    if (args.max_persistent_blocks > 0) blocks = std::min(blocks, args.max_persistent_blocks);
    const Scheduler<T, kCausal, true> scheduler{args.sequences.cu_seqlens_q, args.batch, args.heads,
                                                int(packed_tiles)};
    attn::with_flags(
        [&](auto lse) {
          launch(warp_specialized_attention_kernel<T, decltype(lse)::value, Element, false, kCausal, true>,
                 scheduler, sequences, output_rows);
        },
        args.log_sum_exp != nullptr);
  } else {
    const Scheduler<T, kCausal> scheduler{{row_tiles, args.heads}, int(work_tiles), longest_first};
    attn::with_flags(
        [&](auto lse, auto masked) {
          launch(warp_specialized_attention_kernel<T, decltype(lse)::value, Element,
                                                   decltype(masked)::value, kCausal, false>,
                 scheduler, policies::Sequences<false>{}, hopper::OutputRows<false>{});
        },
        args.log_sum_exp != nullptr, args.key_padding_mask != nullptr);
  }
  CUDA_CHECK_LAUNCH();
}

// The tile shape of each head dim (keys per K/V tile, stages, Q buffers, consumers), chosen by
// measurement (chapter 10, docs/results/h100/tuning/): at D = 64, 208-key tiles (197, 577 and
// 1025 keys fill 95-99% of them), two stages, two Q buffers; at D = 128, 160-key tiles with one
// Q buffer (two would not fit next to them in 227 KB), which beat 128-key tiles with two Q
// buffers by 10%. A define replaces one, as scripts/tune.sh v8 does: -DATTN_V8_TILES_D64=128\,2\,2.
// The head dims of the other models (chapter 14): at D = 32 (DETR), 176-key tiles, which 1050
// keys fill to 99%; at D = 80 (ViT-H/14), 144-key tiles, which 257 keys fill to 89%; at D = 96, 176.
// At D = 256 a 128-row Q tile alone is 64 KB: one Q buffer, O staged in it, and 80-key tiles in
// two stages fill the rest (S and P of 80 keys beside O's 128 accumulators a thread).
#ifndef ATTN_V8_TILES_D32
#define ATTN_V8_TILES_D32 176, 2, 2
#endif
#ifndef ATTN_V8_TILES_D80
#define ATTN_V8_TILES_D80 144, 2, 2
#endif
#ifndef ATTN_V8_TILES_D96
#define ATTN_V8_TILES_D96 176, 2, 2
#endif
#ifndef ATTN_V8_TILES_D64
#define ATTN_V8_TILES_D64 208, 2, 2
#endif
#ifndef ATTN_V8_TILES_D128
#define ATTN_V8_TILES_D128 160, 2, 1
#endif
#ifndef ATTN_V8_TILES_D256
#define ATTN_V8_TILES_D256 80, 2, 1
#endif
// Under the causal mask a work tile walks half the K/V tiles on average, so what a work tile
// costs besides its visits (its first S = Q K^T alone, its last P V alone, its epilogue) weighs
// twice as much, and the diagonal's masked keys come on top. At D = 64 three consumers of 64
// rows each (192-row tiles, 160 registers a thread) keep the tensor cores busier: while one
// consumer runs its softmax, the other two take turns on them. 128-key tiles keep S, P and O in
// those registers (chapter 12).
#ifndef ATTN_V8_CAUSAL_TILES_D64
#define ATTN_V8_CAUSAL_TILES_D64 128, 2, 2, 3
#endif
#ifndef ATTN_V8_CAUSAL_TILES_D128
#define ATTN_V8_CAUSAL_TILES_D128 ATTN_V8_TILES_D128
#endif

// The step's one list of them: the registration's head dims, the launch and the shared memory.
// The causal list differs at D = 64 only.
using TileTable = attn::TileTable<Tiles<32, ATTN_V8_TILES_D32>, Tiles<64, ATTN_V8_TILES_D64>,
                                  Tiles<80, ATTN_V8_TILES_D80>, Tiles<96, ATTN_V8_TILES_D96>,
                                  Tiles<128, ATTN_V8_TILES_D128>, Tiles<256, ATTN_V8_TILES_D256>>;
using CausalTileTable =
    attn::TileTable<Tiles<32, ATTN_V8_TILES_D32>, Tiles<64, ATTN_V8_CAUSAL_TILES_D64>,
                    Tiles<80, ATTN_V8_TILES_D80>, Tiles<96, ATTN_V8_TILES_D96>,
                    Tiles<128, ATTN_V8_CAUSAL_TILES_D128>, Tiles<256, ATTN_V8_TILES_D256>>;

// Calls body(table, causal) with the list of the mask, causal as a compile-time flag.
template <typename Body>
void with_table(bool causal, Body&& body) {
  if (causal) {
    body(CausalTileTable{}, std::true_type{});
  } else {
    body(TileTable{}, std::false_type{});
  }
}

void launch_warp_specialized(const attn::AttentionArgs& args) {
  with_table(args.causal != attn::Causal::none, [&](auto table, auto causal) {
    decltype(table)::with_shape(args.head_dim, [&](auto tiles) {
      attn::with_element_type(args.dtype, [&](auto element) {
        launch_for<decltype(element), decltype(tiles), decltype(causal)::value>(args);
      });
    });
  });
}

// Independent of N: two Q buffers, the O staging tile, the K and V stages, of the list the
// shape's mask takes.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  with_table(shape.causal != attn::Causal::none, [&](auto table, auto) {
    decltype(table)::with_shape(shape.head_dim, [&](auto tiles) { bytes = kSharedBytes<decltype(tiles)>; });
  });
  return bytes;
}

// The tiles along N, for the tests (step.hpp): a work tile's query rows and a consumer's, a K/V
// tile, of both lists.
attn::TileSizes tile_sizes(int head_dim) {
  std::set<int> rows, keys;
  for (bool causal : {false, true}) {
    with_table(causal, [&](auto table, auto) {
      decltype(table)::with_shape(head_dim, [&](auto tiles) {
        using T = decltype(tiles);
        rows.insert({T::kBlockM, 64});
        keys.insert(T::kBlockN);
      });
    });
  }
  return {{rows.begin(), rows.end()}, {keys.begin(), keys.end()}};
}

}  // namespace

ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID,
                                   "warp specialized: TMA producer, 2-3 wgmma consumers, overlap",
                                   launch_warp_specialized)
                       .serving(TileTable::head_dims(), {attn::DType::fp16, attn::DType::bf16})
                       .with_shared_bytes(shared_bytes_needed)
                       .with_tiles(tile_sizes)
                       .with_pipeline_report(hopper::kPipelineReport)
                       .taking_strides()
                       .writing_log_sum_exp()
                       .taking_kv_tokens()
                       .taking_key_padding_mask()
                       .taking_causal()
                       .taking_packed_sequences())
