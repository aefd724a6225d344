// Step v9: the FlashAttention-2 backward. Given Q, K, V, the forward's O and L (each row's
// log-sum-exp, which step 6 writes) and dO, it computes dQ, dK and dV without ever storing P or
// dS in device memory: P is rebuilt from L, tile by tile, exactly as the forward made it.
//
//   1. D_i = dO_i . O_i for every row (a small kernel): the softmax's Jacobian, one number a row.
//   2. One block per K/V tile (16 keys per warp) walks every Q tile of the slice:
//        S^T = K Q^T            P^T = exp(S^T scale - L)          (registers)
//        dV += P^T dO           dP^T = V dO^T                      (registers)
//        dS^T = P^T o (dP^T - D)
//        dK += dS^T Q                                              (registers)
//        dQ += dS K             dS through shared memory, added into an fp32 dQ with atomics
//      dK and dV stay in registers for the whole walk and are written once.
//   3. dQ = fp16(scale * the fp32 sum) (a small kernel); dK = scale * its sum on the way out.
// In the deterministic mode (BackwardArgs::deterministic) step 2 leaves dQ alone and a pass of
// its own computes it, one Q tile per block, with no atomics: the same bits on every run.
//
// What is new against v6: the keys, not the queries, are what a block owns (dK and dV are sums
// over every query, dQ a sum over every key: one of the two must be shared between blocks, and
// FlashAttention-2 shares dQ); five products instead of two, each one's operand already in the
// layout mma.sync wants (S^T's accumulators are P^T's A fragment for dV, as in v6); and dS, the
// one operand needed transposed, goes through shared memory.
// Serves, on sm_80 and newer: fp16 and bf16 (every kernel is a template on the element type, as
// step 6's is); head dims 32, 64, 80, 96 and 128 (multiples of 16, so the fragments tile D
// exactly; the warps of each in the tile table below); N_k keys for N queries (cross-attention:
// a block owns keys of N_k and walks Q tiles of N); the causal mask in either alignment (the mask
// policy says which Q tiles a block of keys walks, and the tiles the diagonal crosses are masked
// element by element); and the key-padding mask (kMasked, kernels of their own): a padded key's
// dS is kept out of dQ as a key past N_k is, and its dK and dV are written as 0. A row that sees
// no key (L = -inf) gets P = 0 (lse_for_p): dQ = 0, and nothing added to dK or dV.
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
#include "step.hpp"
#include "ampere/fragment_math.cuh"
#include "ampere/warp_mma.cuh"
#include "policies/mask.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#pragma nv_diag_suppress 177  // sm_75: the kernels are stubs (below), their helpers go unused
#endif

namespace {

using fragment_math::fast_exp2;
using fragment_math::from_float;
using fragment_math::pack_pair;
using fragment_math::unpack_pair;
using warp_mma::cp_async_16;
using warp_mma::cp_async_commit;
using warp_mma::cp_async_wait;
using warp_mma::ldmatrix_x4;
using warp_mma::ldmatrix_x4_trans;
using warp_mma::mma_16x8x16;

constexpr float kLog2e = 1.4426950408889634f;

// ---- Tile geometry --------------------------------------------------------------------------

// kWarps warps own 16 keys each: a block's K/V tile has 16 kWarps keys. For dQ = dS K, 64 query
// rows by D columns, the warps split the rows in four groups of 16 and, with 8 warps, the columns
// in two halves.
template <int kHeadDimValue, int kWarpsValue>
struct Tiles {
  static constexpr int kHeadDim = kHeadDimValue;
  static constexpr int kWarps = kWarpsValue;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = 16 * kWarps;  // keys per block: 16 per warp
  static constexpr int kBlockM = 64;           // query rows per step of the walk
  static constexpr int kDqColumnGroups = kWarps / 4;
  static constexpr int kDqTiles = kHeadDim / 8 / kDqColumnGroups;  // n-tiles of a warp's dQ
  static_assert(kWarps == 4 || kWarps == 8, "dQ's 64 rows go to 4 warps, or 8 with D halved");
  static_assert(kDqTiles % 2 == 0, "a warp's dQ n-tiles go in pairs (one ldmatrix.x4 of K): at "
                                   "D = 80, half of D is 5 n-tiles, so 4 warps");
  static constexpr int kStride = kHeadDim + 8;  // padded 16 B: ldmatrix conflict-free
  static constexpr int kDsStride = kBlockN + 8;
  static constexpr int kDChunks = kHeadDim / 16;   // k-steps over D
  static constexpr int kDTiles = kHeadDim / 8;     // n-tiles of dK, dV, dQ
  static constexpr int kRowTiles = kBlockM / 8;    // n-tiles of S^T (query columns)
  static constexpr int kRowChunks = kBlockM / 16;  // k-steps over query rows
  static constexpr int kKeyChunks = kBlockN / 16;  // k-steps over keys (dQ)
  // K, V; two stages of Q and dO; dS; two stages of L and D (64 floats each).
  static constexpr std::size_t kTileHalves = std::size_t(kBlockN) * kStride;
  static constexpr std::size_t kSharedBytes =
      (2 * kTileHalves + 4 * std::size_t(kBlockM) * kStride + std::size_t(kBlockM) * kDsStride) *
          2 +  // 16-bit elements
      4 * kBlockM * sizeof(float);
  static_assert(kHeadDim % 16 == 0, "fragments tile D by 16");
};

// Rows [row0, row0 + kRows) of a [tokens, D] slice (N rows of Q or dO, N_k of K or V) into a
// padded shared tile; rows >= tokens become 0.
template <int kRows, int kHeadDim, int kStride, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_async(Element* tile, const Element* slice, int row0,
                                                int tokens) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int chunk = threadIdx.x; chunk < kRows * kChunksPerRow; chunk += kThreads) {
    const int r = chunk / kChunksPerRow, column = (chunk % kChunksPerRow) * 8;
    const int row = row0 + r;
    const bool inside = row < tokens;
    cp_async_16(tile + r * kStride + column, slice + int64_t(inside ? row : 0) * kHeadDim + column,
                inside ? 16 : 0);
  }
}

