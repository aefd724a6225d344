// Step v10: the backward on Hopper. Step 9's algorithm (a block owns a K/V tile, keeps its dK and
// dV in registers while every Q tile of the slice streams past, and adds its share of dQ into an
// fp32 sum), with step 8's machinery:
//
//   - a producer warp whose one thread copies with TMA: K and V once, then for each Q tile its
//     Q and dO (tensor maps) and its rows of L and D (1-D bulk copies), into a ring of stages
//     guarded by full and empty mbarriers, running ahead of the math;
//   - two consumer warpgroups, 64 keys each, that issue the five products as wgmma:
//        S^T  = K Q^T     dP^T = V dO^T          shared x shared, fp32 accumulators
//        P^T  = exp(S^T scale - L)      dS^T = P^T o (dP^T - D)        (registers)
//        dV  += P^T dO    dK  += dS^T Q          A from registers: the accumulators of S^T and
//                                                dP^T repacked, as P was in v8's P V
//        dQ   = dS K                             both operands from shared memory, read
//                                                transposed (dS^T as the consumers wrote it)
//     Each consumer computes half of dQ over all 128 keys of the block (half of its rows at
//     D = 64, with 128-row Q tiles; half of its columns at D = 128, with 64-row ones), so the
//     two meet once per Q tile, at a named barrier, after both have written their dS^T;
//   - dQ leaves through a staging buffer and the copy engine's bulk reduce-add into an fp32 sum
//     in L2: no atomics from threads, and the warpgroup goes on to the next Q tile while the
//     copy runs. A last small kernel turns the sum into dQ (in the deterministic mode the last
//     turn of each Q tile does).
//
// In the deterministic mode (BackwardArgs::deterministic) the blocks of a slice add their dQ of a
// Q tile in order of their K/V tile, one after the other, waiting on a counter per Q tile: the
// same sum in the same order on every run. The last of them writes dQ itself.
// Under the causal mask (kCausal) a block visits only the Q tiles from the first row that sees
// its keys (policies/mask.cuh), and zeroes P (so dS) past the diagonal in the tiles it crosses.
// Keys the key-padding mask pads are treated as keys past N_k are: their dS is zeroed as it is
// packed, and their dK and dV are written as zeros; a row that sees no key (L = -inf) gets P = 0.
// Serves head dims 32, 64, 80, 96 and 128 (80 and 96 in the tiles of 128, zeros past D), fp16
// or bf16, N_k != N (cross-attention), Q, K, V, O and dO as views (BackwardArgs' strides:
// TMA's maps and the first kernel read them where they lie), and sequences of different lengths
// packed one after another (kPacked: a block's K/V tile and the Q tiles it walks are those of one
// sequence, policies/sequences.cuh; chapter 21), on Hopper (sm_90a); chapter 17.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.hpp"
#include "dispatch.hpp"
#include "element_type.hpp"
#include "hopper/hopper.cuh"
#include "policies/mask.cuh"
#include "policies/sequences.cuh"
#include "policies/tile_scheduler.cuh"
#include "step.hpp"

namespace {

using hopper::Buffer;
using hopper::NamedBarrier;

constexpr float kLog2e = 1.4426950408889634f;
// Slices per group of the causal mask's longest-first order: four slices' blocks fill about one
// wave of 132 SMs at N = 4097 (33 K/V tiles each), and their Q and dO (1-2 MB a slice) stay in L2.
constexpr int kCausalGroupSlices = 4;

// ---- Tile geometry and shared memory --------------------------------------------------------

template <int kHeadDim_, int kBlockM_, int kStages_, int kTileColumns_ = hopper::tile_columns(kHeadDim_)>
struct Tiles {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = 2;                     // consumer warpgroups, 64 keys each
  static constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 is the producer
  static constexpr int kBlockN = 64 * kConsumers;          // keys per block: its K/V tile
  static constexpr int kBlockM = kBlockM_;                 // query rows per Q tile: 64 or 128
  static constexpr int kStages = kStages_;                 // Q (and dO) tiles in flight
  static constexpr int kDsBuffers = 2;  // dS^T: a consumer writes the next one while the other reads
  // Q, K, V and dO as v8 keeps them (hopper::tile_columns: swizzle blocks of 64 or 32 columns,
  // the tile padded to whole blocks); the zeros past D add 0 to S^T and dP^T and give dQ, dK and
  // dV columns that are never written. A tile table entry may pad further, to a multiple of 64
  // (D = 80 and 96 in the D = 128 tiles). dS^T, whose columns are the Q tile's rows, keeps the
  // 128-byte swizzle at every D.
  static constexpr int kTileColumns = kTileColumns_;
  static constexpr hopper::Swizzle kSwizzle = hopper::head_dim_swizzle(kTileColumns);
  static constexpr int kSwizzleColumns = hopper::row_columns(kSwizzle);
  static constexpr int kColumnBlocks = kTileColumns / kSwizzleColumns;
  static constexpr hopper::Swizzle kDsSwizzle = hopper::Swizzle::bytes128;
  static constexpr int kDsSwizzleColumns = hopper::row_columns(kDsSwizzle);
  static constexpr int kDSteps = kTileColumns / 16;  // k-steps of S^T and dP^T (over D)
  static constexpr int kRowSteps = kBlockM / 16;  // k-steps of dV and dK (over query rows)
  static constexpr int kKeySteps = kBlockN / 16;  // k-steps of dQ (over the block's keys)
  // dQ of a Q tile is kBlockM x D; a consumer computes a 64-row share (one wgmma M): with 64
  // rows a tile, half of the columns each, with 128 rows, half of the rows each.
  static constexpr int kDqRowGroups = kBlockM / 64;
  static constexpr int kDqColumns = kTileColumns * kDqRowGroups / kConsumers;
  __host__ __device__ static constexpr int dq_row0(int consumer) {
    return 64 * (consumer * kDqRowGroups / kConsumers);
  }
  __host__ __device__ static constexpr int dq_column0(int consumer) {
    return (consumer % (kConsumers / kDqRowGroups)) * kDqColumns;
  }
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static constexpr uint32_t kElementBytes = 2;  // fp16 or bf16
  static constexpr uint32_t kRowTileBytes = kBlockM * kTileColumns * kElementBytes;  // Q or dO,
  static constexpr uint32_t kKVBytes = kBlockN * kTileColumns * kElementBytes;  // zeros included
  static constexpr uint32_t kRowVectorBytes = kBlockM * sizeof(float);  // L or D of a Q tile
  // row_vectors_kernel's lanes per row: one per 8 tile columns, a power of two (its shuffles).
  static constexpr int kRowVectorLanes = kTileColumns <= 32 ? 4 : kTileColumns <= 64 ? 8 : 16;
  static_assert(kRowVectorLanes * 8 >= kTileColumns, "a lane for every 8 columns");
  static constexpr uint32_t kDqBytes = 64 * kDqColumns * sizeof(float);  // a consumer's dQ share
  static_assert(kHeadDim % 16 == 0 && kTileColumns >= kHeadDim && kTileColumns % kSwizzleColumns == 0,
                "whole k16 steps, in whole swizzle blocks");
  static_assert(kDqColumns % kSwizzleColumns == 0, "a consumer's dQ columns start on a column block");
  static_assert(kBlockM == 64 || kBlockM == 128, "one or two 64-row dQ shares");
  static_assert(kRowTileBytes % 1024 == 0 && kKVBytes % 1024 == 0 && kDqBytes % 1024 == 0,
                "tiles keep 1024-byte alignment");
};

// Every tile a multiple of 1024 bytes, so each keeps the swizzle's alignment.
template <typename T, typename Element>
struct SharedStorage {
  Element k[T::kBlockN * T::kTileColumns];  // [column block][kBlockN][64 or 32]
  Element v[T::kBlockN * T::kTileColumns];
  Element q[T::kStages][T::kBlockM * T::kTileColumns];    // [column block][kBlockM][64 or 32]
  Element d_o[T::kStages][T::kBlockM * T::kTileColumns];
  Element ds[T::kDsBuffers][T::kBlockN * T::kBlockM];  // dS^T: [kBlockN keys][kBlockM queries]
  float dq[T::kConsumers][64 * T::kDqColumns];        // thread order (dq_sum_offset)
  float lse[T::kStages][T::kBlockM];                  // L log2(e) of the Q tile's rows
  float dot[T::kStages][T::kBlockM];                  // D of the same rows
  uint64_t kv_full[1];
  uint64_t q_full[T::kStages], q_empty[T::kStages];
  uint64_t d_o_full[T::kStages], d_o_empty[T::kStages];
};
template <typename T>
constexpr uint32_t kSharedBytes = sizeof(SharedStorage<T, __half>) + 1024;  // + alignment

// Each consumer thread releases a Q or dO stage itself (Ring::release_thread says why).
template <typename T>
constexpr uint32_t kConsumerThreads = 128 * T::kConsumers;

// The fp32 dQ sum is kept in the order the consumers' registers hold it, not row by row: a
// consumer's 64 x kDqColumns share of a Q tile is kDqColumns / 8 chunks of 128 threads x 4
// floats (chunk j: the accumulators of 8-column block j). Each thread stages 16-byte pieces, a
// warp 512 contiguous bytes, with no bank conflicts, and the share is one contiguous bulk
// reduce-add. dq_convert_kernel puts the values back in place (dq_place says where).
template <typename T>
__host__ __device__ constexpr int64_t dq_sum_offset(int64_t q_tile, int consumer) {
  return (q_tile * T::kConsumers + consumer) * (64 * T::kDqColumns);
}
// Whether 4-float piece `piece` of the sum (counted from its start) holds columns below D. Where
// the tile pads D (80 and 96 in 128 columns), the others are padding that nothing reads: the
// first kernel leaves them unzeroed and the last one unread, 3/8 of the sum's bytes at D = 80.
template <typename T>
__host__ __device__ constexpr bool holds_head_dim(int64_t piece) {
  if (T::kTileColumns == T::kHeadDim) return true;
  constexpr int kSharePieces = 64 * T::kDqColumns / 4;
  const int consumer = int(piece / kSharePieces % T::kConsumers);
  return T::dq_column0(consumer) + 8 * int(piece % kSharePieces / 128) < T::kHeadDim;
}
// The workspace's Q tiles (the dQ sum, L log2(e) and D of kBlockM rows each), numbered: for
// sequences of one length, the row tiles of slice after slice; for packed sequences, one row of
// `tiles_per_slice` tiles per head, sequence s's from PackedScheduler's start(s) on (a sequence
// gets as many as its rows need, or one spare, which stays unused). first() numbers a sequence's
// tile 0, locate() finds the (sequence, head, tile) of a number.
template <int kBlockM, bool kPacked>
struct QTiles {
  int tiles_per_slice;  // row tiles of a slice, or per head of all packed sequences
  int heads;
  policies::PackedScheduler<kBlockM> packed;  // over cu_seqlens_q, one head: kPacked only