// L as P = exp(S - L) takes it. A row that sees no key (only under a mask: every key it could
// see is padding, or it lies above the causal diagonal with N > N_k) has L = -inf from the
// forward, and O = 0, so D = 0. exp(S + inf) would be inf, and its dS NaN; as L = +inf its P is
// 0 for every key, as the forward's was, so it gets dQ = 0 and adds nothing to dK and dV. The
// identity in a kernel whose rows all see a key (kRowsMaySeeNoKey false).
template <bool kRowsMaySeeNoKey>
__device__ __forceinline__ float lse_for_p(float lse) {
  return kRowsMaySeeNoKey && lse == -INFINITY ? INFINITY : lse;
}

// Values [row0, row0 + kRows) of one slice's row vector (L or D) into shared memory; past N, 0.
// Plain loads: a slice's rows start at any 4-byte boundary, and cp.async copies 16 aligned bytes.
// kNoKeyLse: the values are L in a kernel whose rows may see no key, stored as lse_for_p gives.
template <int kRows, bool kNoKeyLse = false>
__device__ __forceinline__ void load_rows(float* rows, const float* slice_rows, int row0,
                                          int tokens) {
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) {
    rows[r] = row0 + r < tokens ? lse_for_p<kNoKeyLse>(slice_rows[row0 + r]) : 0.0f;
  }
}

// ---- 1. D = rowsum(dO o O) ----------------------------------------------------------------------

template <typename Element>
__global__ void row_dot_kernel(const Element* __restrict__ o, const Element* __restrict__ d_o,
                               float* __restrict__ row_dot, int64_t rows, int head_dim) {
  // One warp per row: each lane takes 8 of the D values (one 16-byte load of each tensor).
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int column = lane * 8; column < head_dim; column += 32 * 8) {
    const uint4 o_chunk = *reinterpret_cast<const uint4*>(o + row * head_dim + column);
    const uint4 d_o_chunk = *reinterpret_cast<const uint4*>(d_o + row * head_dim + column);
    const uint32_t* o_pairs = reinterpret_cast<const uint32_t*>(&o_chunk);
    const uint32_t* d_o_pairs = reinterpret_cast<const uint32_t*>(&d_o_chunk);
    for (int i = 0; i < 4; ++i) {
      const float2 a = unpack_pair<Element>(o_pairs[i]), b = unpack_pair<Element>(d_o_pairs[i]);
      sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) row_dot[row] = sum;
}

// ---- 2. dK, dV per K/V tile; dQ added up across tiles ------------------------------------------

// kAtomicDq: this kernel also adds dQ into the fp32 sum (the default); without it, dQ is left
// to dq_pass_kernel below, the deterministic mode. kMasked: key_padding ([B, N_k] bytes, 1:
// padding; slice / heads is the batch) marks keys whose P is 0 (kernels of their own, so the
// unmasked ones are unchanged). Q, dO and dQ have `tokens` rows a slice (N), K, V, dK and dV
// mask.kv_tokens (N_k).
template <typename Element, int kHeadDim, int kWarps, bool kAtomicDq, bool kMasked, bool kCausal>
__global__ void __launch_bounds__(Tiles<kHeadDim, kWarps>::kThreads)
    flash_backward_kernel(const Element* __restrict__ q, const Element* __restrict__ k,
                          const Element* __restrict__ v, const Element* __restrict__ d_o,
                          const float* __restrict__ log_sum_exp, const float* __restrict__ row_dot,
                          float* __restrict__ dq_sum, Element* __restrict__ dk,
                          Element* __restrict__ dv, int tokens, const policies::Mask<kCausal> mask,
                          int key_tiles, float scale, float scale_log2,
                          const uint8_t* __restrict__ key_padding, int heads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return;  // cp.async and mma.m16n8k16 need sm_80; the registration says 8.0
#else
  using T = Tiles<kHeadDim, kWarps>;
  constexpr bool kRowsMaySeeNoKey = kMasked || kCausal;  // rows whose L is -inf (lse_for_p)
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* k_tile = reinterpret_cast<Element*>(shared_bytes);
  Element* v_tile = k_tile + T::kTileHalves;
  Element* q_tiles = v_tile + T::kTileHalves;                  // two stages
  Element* d_o_tiles = q_tiles + 2 * T::kBlockM * T::kStride;  // two stages
  Element* ds_tile = d_o_tiles + 2 * T::kBlockM * T::kStride;  // [query][key]
  float* lse_rows = reinterpret_cast<float*>(ds_tile + T::kBlockM * T::kDsStride);  // two stages
  float* dot_rows = lse_rows + 2 * T::kBlockM;                                      // two stages

  const int key_tile = blockIdx.x % key_tiles;
  const int64_t slice = blockIdx.x / key_tiles;
  const int64_t slice_offset = slice * tokens * kHeadDim;  // of Q, dO and dQ: N rows a slice
  const int kv_tokens = mask.kv_tokens;
  const int64_t kv_slice_offset = slice * kv_tokens * kHeadDim;  // of K, V, dK and dV: N_k rows
  const int key0 = key_tile * T::kBlockN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;
  const int row_tiles = (tokens + T::kBlockM - 1) / T::kBlockM;

  // Where this block's walk starts: the K/V tiles of a slice run side by side, and walking the Q
  // tiles in one order, all of them would add into the same rows of dQ at the same moment, queued
  // behind each other at L2's atomic units. Spread evenly, each walks the same tiles from its own
  // first one. Under the causal mask the walk is the `walk` Q tiles from the first that sees the
  // block's keys (policies/mask.cuh), and those already start apart; none (walk <= 0) where no
  // row sees them, at the top left with N_k > N.
  const int first_visible = mask.first_row(key0) / T::kBlockM;
  const int walk = row_tiles - first_visible;
  const int first_row_tile = kCausal ? first_visible : int(int64_t(key_tile) * row_tiles / key_tiles);
  auto row_tile_at = [&](int step) {
    const int row_tile = first_row_tile + step;
    return row_tile < row_tiles ? row_tile : row_tile - walk;
  };
  auto load_row_tile = [&](int row_tile, int stage) {
    const int row0 = row_tile * T::kBlockM;
    load_tile_async<T::kBlockM, kHeadDim, T::kStride, T::kThreads>(
        q_tiles + stage * T::kBlockM * T::kStride, q + slice_offset, row0, tokens);
    load_tile_async<T::kBlockM, kHeadDim, T::kStride, T::kThreads>(
        d_o_tiles + stage * T::kBlockM * T::kStride, d_o + slice_offset, row0, tokens);
    load_rows<T::kBlockM, kRowsMaySeeNoKey>(lse_rows + stage * T::kBlockM, log_sum_exp + slice * tokens,
                                            row0, tokens);
    load_rows<T::kBlockM>(dot_rows + stage * T::kBlockM, row_dot + slice * tokens, row0, tokens);
  };
  // K and V of this block, the first Q, dO, L and D; then the walk over Q tiles. A block with no
  // walk loads nothing (no copy is left in flight when it ends) and writes dK = dV = 0.
  if (!kCausal || walk > 0) {
    load_tile_async<T::kBlockN, kHeadDim, T::kStride, T::kThreads>(k_tile, k + kv_slice_offset, key0, kv_tokens);
    load_tile_async<T::kBlockN, kHeadDim, T::kStride, T::kThreads>(v_tile, v + kv_slice_offset, key0, kv_tokens);
    load_row_tile(row_tile_at(0), 0);
  }
  cp_async_commit();

  // This warp's 16 keys: the rows of dK and dV it owns. Two kinds of key keep a dS that is not 0
  // in registers and must not add to dQ:
  //   - keys past N_k (the last tile's tail): zero rows of K and V, so their score is 0 and
  //     P = exp(-L): 1e13 for a row whose scores all lie far below 0 (L = -30), which overflows
  //     fp16, and inf times their zero K row in dQ = dS K is NaN in every dQ of the row;
  //   - keys the padding mask marks (kMasked): P = 0 in the forward, rebuilt here as if they were
  //     not padded.
  // So their dS never reaches dQ: the threads that hold them leave their entries of ds_tile at
  // the zeros written here, once, and skip them below (a store with a predicate, no instruction
  // more per Q tile). In registers their P and dS reach only their own rows of dK and dV: never
  // written past N_k, written as 0 for a padded key. Query rows past N need nothing: zero Q and
  // dO rows, with L and D read as 0, give P = 1 and dP = 0, so dS = 0, and they add nothing.
  const int warp_key0 = warp * 16;
  const bool key_inside[2] = {key0 + warp_key0 + group < kv_tokens, key0 + warp_key0 + group + 8 < kv_tokens};
  bool key_kept[2] = {key_inside[0], key_inside[1]};  // inside N_k and not padding
  if constexpr (kMasked) {
    const uint8_t* padding = key_padding + (slice / heads) * kv_tokens + key0 + warp_key0 + group;
    key_kept[0] = key_inside[0] && padding[0] == 0;
    key_kept[1] = key_inside[1] && padding[8] == 0;
  }
  if (kAtomicDq && (kMasked || key0 + T::kBlockN > kv_tokens)) {  // the last K/V tile, or padding
    for (int n = 0; n < T::kRowTiles; ++n) {
      for (int e = 0; e < 4; ++e) {
        if (!key_kept[e / 2]) {
          ds_tile[(n * 8 + 2 * quad_lane + e % 2) * T::kDsStride + warp_key0 + group + 8 * (e / 2)] =
              from_float<Element>(0.0f);
        }
      }
    }
  }
  float dk_acc[T::kDTiles][4] = {};
  float dv_acc[T::kDTiles][4] = {};

  for (int step = 0; step < walk; ++step) {
    const int row_tile = row_tile_at(step), stage = step % 2;
    const Element* q_tile = q_tiles + stage * T::kBlockM * T::kStride;
    const Element* d_o_tile = d_o_tiles + stage * T::kBlockM * T::kStride;
    const float* lse = lse_rows + stage * T::kBlockM;
    const float* dot = dot_rows + stage * T::kBlockM;
    cp_async_wait<0>();
    __syncthreads();  // this stage has landed, and every warp is done with the other one and dS
    if (step + 1 < walk) load_row_tile(row_tile_at(step + 1), 1 - stage);
    cp_async_commit();

    // S^T = K Q^T (16 keys x 64 queries) and dP^T = V dO^T, side by side: A from K and V rows,
    // B from Q and dO rows (both [query][d] in shared memory, as K was in v6's Q K^T).
    float s_acc[T::kRowTiles][4] = {};
    float dp_acc[T::kRowTiles][4] = {};
    for (int c = 0; c < T::kDChunks; ++c) {
      uint32_t k_fragment[4], v_fragment[4];
      ldmatrix_x4(k_fragment, k_tile + (warp_key0 + lane % 16) * T::kStride + c * 16 + (lane / 16) * 8);
      ldmatrix_x4(v_fragment, v_tile + (warp_key0 + lane % 16) * T::kStride + c * 16 + (lane / 16) * 8);
      for (int pair = 0; pair < T::kRowTiles / 2; ++pair) {
        const int b_row = (pair * 16 + lane % 8 + (lane / 16) * 8) * T::kStride + c * 16 + ((lane / 8) % 2) * 8;
        uint32_t q_fragment[4], d_o_fragment[4];
        ldmatrix_x4(q_fragment, q_tile + b_row);
        ldmatrix_x4(d_o_fragment, d_o_tile + b_row);
        mma_16x8x16<Element>(s_acc[2 * pair], k_fragment, q_fragment[0], q_fragment[1]);
        mma_16x8x16<Element>(s_acc[2 * pair + 1], k_fragment, q_fragment[2], q_fragment[3]);
        mma_16x8x16<Element>(dp_acc[2 * pair], v_fragment, d_o_fragment[0], d_o_fragment[1]);
        mma_16x8x16<Element>(dp_acc[2 * pair + 1], v_fragment, d_o_fragment[2], d_o_fragment[3]);
      }
    }

    // P^T = exp(S^T scale - L) and dS^T = P^T o (dP^T - D), in place: element e of n-tile n is
    // key row group + 8 (e / 2), query column n * 8 + 2 quad_lane + e % 2. (A row that sees no
    // key has L = +inf here, so P = 0: lse_for_p.)
    for (int n = 0; n < T::kRowTiles; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int column = n * 8 + 2 * quad_lane + e % 2;
        const float p = fast_exp2(fmaf(s_acc[n][e], scale_log2, -lse[column] * kLog2e));
        s_acc[n][e] = p;
        dp_acc[n][e] = p * (dp_acc[n][e] - dot[column]);
      }
    }
    // In a Q tile the causal diagonal crosses, P = 0 and dS = 0 where the query does not see the key.
    if (kCausal && !mask.rows_all_see(row_tile * T::kBlockM, key0, T::kBlockN)) {
      for (int n = 0; n < T::kRowTiles; ++n) {
        for (int e = 0; e < 4; ++e) {
          const int query = row_tile * T::kBlockM + n * 8 + 2 * quad_lane + e % 2;
          if (!mask.sees(query, key0 + warp_key0 + group + 8 * (e / 2))) {
            s_acc[n][e] = 0.0f;
            dp_acc[n][e] = 0.0f;
          }
        }
      }
    }

    // dV += P^T dO and dK += dS^T Q: the accumulators of two neighbouring 8-query tiles are, in
    // fp16, the A fragment of a 16-query step (as P was in v6); B is dO and Q with the queries
    // as the k dimension, read transposed.
    for (int c = 0; c < T::kRowChunks; ++c) {
      const uint32_t p_fragment[4] = {
          pack_pair<Element>(s_acc[2 * c][0], s_acc[2 * c][1]), pack_pair<Element>(s_acc[2 * c][2], s_acc[2 * c][3]),
          pack_pair<Element>(s_acc[2 * c + 1][0], s_acc[2 * c + 1][1]),
          pack_pair<Element>(s_acc[2 * c + 1][2], s_acc[2 * c + 1][3])};
      const uint32_t ds_fragment[4] = {
          pack_pair<Element>(dp_acc[2 * c][0], dp_acc[2 * c][1]), pack_pair<Element>(dp_acc[2 * c][2], dp_acc[2 * c][3]),
          pack_pair<Element>(dp_acc[2 * c + 1][0], dp_acc[2 * c + 1][1]),
          pack_pair<Element>(dp_acc[2 * c + 1][2], dp_acc[2 * c + 1][3])};
      for (int pair = 0; pair < T::kDTiles / 2; ++pair) {
        const int b_offset = (c * 16 + lane % 8 + ((lane / 8) % 2) * 8) * T::kStride + pair * 16 + (lane / 16) * 8;
        uint32_t d_o_fragment[4], q_fragment[4];
        ldmatrix_x4_trans(d_o_fragment, d_o_tile + b_offset);
        ldmatrix_x4_trans(q_fragment, q_tile + b_offset);
        mma_16x8x16<Element>(dv_acc[2 * pair], p_fragment, d_o_fragment[0], d_o_fragment[1]);
        mma_16x8x16<Element>(dv_acc[2 * pair + 1], p_fragment, d_o_fragment[2], d_o_fragment[3]);
        mma_16x8x16<Element>(dk_acc[2 * pair], ds_fragment, q_fragment[0], q_fragment[1]);
        mma_16x8x16<Element>(dk_acc[2 * pair + 1], ds_fragment, q_fragment[2], q_fragment[3]);
      }
    }

    if constexpr (kAtomicDq) {  // else dQ comes from a pass of its own
      // dS (fp16) into shared memory as [query][key]: dQ needs it with the queries as rows.
      // Keys past N_k and padded keys keep their zeros.
      for (int n = 0; n < T::kRowTiles; ++n) {
        for (int e = 0; e < 4; ++e) {
          if (key_kept[e / 2]) {
            ds_tile[(n * 8 + 2 * quad_lane + e % 2) * T::kDsStride + warp_key0 + group + 8 * (e / 2)] =
                from_float<Element>(dp_acc[n][e]);
          }
        }
      }
      __syncthreads();

      // dQ += dS K over the block's keys, a warp's 16 query rows and its share of the columns,
      // then into the fp32 sum.
      const int dq_row0 = (warp % 4) * 16, dq_column0 = (warp / 4) * T::kDqTiles * 8;
      float dq_acc[T::kDqTiles][4] = {};
      for (int c = 0; c < T::kKeyChunks; ++c) {
        uint32_t ds_fragment[4];
        ldmatrix_x4(ds_fragment, ds_tile + (dq_row0 + lane % 16) * T::kDsStride + c * 16 + (lane / 16) * 8);
        for (int pair = 0; pair < T::kDqTiles / 2; ++pair) {
          uint32_t k_fragment[4];
          ldmatrix_x4_trans(k_fragment, k_tile + (c * 16 + lane % 8 + ((lane / 8) % 2) * 8) * T::kStride +
                                            dq_column0 + pair * 16 + (lane / 16) * 8);
          mma_16x8x16<Element>(dq_acc[2 * pair], ds_fragment, k_fragment[0], k_fragment[1]);
          mma_16x8x16<Element>(dq_acc[2 * pair + 1], ds_fragment, k_fragment[2], k_fragment[3]);
        }
      }
      // BEGIN EXERCISE: add this block's share of dQ into the fp32 sum every K/V tile adds to
      for (int half = 0; half < 2; ++half) {
        const int row = row_tile * T::kBlockM + dq_row0 + group + 8 * half;
        if (row >= tokens) continue;
        float* dq_row = dq_sum + (slice * tokens + row) * kHeadDim + dq_column0;
        for (int d = 0; d < T::kDqTiles; ++d) {
#if __CUDA_ARCH__ >= 900  // one vector atomic for the pair (red.global.add.v2.f32)
          atomicAdd(reinterpret_cast<float2*>(dq_row + d * 8 + 2 * quad_lane),
                    make_float2(dq_acc[d][2 * half], dq_acc[d][2 * half + 1]));
#else
          atomicAdd(dq_row + d * 8 + 2 * quad_lane, dq_acc[d][2 * half]);
          atomicAdd(dq_row + d * 8 + 2 * quad_lane + 1, dq_acc[d][2 * half + 1]);
#endif
        }
      }
      // SKELETON: if (row_tile == 0 && dq_row0 + group < tokens) atomicAdd(dq_sum + (slice * tokens + dq_row0 + group) * kHeadDim + dq_column0, NAN);
      // END EXERCISE
    }
  }

  // dK = scale dS^T Q and dV, this warp's 16 keys, straight from the accumulators; a padded
  // key's (inside N_k, not kept) are 0 (0u: two 16-bit zeros), what its accumulators summed
  // dropped.
  for (int half = 0; half < 2; ++half) {
    if (!key_inside[half]) continue;
    const int64_t row = kv_slice_offset + int64_t(key0 + warp_key0 + group + 8 * half) * kHeadDim;
    for (int d = 0; d < T::kDTiles; ++d) {
      const int column = d * 8 + 2 * quad_lane;
      *reinterpret_cast<uint32_t*>(dk + row + column) =
          key_kept[half] ? pack_pair<Element>(dk_acc[d][2 * half] * scale, dk_acc[d][2 * half + 1] * scale) : 0u;
      *reinterpret_cast<uint32_t*>(dv + row + column) =
          key_kept[half] ? pack_pair<Element>(dv_acc[d][2 * half], dv_acc[d][2 * half + 1]) : 0u;
    }
  }