  __device__ __forceinline__ int64_t first(int sequence, int head) const {
    if constexpr (kPacked) return int64_t(head) * tiles_per_slice + packed.start(sequence);
    return (int64_t(sequence) * heads + head) * tiles_per_slice;
  }
  // slice, head, batch (the sequence) and tile of tile `number`; tile * kBlockM may be past a
  // packed sequence's end (its spare).
  __device__ __forceinline__ policies::WorkTile locate(int64_t number) const {
    const int slice = int(number / tiles_per_slice), tile = int(number % tiles_per_slice);
    if constexpr (kPacked) {
      const policies::WorkTile at = packed.at(tile);  // slice = head here
      return {at.batch * heads + slice, slice, at.batch, at.tile, at.row0};
    }
    return {slice, slice % heads, slice / heads, tile, tile * kBlockM};
  }
};

// One (sequence, head)'s rows of a contiguous gradient: [B, H, rows, D] (row stride D) or, packed,
// [total, H, D] (row stride H D).
template <typename Element>
struct GradientRows {
  Element* first;  // row 0
  int64_t stride;  // elements from one row to the next
  __device__ __forceinline__ Element* row(int r) const { return first + int64_t(r) * stride; }
};
template <bool kPacked, int kHeadDim, typename Element>
__device__ __forceinline__ GradientRows<Element> gradient_rows(Element* tensor, int sequence, int head,
                                                               int heads, int start, int rows) {
  if constexpr (kPacked) return {tensor + (int64_t(start) * heads + head) * kHeadDim, int64_t(heads) * kHeadDim};
  return {tensor + (int64_t(sequence) * heads + head) * rows * kHeadDim, kHeadDim};
}

// Where chunk j of thread t's share lies in dQ: 8-column block j of rows `row` and row + 8,
// columns `column` and + 1 (ptx.cuh's accumulator layout).
struct DqPlace {
  int row, column;
};
template <typename T>
__host__ __device__ constexpr DqPlace dq_place(int row_tile, int consumer, int thread, int j) {
  return {row_tile * T::kBlockM + T::dq_row0(consumer) + 16 * (thread / 32) + (thread % 32) / 4,
          T::dq_column0(consumer) + 8 * j + 2 * (thread % 4)};
}
// dQ = scale x a complete sum: a chunk's four values to their place in a sequence's dQ, rows
// past its `tokens` and the padding columns past D dropped.
template <typename T, typename Element>
__device__ __forceinline__ void write_dq_chunk(const GradientRows<Element>& dq_rows, DqPlace place,
                                               float4 value, int tokens, float scale) {
  if (T::kTileColumns != T::kHeadDim && place.column >= T::kHeadDim) return;
  if (place.row < tokens) {
    *reinterpret_cast<uint32_t*>(dq_rows.row(place.row) + place.column) =
        fragment_math::pack_pair<Element>(value.x * scale, value.y * scale);
  }
  if (place.row + 8 < tokens) {
    *reinterpret_cast<uint32_t*>(dq_rows.row(place.row + 8) + place.column) =
        fragment_math::pack_pair<Element>(value.z * scale, value.w * scale);
  }
}

// ---- 1. L log2(e) and D = rowsum(dO o O), padded to whole Q tiles; the dQ sum zeroed ------------

// A group of lanes per row of [slices][row_tiles * kBlockM], one per 8 columns of the tile,
// rounded up to a power of two (8 at D = 64, 16 at D = 80, 96 and 128, the lanes past D idle):
// each lane reads 8 elements of O and of dO, 16 bytes each, so every lane of a warp
// has a load in flight whatever D is (a warp per row left three lanes in four idle at D = 64,
// and the kernel ran at a quarter to three fifths of the memory bandwidth). A row past its
// sequence's end (past N, or into the next packed sequence, whose rows a packed Q tile's TMA
// copy brings in with its own) gets L log2(e) = +inf and D = 0, as does a row that sees no key
// (every key padded, or above a bottom-right diagonal: L = -inf, O = 0): its P =
// exp2(S^T scale log2(e) - inf) = 0, so dS = 0, and it adds nothing anywhere. The padding makes
// every Q tile's values one aligned 256-byte bulk copy. The same lanes zero as much of the dQ
// sum as the row has tile columns (the sum is laid out by threads, not rows, but it is as
// large), but for the pieces of padding columns (holds_head_dim); the main kernel adds into it:
// one pass over memory instead of a memset of its own before this one; and they write dQ = 0
// for the rows of a sequence that no block visits (rows i with i + diagonal < 0, or every row
// of a sequence without keys: no other pass writes them in the deterministic mode).
// lse_rows: L's rows per (sequence, head) slice, N ([B, H, N]), or all of them when packed ([H, total]).
template <typename T, typename Element, bool kPacked>
__global__ void row_vectors_kernel(const Element* __restrict__ o, const Element* __restrict__ d_o,
                                   attn::TensorStrides o_strides, attn::TensorStrides d_o_strides,
                                   const float* __restrict__ log_sum_exp, float* __restrict__ lse_log2,
                                   float* __restrict__ row_dot, float* __restrict__ dq_sum,
                                   Element* __restrict__ dq, int64_t padded_rows,
                                   const QTiles<T::kBlockM, kPacked> q_tiles,
                                   const policies::Sequences<kPacked> sequences,
                                   const policies::Mask<true> launch_mask, bool causal, int tokens,
                                   int lse_rows) {
  constexpr int kBlockM = T::kBlockM, kHeadDim = T::kHeadDim, kTileColumns = T::kTileColumns;
  constexpr int kLanesPerRow = T::kRowVectorLanes;
  const int64_t padded_row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanesPerRow;
  const int column = threadIdx.x % kLanesPerRow * 8;
  const bool in_workspace = padded_row < padded_rows;
  const policies::WorkTile tile = q_tiles.locate(in_workspace ? padded_row / kBlockM : 0);
  const policies::SequenceSpan span = sequences.of(tile.batch, tokens, launch_mask.kv_tokens);
  const int token = tile.row0 + int(padded_row % kBlockM);  // of its sequence
  const bool in_tensor = in_workspace && token < span.tokens;
  const int64_t row = span.q_start + token;  // in the tensors' row coordinate
  float sum = 0.0f;
  if (in_tensor && column < kHeadDim) {
    // O and dO where they lie: the forward's view of O, dO as autograd hands it over.
    auto at = [&](const attn::TensorStrides& strides) {
      return span.batch * strides.batch + tile.head * strides.head + row * strides.token + column;
    };
    const uint4 o_chunk = *reinterpret_cast<const uint4*>(o + at(o_strides));
    const uint4 d_o_chunk = *reinterpret_cast<const uint4*>(d_o + at(d_o_strides));
    const uint32_t* o_pairs = reinterpret_cast<const uint32_t*>(&o_chunk);
    const uint32_t* d_o_pairs = reinterpret_cast<const uint32_t*>(&d_o_chunk);
    for (int i = 0; i < 4; ++i) {
      const float2 a = fragment_math::unpack_pair<Element>(o_pairs[i]);
      const float2 b = fragment_math::unpack_pair<Element>(d_o_pairs[i]);
      sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
  }
  // Every lane takes part in the shuffles: the row's group adds up its lanes' sums.
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset, kLanesPerRow);
  }
  if (!in_workspace) return;
  if (column < kTileColumns) {
    const int64_t piece = (padded_row * kTileColumns + column) / 4;  // this lane zeroes two
    float4* zeros = reinterpret_cast<float4*>(dq_sum) + piece;
    for (int k = 0; k < 2; ++k) {
      if (holds_head_dim<T>(piece + k)) zeros[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  if (!in_tensor) {
    if (column == 0) {
      row_dot[padded_row] = 0.0f;
      lse_log2[padded_row] = INFINITY;
    }
    return;
  }
  const int diagonal = sequences.mask(span, launch_mask).diagonal;
  const int unseen_rows = span.kv_tokens == 0 ? span.tokens : causal ? max(-diagonal, 0) : 0;
  if (token < unseen_rows && column < kHeadDim) {
    const GradientRows<Element> dq_rows =
        gradient_rows<kPacked, kHeadDim>(dq, tile.batch, tile.head, q_tiles.heads, span.q_start, span.tokens);
    *reinterpret_cast<uint4*>(dq_rows.row(token) + column) = make_uint4(0, 0, 0, 0);
  }
  if (column == 0) {
    row_dot[padded_row] = sum;
    const float log_sum_exp_row = log_sum_exp[(int64_t(span.batch) * q_tiles.heads + tile.head) * lse_rows + row];
    lse_log2[padded_row] = log_sum_exp_row == -INFINITY ? INFINITY : log_sum_exp_row * kLog2e;
  }
}

// ---- 2. dK, dV per K/V tile; dQ added up in L2 ------------------------------------------------

// The Q tiles a block visits, in its order: `steps` of them from first_row_tile, wrapping past
// the slice's last tile to the first one the block sees.
struct QTileWalk {
  int first_row_tile, steps, row_tiles;
  __device__ __forceinline__ int at(int step) const {
    const int row_tile = first_row_tile + step;
    return row_tile < row_tiles ? row_tile : row_tile - steps;
  }
};

// The producer: one thread loads the block's K and V once, then Q with L and dO with D for every
// Q tile of the walk. span: the block's sequence (where its rows lie in the tensors); q_tile0:
// the workspace number of its Q tile 0 (QTiles).
template <typename T, typename Element>
__device__ __forceinline__ void produce(SharedStorage<T, Element>& smem, hopper::Ring<1>& kv_ring,
                                        hopper::Ring<T::kStages>& q_ring,
                                        hopper::Ring<T::kStages>& d_o_ring, const CUtensorMap& q_map,
                                        const CUtensorMap& k_map, const CUtensorMap& v_map,
                                        const CUtensorMap& d_o_map, const float* __restrict__ lse_log2,
                                        const float* __restrict__ row_dot,
                                        const policies::WorkTile& work,
                                        const policies::SequenceSpan& span, int64_t q_tile0,
                                        const QTileWalk& walk) {
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kSwizzleColumns = T::kSwizzleColumns;
  // BEGIN EXERCISE: load K and V once, then Q with L and dO with D for every Q tile of the walk
  uint64_t* kv_full = kv_ring.arm(0, 2 * T::kKVBytes);
  for (int c = 0; c < T::kColumnBlocks; ++c) {
    hopper::tma_load(smem.k + c * kBlockN * kSwizzleColumns, &k_map, kv_full, c * kSwizzleColumns,
                     span.kv_start + work.row0, work.head, span.batch);
    hopper::tma_load(smem.v + c * kBlockN * kSwizzleColumns, &v_map, kv_full, c * kSwizzleColumns,
                     span.kv_start + work.row0, work.head, span.batch);
  }
  for (int step = 0; step < walk.steps; ++step) {
    const int row_tile = walk.at(step);
    q_ring.wait_empty(step);
    uint64_t* q_full = q_ring.arm(step, T::kRowTileBytes + T::kRowVectorBytes);
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      hopper::tma_load(smem.q[q_ring.slot(step)] + c * kBlockM * kSwizzleColumns, &q_map, q_full,
                       c * kSwizzleColumns, span.q_start + row_tile * kBlockM, work.head, span.batch);
    }
    const int64_t vectors = (q_tile0 + row_tile) * kBlockM;  // the Q tile's padded L and D
    hopper::bulk_load(smem.lse[q_ring.slot(step)], lse_log2 + vectors,
                      T::kRowVectorBytes, q_full);
    d_o_ring.wait_empty(step);
    uint64_t* d_o_full = d_o_ring.arm(step, T::kRowTileBytes + T::kRowVectorBytes);
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      hopper::tma_load(smem.d_o[d_o_ring.slot(step)] + c * kBlockM * kSwizzleColumns, &d_o_map,
                       d_o_full, c * kSwizzleColumns, span.q_start + row_tile * kBlockM, work.head, span.batch);
    }
    hopper::bulk_load(smem.dot[d_o_ring.slot(step)], row_dot + vectors,
                      T::kRowVectorBytes, d_o_full);
  }
  // END EXERCISE
}

// S^T = K Q^T and dP^T = V dO^T for a consumer's 64 keys (my_keys, my_values: its rows of K and
// V) and a Q tile (q_tile, d_o_tile): two groups, issued and committed, S^T first.
template <typename T, typename Element>
__device__ __forceinline__ void wgmma_scores(float (&s_acc)[T::kBlockM / 2], float (&dp_acc)[T::kBlockM / 2],
                                             const Element* my_keys, const Element* my_values,
                                             const Element* q_tile, const Element* d_o_tile,
                                             hopper::Ring<1>& kv_ring, hopper::Ring<T::kStages>& q_ring,
                                             hopper::Ring<T::kStages>& d_o_ring, int step,
                                             hopper::WgmmaGroups& groups) {
  const hopper::KMajorOperand<T::kBlockN, T::kSwizzle> keys(my_keys), values(my_values);
  const hopper::KMajorOperand<T::kBlockM, T::kSwizzle> queries(q_tile), output_grads(d_o_tile);
  kv_ring.read(0, groups);
  q_ring.read(step, groups);
  hopper::wgmma_fence();
  for (int d = 0; d < T::kDSteps; ++d) {
    hopper::wgmma_ss<Element>(s_acc, keys.k_step(d), queries.k_step(d), d > 0);
  }
  groups.commit();
  kv_ring.read(0, groups);
  d_o_ring.read(step, groups);
  for (int d = 0; d < T::kDSteps; ++d) {
    hopper::wgmma_ss<Element>(dp_acc, values.k_step(d), output_grads.k_step(d), d > 0);
  }
  groups.commit();
}

// ---- The consumers' arithmetic, one Q tile: a thread's two keys (rows of S^T) of each 16 ----
// Element e of 8-column block i of an accumulator is query 8i + 2 quad_lane + e % 2 (a column
// of S^T), key lane / 4 of the warp's 16 (e < 2) or that + 8.

// P^T = exp2(S^T scale log2(e) - L log2(e)), in place; lse: the Q tile's L log2(e).
template <typename T>
__device__ __forceinline__ void probabilities(float (&s_acc)[T::kBlockM / 2], const float* lse,
                                              int quad_lane, float scale_log2) {
  constexpr int kBlockM = T::kBlockM;
  for (int i = 0; i < kBlockM / 8; ++i) {
    const float2 l = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * quad_lane);
    for (int e = 0; e < 4; ++e) {
      s_acc[4 * i + e] = hopper::fast_exp2(fmaf(s_acc[4 * i + e], scale_log2, e % 2 ? -l.y : -l.x));
    }
  }
}