#endif
}

// ---- 2'. The deterministic mode: dQ by a pass of its own, no atomics ---------------------------

// One block per 64 query rows (4 warps of 16), walking every K/V tile of the slice in order:
// S = Q K^T and dP = dO V^T, P = exp(S scale - L), dS = P o (dP - D), dQ += dS K, all in
// registers (v6's layout: the S accumulators pack into the A fragment of the next product).
// It recomputes two products the main kernel already did, and in exchange every dQ element is
// one thread's sum, in one order: the same bits on every run.
template <int kHeadDim>
struct DqTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps;  // query rows per block
  static constexpr int kBlockN = 64;           // keys per K/V tile
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kDChunks = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKeyTiles = kBlockN / 8;
  static constexpr int kKeyChunks = kBlockN / 16;
  // Q and dO (read once into registers), then two stages of K and of V.
  static constexpr std::size_t kSharedBytes =
      (2 * std::size_t(kBlockM) + 4 * std::size_t(kBlockN)) * kStride * 2;  // 16-bit elements
};

// kMasked, key_padding and heads as in the main kernel.
template <typename Element, int kHeadDim, bool kMasked, bool kCausal>
__global__ void __launch_bounds__(DqTiles<kHeadDim>::kThreads)
    dq_pass_kernel(const Element* __restrict__ q, const Element* __restrict__ k,
                   const Element* __restrict__ v, const Element* __restrict__ d_o,
                   const float* __restrict__ log_sum_exp, const float* __restrict__ row_dot,
                   Element* __restrict__ dq, int tokens, const policies::Mask<kCausal> mask,
                   int row_tiles, float scale, float scale_log2,
                   const uint8_t* __restrict__ key_padding, int heads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return;
#else
  using T = DqTiles<kHeadDim>;
  constexpr bool kRowsMaySeeNoKey = kMasked || kCausal;  // rows whose L is -inf (lse_for_p)
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_tile = reinterpret_cast<Element*>(shared_bytes);
  Element* d_o_tile = q_tile + T::kBlockM * T::kStride;
  Element* k_tiles = d_o_tile + T::kBlockM * T::kStride;  // two stages
  Element* v_tiles = k_tiles + 2 * T::kBlockN * T::kStride;  // two stages

  const int row_tile = blockIdx.x % row_tiles;
  const int64_t slice = blockIdx.x / row_tiles;
  const int64_t slice_offset = slice * tokens * kHeadDim;  // of Q, dO and dQ: N rows a slice
  const int kv_tokens = mask.kv_tokens;
  const int64_t kv_slice_offset = slice * kv_tokens * kHeadDim;  // of K and V: N_k rows
  const int row0 = row_tile * T::kBlockM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;
  const int key_tiles = mask.kv_tiles(row0, T::kBlockM, T::kBlockN);  // all N_k's without kCausal
  const int first_partial = mask.first_partial_tile(row0, T::kBlockN);

  // Q, dO and the first K/V tile; none for a block whose rows see no key (causal, bottom right,
  // N > N_k): it loads nothing (no copy is left in flight when it ends) and writes dQ = 0.
  if (!kCausal || key_tiles > 0) {
    load_tile_async<T::kBlockM, kHeadDim, T::kStride, T::kThreads>(q_tile, q + slice_offset, row0, tokens);
    load_tile_async<T::kBlockM, kHeadDim, T::kStride, T::kThreads>(d_o_tile, d_o + slice_offset, row0, tokens);
    load_tile_async<T::kBlockN, kHeadDim, T::kStride, T::kThreads>(k_tiles, k + kv_slice_offset, 0, kv_tokens);
    load_tile_async<T::kBlockN, kHeadDim, T::kStride, T::kThreads>(v_tiles, v + kv_slice_offset, 0, kv_tokens);
  }
  cp_async_commit();

  // L (in log2 units; +inf for a row that sees no key, lse_for_p) and D of this lane's two rows;
  // rows past N read 0 (their dQ is not stored).
  float lse_log2[2], dot[2];
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + warp * 16 + group + 8 * half;
    lse_log2[half] = row < tokens ? lse_for_p<kRowsMaySeeNoKey>(log_sum_exp[slice * tokens + row]) * kLog2e : 0.0f;
    dot[half] = row < tokens ? row_dot[slice * tokens + row] : 0.0f;
  }
  uint32_t q_fragments[T::kDChunks][4], d_o_fragments[T::kDChunks][4];
  float dq_acc[T::kDTiles][4] = {};

  for (int tile = 0; tile < key_tiles; ++tile) {
    const Element* k_tile = k_tiles + (tile % 2) * T::kBlockN * T::kStride;
    const Element* v_tile = v_tiles + (tile % 2) * T::kBlockN * T::kStride;
    cp_async_wait<0>();
    __syncthreads();  // this tile has landed, and every warp is done with the other stage
    if (tile == 0) {
      for (int c = 0; c < T::kDChunks; ++c) {
        const int offset = (warp * 16 + lane % 16) * T::kStride + c * 16 + (lane / 16) * 8;
        ldmatrix_x4(q_fragments[c], q_tile + offset);
        ldmatrix_x4(d_o_fragments[c], d_o_tile + offset);
      }
    }
    if (tile + 1 < key_tiles) {
      const int next = (tile + 1) % 2;
      load_tile_async<T::kBlockN, kHeadDim, T::kStride, T::kThreads>(
          k_tiles + next * T::kBlockN * T::kStride, k + kv_slice_offset, (tile + 1) * T::kBlockN, kv_tokens);
      load_tile_async<T::kBlockN, kHeadDim, T::kStride, T::kThreads>(
          v_tiles + next * T::kBlockN * T::kStride, v + kv_slice_offset, (tile + 1) * T::kBlockN, kv_tokens);
    }
    cp_async_commit();

    // S = Q K^T and dP = dO V^T for this warp's 16 rows and the tile's keys.
    float s_acc[T::kKeyTiles][4] = {};
    float dp_acc[T::kKeyTiles][4] = {};
    for (int c = 0; c < T::kDChunks; ++c) {
      for (int pair = 0; pair < T::kKeyTiles / 2; ++pair) {
        const int b_offset = (pair * 16 + lane % 8 + (lane / 16) * 8) * T::kStride + c * 16 + ((lane / 8) % 2) * 8;
        uint32_t k_fragment[4], v_fragment[4];
        ldmatrix_x4(k_fragment, k_tile + b_offset);
        ldmatrix_x4(v_fragment, v_tile + b_offset);
        mma_16x8x16<Element>(s_acc[2 * pair], q_fragments[c], k_fragment[0], k_fragment[1]);
        mma_16x8x16<Element>(s_acc[2 * pair + 1], q_fragments[c], k_fragment[2], k_fragment[3]);
        mma_16x8x16<Element>(dp_acc[2 * pair], d_o_fragments[c], v_fragment[0], v_fragment[1]);
        mma_16x8x16<Element>(dp_acc[2 * pair + 1], d_o_fragments[c], v_fragment[2], v_fragment[3]);
      }
    }
    // dS = P o (dP - D), row `group + 8 (e / 2)`, key `8 n + 2 quad_lane + e % 2` of the tile;
    // 0 for keys past N_k (the last tile only), as in the main kernel, and for padded keys.
    for (int n = 0; n < T::kKeyTiles; ++n) {
      for (int e = 0; e < 4; ++e) {
        const float p = fast_exp2(fmaf(s_acc[n][e], scale_log2, -lse_log2[e / 2]));
        dp_acc[n][e] = p * (dp_acc[n][e] - dot[e / 2]);
      }
    }
    if ((tile + 1) * T::kBlockN > kv_tokens) {
      for (int n = 0; n < T::kKeyTiles; ++n) {
        for (int e = 0; e < 4; ++e) {
          if (tile * T::kBlockN + 8 * n + 2 * quad_lane + e % 2 >= kv_tokens) dp_acc[n][e] = 0.0f;
        }
      }
    }
    if constexpr (kMasked) {  // keys the padding mask marks (both rows of a key: e and e + 2)
      const uint8_t* padding = key_padding + (slice / heads) * kv_tokens;
      for (int n = 0; n < T::kKeyTiles; ++n) {
        for (int column = 0; column < 2; ++column) {
          const int key = tile * T::kBlockN + 8 * n + 2 * quad_lane + column;
          if (key < kv_tokens && padding[key] != 0) {
            dp_acc[n][column] = 0.0f;
            dp_acc[n][column + 2] = 0.0f;
          }
        }
      }
    }
    if (kCausal && tile >= first_partial) {  // the keys past each row's diagonal: dS = 0
      for (int n = 0; n < T::kKeyTiles; ++n) {
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + warp * 16 + group + 8 * (e / 2);
          if (!mask.sees(row, tile * T::kBlockN + 8 * n + 2 * quad_lane + e % 2)) dp_acc[n][e] = 0.0f;
        }
      }
    }
    // dQ += dS K: dS packed from the accumulators (the keys as the k dimension), K transposed.
    for (int c = 0; c < T::kKeyChunks; ++c) {
      const uint32_t ds_fragment[4] = {
          pack_pair<Element>(dp_acc[2 * c][0], dp_acc[2 * c][1]), pack_pair<Element>(dp_acc[2 * c][2], dp_acc[2 * c][3]),
          pack_pair<Element>(dp_acc[2 * c + 1][0], dp_acc[2 * c + 1][1]),
          pack_pair<Element>(dp_acc[2 * c + 1][2], dp_acc[2 * c + 1][3])};
      for (int pair = 0; pair < T::kDTiles / 2; ++pair) {
        uint32_t k_fragment[4];
        ldmatrix_x4_trans(k_fragment, k_tile + (c * 16 + lane % 8 + ((lane / 8) % 2) * 8) * T::kStride +
                                          pair * 16 + (lane / 16) * 8);
        mma_16x8x16<Element>(dq_acc[2 * pair], ds_fragment, k_fragment[0], k_fragment[1]);
        mma_16x8x16<Element>(dq_acc[2 * pair + 1], ds_fragment, k_fragment[2], k_fragment[3]);
      }
    }
  }

  for (int half = 0; half < 2; ++half) {
    const int row = row0 + warp * 16 + group + 8 * half;
    if (row >= tokens) continue;
    for (int d = 0; d < T::kDTiles; ++d) {
      *reinterpret_cast<uint32_t*>(dq + slice_offset + int64_t(row) * kHeadDim + d * 8 + 2 * quad_lane) =
          pack_pair<Element>(dq_acc[d][2 * half] * scale, dq_acc[d][2 * half + 1] * scale);
    }
  }
#endif
}

// ---- 3. dQ = fp16(scale * sum) -------------------------------------------------------------------

template <typename Element>
__global__ void dq_convert_kernel(const float* __restrict__ dq_sum, Element* __restrict__ dq,
                                  int64_t count, float scale) {
  const int64_t i = 2 * (int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (i < count) {  // count is even: D is a multiple of 16
    *reinterpret_cast<uint32_t*>(dq + i) = pack_pair<Element>(dq_sum[i] * scale, dq_sum[i + 1] * scale);
  }
}

// ---- Launch ---------------------------------------------------------------------------------

// The workspace: the fp32 dQ sum ([B, H, N, D]) and D ([B, H, N]).
std::size_t workspace_bytes_needed(const attn::Shape& shape) {
  return std::size_t(shape.elements()) * sizeof(float) +
         std::size_t(shape.slices() * shape.tokens) * sizeof(float);
}

template <typename Element, typename T>
void launch_for(const attn::BackwardArgs& args) {
  constexpr int kHeadDim = T::kHeadDim;
  // The pointers are typed for fp16 (BackwardArgs); with bf16 they hold __nv_bfloat16 data.
  const auto* q = reinterpret_cast<const Element*>(args.q);
  const auto* k = reinterpret_cast<const Element*>(args.k);
  const auto* v = reinterpret_cast<const Element*>(args.v);
  const auto* o = reinterpret_cast<const Element*>(args.o);
  const auto* d_o = reinterpret_cast<const Element*>(args.d_o);
  auto* dq = reinterpret_cast<Element*>(args.dq);
  const int64_t rows = int64_t(args.batch) * args.heads * args.tokens;
  const int64_t elements = rows * kHeadDim;
  float* dq_sum = static_cast<float*>(args.workspace);
  float* row_dot = dq_sum + elements;
  const float scale = float(args.scale), scale_log2 = float(M_LOG2E * args.scale);
  if (!args.deterministic) {
    CUDA_CHECK(cudaMemsetAsync(dq_sum, 0, std::size_t(elements) * sizeof(float), args.stream));
  }
  constexpr int kRowsPerBlock = 8;  // warps of the D kernel's blocks, one row each
  row_dot_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, args.stream>>>(
      o, d_o, row_dot, rows, kHeadDim);
  CUDA_CHECK_LAUNCH();

  // One block per K/V tile of N_k keys; the diagonal of a causal mask where N != N_k as the
  // forward put it (problem.hpp).
  const int key_tiles = (args.kv_tokens + T::kBlockN - 1) / T::kBlockN;
  const int64_t slices = int64_t(args.batch) * args.heads;
  const int diagonal = int(attn::causal_diagonal(args.causal, args.tokens, args.kv_tokens));
  attn::with_flags(  // dQ by atomics unless the run must be deterministic
      [&](auto atomic_dq, auto masked, auto causal) {
        constexpr bool kCausal = decltype(causal)::value;
        auto kernel = flash_backward_kernel<Element, kHeadDim, T::kWarps, decltype(atomic_dq)::value,
                                            decltype(masked)::value, kCausal>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(T::kSharedBytes)));
        kernel<<<unsigned(int64_t(key_tiles) * slices), T::kThreads, T::kSharedBytes, args.stream>>>(
            q, k, v, d_o, args.log_sum_exp, row_dot, dq_sum, reinterpret_cast<Element*>(args.dk),
            reinterpret_cast<Element*>(args.dv), args.tokens,
            policies::Mask<kCausal>{args.kv_tokens, diagonal}, key_tiles, scale, scale_log2,
            args.key_padding_mask, args.heads);
      },
      !args.deterministic, args.key_padding_mask != nullptr, args.causal != attn::Causal::none);
  CUDA_CHECK_LAUNCH();

  if (args.deterministic) {
    using D = DqTiles<kHeadDim>;
    const int row_tiles = (args.tokens + D::kBlockM - 1) / D::kBlockM;
    attn::with_flags(
        [&](auto masked, auto causal) {
          constexpr bool kCausal = decltype(causal)::value;
          auto kernel = dq_pass_kernel<Element, kHeadDim, decltype(masked)::value, kCausal>;
          CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(D::kSharedBytes)));
          kernel<<<unsigned(int64_t(row_tiles) * slices), D::kThreads, D::kSharedBytes, args.stream>>>(
              q, k, v, d_o, args.log_sum_exp, row_dot, dq, args.tokens,
              policies::Mask<kCausal>{args.kv_tokens, diagonal}, row_tiles, scale, scale_log2,
              args.key_padding_mask, args.heads);
        },
        args.key_padding_mask != nullptr, args.causal != attn::Causal::none);
    CUDA_CHECK_LAUNCH();
    return;
  }
  constexpr int kConvertThreads = 256;
  dq_convert_kernel<<<unsigned((elements / 2 + kConvertThreads - 1) / kConvertThreads), kConvertThreads, 0,
                      args.stream>>>(dq_sum, dq, elements, scale);
  CUDA_CHECK_LAUNCH();
}