// In a Q tile the causal diagonal crosses, P = 0 (so dS = 0) where the query does not see the
// key: this thread's keys are my_key0 (e / 2 = 0) and my_key0 + 8.
template <typename T, bool kCausal>
__device__ __forceinline__ void mask_causal(float (&s_acc)[T::kBlockM / 2],
                                            const policies::Mask<kCausal>& mask, int row0,
                                            int my_key0, int quad_lane) {
  constexpr int kBlockM = T::kBlockM;
  for (int i = 0; i < kBlockM / 8; ++i) {
    for (int e = 0; e < 4; ++e) {
      const int query = row0 + 8 * i + 2 * quad_lane + e % 2;
      if (!mask.sees(query, my_key0 + 8 * (e / 2))) s_acc[4 * i + e] = 0.0f;
    }
  }
}

// dS^T = P^T o (dP^T - D), in dp_acc; dot: the Q tile's D.
template <typename T>
__device__ __forceinline__ void scores_grad(float (&dp_acc)[T::kBlockM / 2],
                                            const float (&s_acc)[T::kBlockM / 2], const float* dot,
                                            int quad_lane) {
  constexpr int kBlockM = T::kBlockM;
  for (int i = 0; i < kBlockM / 8; ++i) {
    const float2 row_dots = *reinterpret_cast<const float2*>(dot + 8 * i + 2 * quad_lane);
    for (int e = 0; e < 4; ++e) {
      dp_acc[4 * i + e] = s_acc[4 * i + e] * (dp_acc[4 * i + e] - (e % 2 ? row_dots.y : row_dots.x));
    }
  }
}