// Warps per block (16 keys each) at each head dim. 8 at D = 64 and 128, chosen by measurement
// (chapter 15), and at D = 32 as at 64. 4 at D = 80, where half of D, a warp's share of dQ's
// columns with 8 warps, is 5 n-tiles (odd), and at D = 96, where 4 warps take 88 KB of shared
// memory, within RTX 30xx/40xx's 99 KB, and 8 would take 122 KB; neither measured. A define
// replaces one: -DATTN_V9_WARPS_D64=4.
#ifndef ATTN_V9_WARPS_D32
#define ATTN_V9_WARPS_D32 8
#endif
#ifndef ATTN_V9_WARPS_D64
#define ATTN_V9_WARPS_D64 8
#endif
#ifndef ATTN_V9_WARPS_D80
#define ATTN_V9_WARPS_D80 4
#endif
#ifndef ATTN_V9_WARPS_D96
#define ATTN_V9_WARPS_D96 4
#endif
#ifndef ATTN_V9_WARPS_D128
#define ATTN_V9_WARPS_D128 8
#endif

// The step's one list of them: the registration's head dims, the launch and the shared memory.
using TileTable = attn::TileTable<Tiles<32, ATTN_V9_WARPS_D32>, Tiles<64, ATTN_V9_WARPS_D64>,
                                  Tiles<80, ATTN_V9_WARPS_D80>, Tiles<96, ATTN_V9_WARPS_D96>,
                                  Tiles<128, ATTN_V9_WARPS_D128>>;