// P^T and dS^T in fp16 (or bf16) as wgmma's A operand, 16 queries a k-step (v8's packing), the
// dS of keys past N zeroed.
template <typename T, typename Element>
__device__ __forceinline__ void pack_gradients(uint32_t (&p_fragments)[T::kRowSteps][4],
                                               uint32_t (&ds_fragments)[T::kRowSteps][4],
                                               const float (&s_acc)[T::kBlockM / 2],
                                               const float (&dp_acc)[T::kBlockM / 2],
                                               const bool (&key_in_range)[2],
                                               const uint32_t (&key_bits)[2]) {
  constexpr int kHeadDim = T::kHeadDim;
  for (int s = 0; s < T::kRowSteps; ++s) {
    for (int pair = 0; pair < 4; ++pair) {
      p_fragments[s][pair] = hopper::pack_pair<Element>(s_acc[8 * s + 2 * pair], s_acc[8 * s + 2 * pair + 1]);
      // The mask in the form that leaves ptxas without a spill at each head dim: an AND with
      // all ones or zeros at D = 64, a select on the predicate at D = 128 (chapter 17).
      if constexpr (kHeadDim == 64) {
        ds_fragments[s][pair] =
            hopper::pack_pair<Element>(dp_acc[8 * s + 2 * pair], dp_acc[8 * s + 2 * pair + 1]) & key_bits[pair % 2];
      } else {
        ds_fragments[s][pair] =
            key_in_range[pair % 2] ? hopper::pack_pair<Element>(dp_acc[8 * s + 2 * pair], dp_acc[8 * s + 2 * pair + 1]) : 0u;
      }
    }
  }
}

// dS^T into a shared buffer ([kBlockN keys][kBlockM queries], swizzled), for dQ: pair 2p + h
// of k-step s is 8-column block 2s + p / 2 (the queries), row my_row + 8 h (the key, of the
// block's 128).
template <typename T, typename Element>
__device__ __forceinline__ void write_scores_grad(Element* ds_tile,
                                                  const uint32_t (&ds_fragments)[T::kRowSteps][4],
                                                  int my_row, int quad_lane) {
  unsigned char* ds_bytes = reinterpret_cast<unsigned char*>(ds_tile);
  for (int s = 0; s < T::kRowSteps; ++s) {
    for (int pair = 0; pair < 4; ++pair) {
      const int key = my_row + 8 * (pair % 2);
      const int query = 8 * (2 * s + pair / 2) + 2 * quad_lane;
      *reinterpret_cast<uint32_t*>(ds_bytes + hopper::swizzled_offset<T::kDsSwizzle>(key, query, T::kBlockN)) =
          ds_fragments[s][pair];
    }
  }
}

// Adds a consumer's dQ share of Q tile row_tile (workspace number q_tile) into the fp32 sum in L2:
// through its staging buffer and the copy engine's reduce-add, or in the deterministic mode in
// place, in turn behind the blocks of the sequence's earlier K/V tiles (dq_turns); the last of the
// `adds` blocks that add into the Q tile adds in registers and writes dQ (dq_rows) instead.
template <typename T, bool kDeterministic, typename Element>
__device__ __forceinline__ void add_dq(const float (&dq_acc)[T::kDqColumns / 2], float* __restrict__ dq_sum,
                                       int* __restrict__ dq_turns, const GradientRows<Element>& dq_rows,
                                       SharedStorage<T, Element>& smem,
                                       hopper::StagingBuffer& dq_staging, int64_t q_tile,
                                       int row_tile, int adds, int consumer, int key_tile,
                                       int thread_in_group, int tokens, float scale) {
  // BEGIN EXERCISE: add this consumer's dQ of the Q tile into the fp32 sum in L2
  float* dq_share = dq_sum + dq_sum_offset<T>(q_tile, consumer);
  if constexpr (kDeterministic) {
    // Wait for the blocks of the K/V tiles before this one, add in place, pass the turn on.
    int* turn = dq_turns + q_tile * T::kConsumers + consumer;
    if (thread_in_group == 0) {
      while (*static_cast<volatile int*>(turn) != key_tile) {
      }
      __threadfence();
    }
    hopper::named_barrier_sync(NamedBarrier::epilogue, consumer, 128);
    // Every load before any store: a store to dQ between them could alias the next load, and the
    // loads would wait for each other (1.15-1.58 times the mode's time, measured).
    float4* sum = reinterpret_cast<float4*>(dq_share) + thread_in_group;
    float4 values[T::kDqColumns / 8];
    for (int j = 0; j < T::kDqColumns / 8; ++j) {
      values[j] = __ldcg(sum + j * 128);
      values[j].x += dq_acc[4 * j];
      values[j].y += dq_acc[4 * j + 1];
      values[j].z += dq_acc[4 * j + 2];
      values[j].w += dq_acc[4 * j + 3];
    }
    const bool last = key_tile == adds - 1;
    if (last) {  // no block waits for this turn
      for (int j = 0; j < T::kDqColumns / 8; ++j) {
        write_dq_chunk<T>(dq_rows, dq_place<T>(row_tile, consumer, thread_in_group, j), values[j], tokens, scale);
      }
      return;
    }
    for (int j = 0; j < T::kDqColumns / 8; ++j) __stcg(sum + j * 128, values[j]);
    __threadfence();
    hopper::named_barrier_sync(NamedBarrier::epilogue, consumer, 128);
    if (thread_in_group == 0) atomicExch(turn, key_tile + 1);
  } else {
    // Stage (once the last reduce has read the buffer), then one thread hands it to the copy
    // engine.
    if (thread_in_group == 0) dq_staging.wait_read();
    dq_staging.sync();
    dq_staging.begin_writes();
    for (int j = 0; j < T::kDqColumns / 8; ++j) {
      reinterpret_cast<float4*>(smem.dq[consumer])[j * 128 + thread_in_group] =
          make_float4(dq_acc[4 * j], dq_acc[4 * j + 1], dq_acc[4 * j + 2], dq_acc[4 * j + 3]);
    }
    dq_staging.fence();
    dq_staging.sync();
    if (thread_in_group == 0) {
      hopper::bulk_reduce_add(dq_share, smem.dq[consumer], T::kDqBytes);
      dq_staging.commit();
    }
  }
  // SKELETON: if (thread_in_group == 0) atomicAdd(dq_sum + dq_sum_offset<T>(q_tile, consumer), NAN);
  // END EXERCISE
}

// dK = scale dS^T Q and dV, this thread's two keys of each 16, straight from the accumulators,
// into the sequence's rows of dK and dV (dk_rows, dv_rows). A padded key (key_in_range false, but below
// N_k) gets zeros: its dS was zeroed (so its dK is 0), but its P was not, and dV's row is P^T dO.
template <typename T, typename Element>
__device__ __forceinline__ void store_key_gradients(const GradientRows<Element>& dk_rows,
                                                    const GradientRows<Element>& dv_rows,
                                                    const float (&dk_acc)[T::kTileColumns / 2],
                                                    const float (&dv_acc)[T::kTileColumns / 2],
                                                    int my_key0,
                                                    const bool (&key_in_range)[2], int kv_tokens,
                                                    int quad_lane, float scale) {
  constexpr int kHeadDim = T::kHeadDim;
  for (int half = 0; half < 2; ++half) {
    const int key = my_key0 + 8 * half;
    if (key >= kv_tokens) continue;
    Element* dk_row = dk_rows.row(key);
    Element* dv_row = dv_rows.row(key);
    for (int d = 0; d < kHeadDim / 8; ++d) {
      const int column = d * 8 + 2 * quad_lane;
      *reinterpret_cast<uint32_t*>(dk_row + column) =
          hopper::pack_pair<Element>(dk_acc[4 * d + 2 * half] * scale, dk_acc[4 * d + 2 * half + 1] * scale);
      // A select, not a product: a padded key's P may have overflowed, and inf x 0 is NaN.
      *reinterpret_cast<uint32_t*>(dv_row + column) =
          key_in_range[half] ? hopper::pack_pair<Element>(dv_acc[4 * d + 2 * half], dv_acc[4 * d + 2 * half + 1]) : 0u;
    }
  }
}