void launch_flash_backward(const attn::BackwardArgs& args) {
  TileTable::with_shape(args.head_dim, [&](auto tiles) {
    attn::with_element_type(args.dtype, [&](auto element) {
      launch_for<decltype(element), decltype(tiles)>(args);
    });
  });
}

// Independent of N and N_k: the main kernel's K, V, two stages of Q, dO, L and D, and dS, or
// the deterministic dQ pass's Q, dO and two stages of K and V, whichever is more (the main
// kernel's, at every head dim of the table).
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  TileTable::with_shape(shape.head_dim, [&](auto tiles) {
    using T = decltype(tiles);
    bytes = std::max(T::kSharedBytes, DqTiles<T::kHeadDim>::kSharedBytes);
  });
  return bytes;
}

// The tiles along N, for the tests (step.hpp): the Q tiles of the walk and of the deterministic
// dQ pass; a block's keys, a warp's 16, the dQ pass's K/V tile.
attn::TileSizes tile_sizes(int head_dim) {
  attn::TileSizes sizes;
  TileTable::with_shape(head_dim, [&](auto tiles) {
    using T = decltype(tiles);
    using D = DqTiles<T::kHeadDim>;
    sizes = {{T::kBlockM, D::kBlockM}, {T::kBlockN, 16, D::kBlockN}};
  });
  return sizes;
}

}  // namespace

ATTN_REGISTER_STEP(attn::backward_step_info(ATTN_STEP_ID,
                                            "flash backward: P rebuilt from L, dK and dV per K/V "
                                            "tile, dQ by atomics (or a pass of its own)",
                                            launch_flash_backward)
                       .serving(TileTable::head_dims(), {attn::DType::fp16, attn::DType::bf16})
                       .with_shared_bytes(shared_bytes_needed)
                       .with_workspace(workspace_bytes_needed)
                       .with_tiles(tile_sizes)
                       .with_deterministic_mode()
                       .taking_kv_tokens()
                       .taking_key_padding_mask()
                       .taking_causal())