template <typename T, typename Element, bool kDeterministic, bool kCausal, bool kPacked>
__global__ void __launch_bounds__(T::kThreads, 1)
    hopper_backward_kernel(const __grid_constant__ CUtensorMap q_map,
                           const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map,
                           const __grid_constant__ CUtensorMap d_o_map,
                           const float* __restrict__ lse_log2, const float* __restrict__ row_dot,
                           float* __restrict__ dq_sum, int* __restrict__ dq_turns,
                           Element* __restrict__ dq, Element* __restrict__ dk,
                           Element* __restrict__ dv, const uint8_t* __restrict__ key_padding,
                           int heads, int tokens, const policies::Mask<kCausal> launch_mask,
                           int key_tiles, const QTiles<T::kBlockM, kPacked> q_tiles,
                           const policies::Sequences<kPacked> sequences, int sequence_count,
                           float scale, float scale_log2) {
  constexpr int kHeadDim = T::kHeadDim, kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  constexpr int kSwizzleColumns = T::kSwizzleColumns;
  hopper::allow_dependent_launch();  // the last kernel's blocks may start as this one's last ones run
  extern __shared__ unsigned char shared_raw[];
  SharedStorage<T, Element>& smem = *reinterpret_cast<SharedStorage<T, Element>*>(
      shared_raw + (1024 - hopper::shared_address(shared_raw) % 1024) % 1024);
  hopper::Ring<1> kv_ring(Buffer::kv, smem.kv_full, nullptr);  // one use: this block's K and V
  hopper::Ring<T::kStages> q_ring(Buffer::q, smem.q_full, smem.q_empty);        // Q and L
  hopper::Ring<T::kStages> d_o_ring(Buffer::d_o, smem.d_o_full, smem.d_o_empty);  // dO and D

  const int warp_group = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // Block b: K/V tile b % key_tiles of slice b / key_tiles; under the causal mask, the longest
  // first within groups of kCausalGroupSlices slices; packed, the K/V tiles that exist, sequence
  // by sequence and head by head (policies/tile_scheduler.cuh). Its sequence's span and mask.
  policies::WorkTile work;
  if constexpr (kPacked) {
    work = policies::PackedScheduler<kBlockN>{sequences.cu_seqlens_k, sequence_count, heads, 0}.at(int(blockIdx.x));
  } else {
    const policies::TileScheduler<kBlockN> scheduler{key_tiles, heads};
    work = kCausal ? scheduler.longest_first(kCausalGroupSlices) : scheduler.this_block();
  }
  const policies::SequenceSpan span = sequences.of(work.batch, tokens, launch_mask.kv_tokens);
  const policies::Mask<kCausal> mask = sequences.mask(span, launch_mask);
  if (kPacked && work.row0 >= span.kv_tokens) return;  // the walk's spare tile past the sequence's keys
  const int key_tile = work.tile;
  const int key0 = work.row0;
  const int row_tiles = kPacked ? (span.tokens + kBlockM - 1) / kBlockM : q_tiles.tiles_per_slice;
  const int sequence_key_tiles = kPacked ? (span.kv_tokens + kBlockN - 1) / kBlockN : key_tiles;
  const int64_t q_tile0 = q_tiles.first(work.batch, work.head);  // the workspace's number of Q tile 0
  hopper::StagingBuffer dq_staging(warp_group - 1, Buffer::dq_staging);
  // dS^T, written by both consumers (64 keys each), read by both for dQ.
  using DsOperand = hopper::ThreadOperand<T::kDsBuffers, T::kConsumers>;
  DsOperand ds(Buffer::ds, warp_group - 1);

  // The Q tiles in the order this block visits them: walk.steps of them, from the first that sees
  // its keys (every one without the causal mask). As in v9, each block of a slice starts at its
  // own Q tile, so that they do not all add into the same rows of dQ at once; in the
  // deterministic mode they all go in order, one behind the other. Under the causal mask the
  // first visible Q tile already differs from block to block.
  const int first_visible = mask.first_row(key0) / kBlockM;
  const QTileWalk walk{
      kDeterministic || kCausal ? first_visible : int(int64_t(key_tile) * row_tiles / sequence_key_tiles),
      max(row_tiles - first_visible, 0), row_tiles};  // none for keys no query sees

  if (threadIdx.x == 0) {
    kv_ring.init_full();
    q_ring.init(kConsumerThreads<T>);
    d_o_ring.init(kConsumerThreads<T>);
    for (int c = 0; c < T::kConsumers; ++c) hopper::StagingBuffer(c, Buffer::dq_staging).init();
    DsOperand::init();
    hopper::fence_barrier_init();
  }
  __syncthreads();

  if (warp_group == 0) {
    // ---------------- Producer: one thread issues every copy ----------------
    hopper::release_registers<T::kProducerRegisters>();
    if (warp != 0 || lane != 0) return;
    produce<T, Element>(smem, kv_ring, q_ring, d_o_ring, q_map, k_map, v_map, d_o_map, lse_log2,
                        row_dot, work, span, q_tile0, walk);
    return;
  }

  // ---------------- Consumers: two warpgroups, 64 keys each ----------------
  hopper::claim_registers<T::kConsumerRegisters>();
  const int consumer = warp_group - 1;
  const int thread_in_group = threadIdx.x % 128;
  const int quad_lane = lane % 4;
  hopper::WgmmaGroups groups;

  // This consumer's 64 keys of K and V (rows of the block's tiles), as the A operand of S^T and
  // dP^T; the columns of K its dQ share needs, as the B operand of dQ.
  const Element* my_keys = smem.k + consumer * 64 * kSwizzleColumns;
  const Element* my_values = smem.v + consumer * 64 * kSwizzleColumns;
  constexpr int kDqColumns = T::kDqColumns;
  const int dq_column0 = T::dq_column0(consumer);
  const Element* my_dq_keys = smem.k + (dq_column0 / kSwizzleColumns) * kBlockN * kSwizzleColumns +
                              dq_column0 % kSwizzleColumns;

  // This thread's keys: rows warp * 16 + lane / 4 (+ 8) of its consumer's 64, the two rows of
  // each 16 of dS^T it writes. Keys past N_k (the last K/V tile's tail) are TMA's zero rows, so
  // their score is 0 and P = exp(-L), which overflows fp16 where a row's scores all lie far below
  // 0, and inf times their zero K row in dQ is NaN. As in v9, their dS never reaches dQ: each
  // packed pair of dS of such a key is zeroed as it is made, with no branch in the walk. Their
  // zero dS reaches only their own rows of dK, which are never written. Keys the key-padding mask
  // pads are out of range the same way, at no cost in the walk; their dK and dV are written as
  // zeros. Query rows past N need nothing: zero Q and dO rows, L and D padded with 0, give them
  // dS = 0.
  const int my_key0 = key0 + consumer * 64 + warp * 16 + lane / 4;
  auto in_range = [&](int key) {
    return key < mask.kv_tokens &&
           (key_padding == nullptr || key_padding[int64_t(work.batch) * mask.kv_tokens + key] == 0);
  };
  const bool key_in_range[2] = {in_range(my_key0), in_range(my_key0 + 8)};
  const uint32_t key_bits[2] = {key_in_range[0] ? ~0u : 0u, key_in_range[1] ? ~0u : 0u};
  float dv_acc[T::kTileColumns / 2] = {};  // D = 80: 96 columns, the last 16 zeros never written
  float dk_acc[T::kTileColumns / 2] = {};
  // The sequence's rows of dQ (the deterministic mode writes them), dK and dV.
  const GradientRows<Element> dq_rows =
      gradient_rows<kPacked, kHeadDim>(dq, work.batch, work.head, heads, span.q_start, span.tokens);
  kv_ring.wait_full(0);

  for (int step = 0; step < walk.steps; ++step) {
    const int row_tile = walk.at(step);
    q_ring.wait_full(step);
    d_o_ring.wait_full(step);
    const int q_slot = q_ring.slot(step), d_o_slot = d_o_ring.slot(step);

    // S^T = K Q^T and dP^T = V dO^T, 64 keys x 64 queries each: two groups, S^T first.
    float s_acc[kBlockM / 2], dp_acc[kBlockM / 2];
    wgmma_scores<T, Element>(s_acc, dp_acc, my_keys, my_values, smem.q[q_slot], smem.d_o[d_o_slot],
                             kv_ring, q_ring, d_o_ring, step, groups);

    // P^T = exp2(S^T scale log2(e) - L log2(e)) while dP^T is still on the tensor cores. Element
    // e of 8-column block i is query 8i + 2 quad_lane + e % 2 (a column of S^T).
    groups.wait<1>();
    hopper::fence_registers(s_acc);
    probabilities<T>(s_acc, smem.lse[q_slot], quad_lane, scale_log2);
    // In a Q tile the causal diagonal crosses, P = 0 (so dS = 0) where the query does not see
    // the key: this thread's keys are my_key0 (e / 2 = 0) and my_key0 + 8.
    if (kCausal && !mask.rows_all_see(row_tile * kBlockM, key0, kBlockN)) {
      mask_causal<T>(s_acc, mask, row_tile * kBlockM, my_key0, quad_lane);
    }
    // dS^T = P^T o (dP^T - D).
    groups.wait<0>();
    hopper::fence_registers(dp_acc);
    scores_grad<T>(dp_acc, s_acc, smem.dot[d_o_slot], quad_lane);

    // P^T and dS^T in fp16 (or bf16) as wgmma's A operand, 16 queries a k-step (v8's packing),
    // and dS^T into shared memory for dQ, with zeros for keys past N.
    uint32_t p_fragments[T::kRowSteps][4], ds_fragments[T::kRowSteps][4];
    pack_gradients<T, Element>(p_fragments, ds_fragments, s_acc, dp_acc, key_in_range, key_bits);
    ds.begin_writes(step);
    write_scores_grad<T>(smem.ds[ds.slot(step)], ds_fragments, consumer * 64 + warp * 16 + lane / 4,
                         quad_lane);
    ds.fence(step);  // read next by wgmma, the other consumer's too

    // Three groups, oldest first: dV += P^T dO; dQ = dS K; dK += dS^T Q. dQ leaves while dK runs.
    // dV and dK: A from registers, B with the queries as the k dimension.
    const hopper::MNMajorOperand<kBlockM, T::kSwizzle> output_grads(smem.d_o[d_o_slot]), queries(smem.q[q_slot]);
    for (int s = 0; s < T::kRowSteps; ++s) {
      hopper::fence_registers(p_fragments[s]);
      hopper::fence_registers(ds_fragments[s]);
    }
    hopper::fence_registers(dv_acc);
    hopper::fence_registers(dk_acc);
    d_o_ring.read(step, groups);
    hopper::wgmma_fence();
    for (int s = 0; s < T::kRowSteps; ++s) {
      hopper::wgmma_rs<Element>(dv_acc, p_fragments[s], output_grads.k_step(s), true);
    }
    groups.commit();

    // dQ = dS K over the block's 128 keys, this consumer's share: both consumers' dS^T must be
    // written. A is dS^T read transposed (its rows are keys, the k dimension; its columns from
    // the share's first row), B is K likewise (from the share's first column).
    ds.publish();
    float dq_acc[kDqColumns / 2];
    {
      const hopper::MNMajorOperand<kBlockN, T::kDsSwizzle> scores_grad(
          smem.ds[ds.read(step, groups)] + (T::dq_row0(consumer) / T::kDsSwizzleColumns) * kBlockN * T::kDsSwizzleColumns);
      const hopper::MNMajorOperand<kBlockN, T::kSwizzle> keys(my_dq_keys);
      kv_ring.read(0, groups);
      for (int s = 0; s < T::kKeySteps; ++s) {
        hopper::wgmma_ss<Element, true>(dq_acc, scores_grad.k_step(s), keys.k_step(s), s > 0);
      }
      groups.commit();
    }
    q_ring.read(step, groups);
    for (int s = 0; s < T::kRowSteps; ++s) {
      hopper::wgmma_rs<Element>(dk_acc, ds_fragments[s], queries.k_step(s), true);
    }
    groups.commit();
    groups.wait<1>();  // dV and dQ are done; dK may still run
    hopper::fence_registers(dq_acc);
    ds.release(step, groups);

    // The blocks that add into this Q tile's dQ: those of the K/V tiles its rows see.
    const int adds = mask.kv_tiles(row_tile * kBlockM, kBlockM, kBlockN);
    add_dq<T, kDeterministic>(dq_acc, dq_sum, dq_turns, dq_rows, smem, dq_staging, q_tile0 + row_tile,
                              row_tile, adds, consumer, key_tile, thread_in_group, span.tokens, scale);

    groups.wait<0>();
    hopper::fence_registers(dv_acc);
    hopper::fence_registers(dk_acc);
    for (int s = 0; s < T::kRowSteps; ++s) {
      hopper::fence_registers(p_fragments[s]);
      hopper::fence_registers(ds_fragments[s]);
    }
    q_ring.release_thread(step, groups);
    d_o_ring.release_thread(step, groups);
  }
  if (thread_in_group == 0) dq_staging.wait();  // shared memory must outlive the reduces

  store_key_gradients<T, Element>(
      gradient_rows<kPacked, kHeadDim>(dk, work.batch, work.head, heads, span.kv_start, span.kv_tokens),
      gradient_rows<kPacked, kHeadDim>(dv, work.batch, work.head, heads, span.kv_start, span.kv_tokens),
      dk_acc, dv_acc, my_key0, key_in_range, mask.kv_tokens, quad_lane, scale);
}

// ---- 3. dQ = scale * the sum, back in row order ---------------------------------------------------

// One thread per 4 floats of the sum, chunk j of thread t of a consumer's share (dq_place). Only
// the non-deterministic mode needs it: there the adds finish in no known order, and counting them
// in the main kernel cost more than this kernel (chapter 17).
template <typename T, typename Element, bool kPacked>
__global__ void dq_convert_kernel(const float* __restrict__ dq_sum, Element* __restrict__ dq,
                                  int64_t chunks, const QTiles<T::kBlockM, kPacked> q_tiles,
                                  const policies::Sequences<kPacked> sequences, int tokens, float scale) {
  hopper::wait_for_previous_grid();  // the main kernel's adds
  const int64_t chunk = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks || !holds_head_dim<T>(chunk)) return;
  constexpr int kShareChunks = 64 * T::kDqColumns / 4;  // a consumer's share of a Q tile
  const int64_t share = chunk / kShareChunks;
  const int within = int(chunk % kShareChunks);
  const int consumer = int(share % T::kConsumers);
  const policies::WorkTile tile = q_tiles.locate(share / T::kConsumers);
  const policies::SequenceSpan span = sequences.of(tile.batch, tokens, 0);
  if (kPacked && tile.row0 >= span.tokens) return;  // a spare tile past its sequence's end
  write_dq_chunk<T>(gradient_rows<kPacked, T::kHeadDim>(dq, tile.batch, tile.head, q_tiles.heads, span.q_start, span.tokens),
                    dq_place<T>(tile.tile, consumer, within % 128, within / 128),
                    reinterpret_cast<const float4*>(dq_sum)[chunk], span.tokens, scale);
}

// ---- Launch ---------------------------------------------------------------------------------

// The workspace, per Q tile (QTiles' numbers): the fp32 dQ sum (kBlockM x D), L log2(e) and D
// (kBlockM each), and the deterministic mode's turn counters (one per consumer). Packed sequences
// take H (total / kBlockM + B) tiles: as many as their rows need, and a spare each at most.
struct Workspace {
  float* dq_sum;
  float* lse_log2;
  float* row_dot;
  int* dq_turns;
};
template <typename T>
int64_t q_tiles_per_slice(bool packed, int64_t sequences, int64_t tokens, int64_t total_tokens) {
  return packed ? total_tokens / T::kBlockM + sequences : (tokens + T::kBlockM - 1) / T::kBlockM;
}
template <typename T>
std::size_t workspace_bytes_for(int64_t q_tiles) {
  return std::size_t(q_tiles) * (T::kBlockM * T::kTileColumns + 2 * T::kBlockM + T::kConsumers) * 4;
}
template <typename T>
Workspace workspace_for(void* base, int64_t tiles) {
  float* dq_sum = static_cast<float*>(base);
  float* lse_log2 = dq_sum + tiles * T::kBlockM * T::kTileColumns;
  float* row_dot = lse_log2 + tiles * T::kBlockM;
  return {dq_sum, lse_log2, row_dot, reinterpret_cast<int*>(row_dot + tiles * T::kBlockM)};
}

// The launch, for sequences of one length (kPacked false) or packed ones.
template <typename Element, typename T, bool kPacked>
void launch_for(const attn::BackwardArgs& args) {
  const auto* o = reinterpret_cast<const Element*>(args.o);
  const auto* d_o = reinterpret_cast<const Element*>(args.d_o);
  const attn::PackedSequences& packed = args.sequences;
  // The workspace's Q tiles: per (sequence, head) slice, or per head of all packed sequences.
  const int64_t slices = kPacked ? args.heads : int64_t(args.batch) * args.heads;
  const int tiles_per_slice =
      int(q_tiles_per_slice<T>(kPacked, args.batch, args.tokens, packed.total_tokens));
  const int64_t q_tile_count = slices * tiles_per_slice;
  const Workspace workspace = workspace_for<T>(args.workspace, q_tile_count);
  const QTiles<T::kBlockM, kPacked> q_tiles{
      tiles_per_slice, args.heads, {packed.cu_seqlens_q, args.batch, 1, tiles_per_slice}};
  const policies::Sequences<kPacked> sequences = [&] {
    if constexpr (kPacked) {
      return policies::Sequences<true>{packed.cu_seqlens_q, packed.cu_seqlens_k,
                                       args.causal == attn::Causal::bottom_right};
    } else {
      return policies::Sequences<false>{};
    }
  }();
  // Rows of Q, O and dO (and of K and V) in the tensors' row coordinate, and their strides: a
  // packed tensor [total, H, D] is one batch element of `total` rows.
  const int q_rows = kPacked ? packed.total_tokens : args.tokens;
  const int kv_rows = kPacked ? packed.total_kv_tokens : args.kv_tokens;
  auto strides = [&](attn::TensorStrides given, int rows) {
    return kPacked ? hopper::packed_strides(given, args.heads, args.head_dim, rows)
                   : attn::actual_strides(given, args.heads, rows, args.head_dim);
  };

  if (args.deterministic) {
    CUDA_CHECK(cudaMemsetAsync(workspace.dq_turns, 0,
                               std::size_t(q_tile_count * T::kConsumers) * sizeof(int), args.stream));
  }
  const int diagonal = int(attn::causal_diagonal(args.causal, args.tokens, args.kv_tokens));
  const int64_t padded_rows = q_tile_count * T::kBlockM;
  constexpr int kRowThreads = 256;
  const int64_t row_threads = padded_rows * T::kRowVectorLanes;
  row_vectors_kernel<T, Element, kPacked>
      <<<unsigned((row_threads + kRowThreads - 1) / kRowThreads), kRowThreads, 0, args.stream>>>(
          o, d_o, strides(args.o_strides, q_rows), strides(args.d_o_strides, q_rows), args.log_sum_exp,
          workspace.lse_log2, workspace.row_dot, workspace.dq_sum, reinterpret_cast<Element*>(args.dq),
          padded_rows, q_tiles, sequences, policies::Mask<true>{args.kv_tokens, diagonal},
          args.causal != attn::Causal::none, args.tokens, q_rows);
  CUDA_CHECK_LAUNCH();

  // Q and dO in Q tiles of N rows a slice, K and V in the block's tile of N_k rows a slice, each
  // box one swizzle block wide, read where they lie: the maps carry the views' strides.
  auto map = [&](const void* tensor, attn::TensorStrides given, int rows, int box_rows) {
    return hopper::tensor_map(tensor, args.dtype, kPacked ? 1 : args.batch, args.heads, rows,
                              args.head_dim, strides(given, rows), box_rows, T::kSwizzleColumns,
                              hopper::tensor_map_swizzle(T::kSwizzle));
  };
  const CUtensorMap q_map = map(args.q, args.qkv_strides, q_rows, T::kBlockM),
                    k_map = map(args.k, args.qkv_strides, kv_rows, T::kBlockN),
                    v_map = map(args.v, args.qkv_strides, kv_rows, T::kBlockN),
                    d_o_map = map(args.d_o, args.d_o_strides, q_rows, T::kBlockM);
  // Block b serves K/V tile b % key_tiles of slice b / key_tiles (under the causal mask, in the
  // longest-first order of groups of slices; packed, PackedScheduler's order, a spare tile per
  // sequence and head at most). In the deterministic mode a block waits only for the blocks of
  // its sequence's earlier K/V tiles, which have lower indices in every order: the GPU starts
  // blocks in index order, so those are running or done, and never wait on it. (Under the
  // causal mask the Q tiles a K/V tile visits are also visited by every earlier one.)
  const int key_tiles = (args.kv_tokens + T::kBlockN - 1) / T::kBlockN;
  const int64_t blocks = kPacked ? int64_t(args.heads) * (packed.total_kv_tokens / T::kBlockN + args.batch)
                                 : int64_t(args.batch) * args.heads * key_tiles;
  if (blocks > INT32_MAX) throw attn::CudaError("v10: more than 2^31 blocks");
  attn::with_flags(
      [&](auto deterministic, auto causal) {
        constexpr bool kCausal = decltype(causal)::value;
        auto kernel = hopper_backward_kernel<T, Element, decltype(deterministic)::value, kCausal, kPacked>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kSharedBytes<T>)));
        kernel<<<unsigned(blocks), T::kThreads, kSharedBytes<T>, args.stream>>>(
            q_map, k_map, v_map, d_o_map, workspace.lse_log2, workspace.row_dot, workspace.dq_sum,
            workspace.dq_turns, reinterpret_cast<Element*>(args.dq),
            reinterpret_cast<Element*>(args.dk), reinterpret_cast<Element*>(args.dv),
            args.key_padding_mask, args.heads, args.tokens,
            policies::Mask<kCausal>{args.kv_tokens, diagonal}, key_tiles, q_tiles, sequences,
            args.batch, float(args.scale), float(M_LOG2E * args.scale));
      },
      args.deterministic, args.causal != attn::Causal::none);
  CUDA_CHECK_LAUNCH();
  if (args.deterministic) return;  // the last turn of each Q tile wrote dQ

  // The last kernel is launched as the main kernel's dependent: its blocks start as the main
  // kernel's last ones run and wait there for its adds (ptx.cuh). Launching the main kernel so
  // after the first gained more at N = 197 but cost 2-4% at (8, 12, 4097, 64) (chapter 17).
  const int64_t chunks = q_tile_count * T::kBlockM * T::kTileColumns / 4;
  constexpr int kConvertThreads = 256;
  hopper::launch_dependent(dq_convert_kernel<T, Element, kPacked>,
                           unsigned((chunks + kConvertThreads - 1) / kConvertThreads), kConvertThreads,
                           0, args.stream, workspace.dq_sum, reinterpret_cast<Element*>(args.dq),
                           chunks, q_tiles, sequences, args.tokens, float(args.scale));
  CUDA_CHECK_LAUNCH();
}

// Query rows per Q tile and Q/dO stages at each head dim (and the tile's columns, where they are
// not D rounded up to a swizzle block), chosen by measurement (chapter 17): at D = 64, 128-row Q
// tiles (the consumers split dQ's rows) were 9-15% faster than 64-row ones; at D = 128 the
// registers allow 64 rows only (dK and dV alone hold 128 a thread), and a third stage gained
// nothing. At D = 80 and 96, 96 columns with 128-row tiles spill (dK, dV, S^T and dP^T hold 224
// a thread) and leave shared memory for one stage only; 64-row tiles with 96 columns would start
// the second consumer's dQ columns inside a 32-column swizzle block (column 48), which an operand
// descriptor here cannot express; so they run the D = 128 tiles, zeros past D. A define replaces one: -DATTN_V10_TILES_D64=64\,2.
#ifndef ATTN_V10_TILES_D64
#define ATTN_V10_TILES_D64 128, 2
#endif
#ifndef ATTN_V10_TILES_D128
#define ATTN_V10_TILES_D128 64, 2
#endif
#ifndef ATTN_V10_TILES_D32
#define ATTN_V10_TILES_D32 128, 2
#endif
#ifndef ATTN_V10_TILES_D80
#define ATTN_V10_TILES_D80 64, 2, 128
#endif
#ifndef ATTN_V10_TILES_D96
#define ATTN_V10_TILES_D96 64, 2, 128
#endif

// The step's one list of them: the registration's head dims, the launch and the shared memory.
using TileTable = attn::TileTable<Tiles<32, ATTN_V10_TILES_D32>, Tiles<64, ATTN_V10_TILES_D64>,
                                  Tiles<80, ATTN_V10_TILES_D80>, Tiles<96, ATTN_V10_TILES_D96>,
                                  Tiles<128, ATTN_V10_TILES_D128>>;

void launch_hopper_backward(const attn::BackwardArgs& args) {
  if (args.sequences.packed()) {
    if (args.key_padding_mask != nullptr) {
      throw std::invalid_argument("v10: packed sequences take no key-padding mask (each sequence's keys are its own)");
    }
    // No query anywhere gives dK = dV = 0, no key dQ = 0, and no tensor map can be made of a
    // tensor of zero rows: zeros without a kernel (dQ, dK and dV are contiguous [total, H, D]).
    const attn::PackedSequences& packed = args.sequences;
    if (packed.total_tokens == 0 || packed.total_kv_tokens == 0) {
      const std::size_t row_bytes = std::size_t(args.heads) * args.head_dim * sizeof(__half);  // fp16 or bf16
      CUDA_CHECK(cudaMemsetAsync(args.dq, 0, packed.total_tokens * row_bytes, args.stream));
      CUDA_CHECK(cudaMemsetAsync(args.dk, 0, packed.total_kv_tokens * row_bytes, args.stream));
      CUDA_CHECK(cudaMemsetAsync(args.dv, 0, packed.total_kv_tokens * row_bytes, args.stream));
      return;
    }
  }
  TileTable::with_shape(args.head_dim, [&](auto tiles) {
    attn::with_element_type(args.dtype, [&](auto element) {
      attn::with_flags(
          [&](auto packed) { launch_for<decltype(element), decltype(tiles), decltype(packed)::value>(args); },
          args.sequences.packed());
    });
  });
}

std::size_t workspace_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  TileTable::with_shape(shape.head_dim, [&](auto tiles) {
    using T = decltype(tiles);
    const int64_t slices = shape.packed() ? shape.heads : shape.slices();
    bytes = workspace_bytes_for<T>(
        slices * q_tiles_per_slice<T>(shape.packed(), shape.batch, shape.tokens, shape.total_tokens()));
  });
  return bytes;
}

// Independent of N: K, V, the Q and dO stages, two dS^T buffers, the dQ staging.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  TileTable::with_shape(shape.head_dim, [&](auto tiles) { bytes = kSharedBytes<decltype(tiles)>; });
  return bytes;
}

// The tiles along N, for the tests (step.hpp): a Q tile and a consumer's 64 rows of its dQ; a
// block's keys and a consumer's 64.
attn::TileSizes tile_sizes(int head_dim) {
  attn::TileSizes sizes;
  TileTable::with_shape(head_dim, [&](auto tiles) {
    using T = decltype(tiles);
    sizes = {{T::kBlockM, 64}, {T::kBlockN, 64}};
  });
  return sizes;
}

}  // namespace

ATTN_REGISTER_STEP(attn::backward_step_info(ATTN_STEP_ID,
                                            "Hopper backward: TMA producer, 2 wgmma consumers, dQ "
                                            "by bulk reduce-add",
                                            launch_hopper_backward)
                       .serving(TileTable::head_dims(), {attn::DType::fp16, attn::DType::bf16})
                       .with_shared_bytes(shared_bytes_needed)
                       .with_workspace(workspace_bytes_needed)
                       .with_tiles(tile_sizes)
                       .with_pipeline_report(hopper::kPipelineReport)
                       .with_deterministic_mode()
                       .taking_kv_tokens()
                       .taking_key_padding_mask()
                       .taking_strides()
                       .taking_causal()
                       .taking_packed_sequences())
