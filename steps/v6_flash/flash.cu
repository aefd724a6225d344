// Step v6: flash attention. No score matrix anywhere: a block keeps its Q tile in registers,
// streams K and V through shared memory one tile at a time, and folds each tile into the
// output with an online softmax (a running row maximum and row sum, rescaling what was
// accumulated so far when the maximum grows). Device memory sees Q, K, V read and O written,
// once per block of query rows, for any N.
//
// What is new against v5:
//   - online softmax instead of a full row of scores: the N limit is gone;
//   - mma.sync.m16n8k16 with ldmatrix instead of WMMA, because its register layout is
//     documented: the S accumulators of QK^T are exactly the A operand of PV, so P never
//     leaves registers (no shared-memory round trip for P);
//   - cp.async double buffering: tile j+1 of K (and V) is in flight while tile j is used;
//   - exp2 with log2(e)/sqrt(D) folded into one constant, so each exponent is one FFMA;
//   - the tail (keys >= N) is masked only in the last K/V tile;
//   - when asked, each row's log-sum-exp L leaves beside O: the backward pass rebuilds P from it.
// Serves head dims 32, 64, 80, 96, 128 (multiples of 16, so the fragments tile D exactly), in fp16
// or bf16 (the kernel is a template on the element type; only the MMA and the packing differ),
// and N_k keys for N queries (cross-attention: the K/V walk counts N_k, the Q tile N). Under a
// causal mask the mask policy (policies/mask.cuh) says how many K/V tiles a block walks, and
// the tiles the diagonal crosses mask their keys element by element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
#pragma nv_diag_suppress 177  // sm_75: the kernel is a stub (below), its helpers go unused
#endif

namespace {

// ---- PTX wrappers (beside this file, shared with step 9) ------------------------------------

using warp_mma::cp_async_16;
using warp_mma::cp_async_commit;
using warp_mma::cp_async_wait;
using warp_mma::ldmatrix_x4;
using warp_mma::ldmatrix_x4_trans;
using warp_mma::mma_16x8x16;

// P in fp16 (or bf16) pairs, and 2^x in one instruction: beside this file, shared with steps 7 and 8.
using fragment_math::fast_exp2;
using fragment_math::log_sum_exp;
using fragment_math::pack_pair;

// ---- Tile geometry --------------------------------------------------------------------------

// kRowGroups: 16-row groups per warp. With two, each K or V fragment read from shared memory
// feeds two MMAs instead of one: half the shared-memory traffic per FLOP, more registers.
template <int kHeadDim_, int kWarps, int kRowGroups, int kBlockN>
struct Tiles {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16 * kRowGroups;
  static constexpr int kBlockM = kWarpRows * kWarps;  // query rows per block
  static constexpr int kKeysPerTile = kBlockN;        // keys per K/V tile
  static constexpr int kStride = kHeadDim + 8;  // shared row, padded 16 B: ldmatrix conflict-free
  static constexpr int kDChunks = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kDTiles = kHeadDim / 8;    // n-tiles (8 columns) of O
  static constexpr int kKeyTiles = kBlockN / 8;   // n-tiles of S
  static constexpr int kKeyChunks = kBlockN / 16; // k-steps of P V
  static constexpr int kSharedHalves = (kBlockM + 4 * kBlockN) * kStride;  // Q, 2 K, 2 V
  static constexpr std::size_t kSharedBytes = kSharedHalves * 2;  // 16-bit elements
  static_assert(kHeadDim % 16 == 0, "fragments tile D by 16");
};

// Rows [row0, row0 + kRows) of a [N, D] slice into a padded shared tile; rows >= N become 0.
template <int kRows, int kHeadDim, int kStride, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_async(Element* tile, const Element* slice, int row0,
                                                int tokens) {
  constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks
  for (int chunk = threadIdx.x; chunk < kRows * kChunksPerRow; chunk += kThreads) {
    const int r = chunk / kChunksPerRow, column = (chunk % kChunksPerRow) * 8;
    const int row = row0 + r;
    const bool inside = row < tokens;
    const Element* source = slice + int64_t(inside ? row : 0) * kHeadDim + column;
    cp_async_16(tile + r * kStride + column, source, inside ? 16 : 0);
  }
}

// ---- The kernel -----------------------------------------------------------------------------

// The score of a key the mask marks as padding (kMasked), -2^100: lower than any real score can
// be, and finite, so a row whose keys so far are all padding still has a maximum
// (policies/mask.cuh says why that is enough).
using policies::kPaddedScore;

// One block: kBlockM query rows of one (b, h) slice; warp w owns kWarpRows of them, as
// kRowGroups groups of 16. Fragment layout of mma.m16n8k16 (PTX ISA): lane = 4*group +
// quad_lane; an accumulator holds rows `group` and `group + 8`, columns 2*quad_lane and
// 2*quad_lane + 1 of its 16x8 tile, so each row's values are spread over a quad of 4 lanes.
// A lane therefore tracks 2 * kRowGroups rows; index r = 2 * row_group + half. kWritesLse: the
// epilogue also writes each row's L to row_lse (a separate kernel, so the inference one is
// unchanged; see launch_flash_for). kMasked: key_padding ([B, N_k] bytes, 1: padding) marks keys
// that get no weight (a separate kernel too), and so does kCausal for the keys past a row's
// diagonal, with the same kPaddedScore.
template <typename Element, int kHeadDim, int kWarps, int kRowGroups, int kBlockN, bool kWritesLse,
          bool kMasked, bool kCausal>
__global__ void __launch_bounds__(32 * kWarps)
    flash_attention_kernel(const Element* __restrict__ q, const Element* __restrict__ k,
                           const Element* __restrict__ v, Element* __restrict__ o,
                           float* __restrict__ row_lse, const uint8_t* __restrict__ key_padding,
                           int heads, int tokens, const policies::Mask<kCausal> mask,
                           int row_tiles, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // cp.async and mma.m16n8k16 need sm_80. A build for an older GPU (sm_75) gets this empty
  // kernel, which never runs: the registration below says 8.0, and the harness refuses below it.
  return;
#else
  using T = Tiles<kHeadDim, kWarps, kRowGroups, kBlockN>;
  constexpr int kRows = 2 * kRowGroups;  // rows tracked per lane
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_tile = reinterpret_cast<Element*>(shared_bytes);
  Element* k_tiles = q_tile + T::kBlockM * T::kStride;  // two stages
  Element* v_tiles = k_tiles + 2 * kBlockN * T::kStride;  // two stages

  // Consecutive blocks share a slice's K and V. Under the causal mask the bottom row tiles,
  // which walk the most K/V tiles, start first, and the short ones fill in behind them.
  const int row_tile = kCausal ? row_tiles - 1 - blockIdx.x % row_tiles : blockIdx.x % row_tiles;
  const int64_t slice = blockIdx.x / row_tiles;
  const int64_t slice_offset = slice * tokens * kHeadDim;        // of Q and O: N rows a slice
  const int kv_tokens = mask.kv_tokens;
  const int64_t kv_slice_offset = slice * kv_tokens * kHeadDim;  // of K and V: N_k rows
  const int row0 = row_tile * T::kBlockM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad_lane = lane % 4;
  const int warp_row0 = row0 + warp * T::kWarpRows;
  const int kv_tiles = mask.kv_tiles(row0, T::kBlockM, kBlockN);  // all N_k's without kCausal
  const int first_partial = mask.first_partial_tile(row0, kBlockN);

  // Q and the first K tile in one group, the first V tile in the next. A block above the causal
  // diagonal loads nothing (its Q would land in the buffer its O is staged in) and writes O = 0.
  if (!kCausal || kv_tiles > 0) {
    load_tile_async<T::kBlockM, kHeadDim, T::kStride, T::kThreads>(q_tile, q + slice_offset, row0, tokens);
    load_tile_async<kBlockN, kHeadDim, T::kStride, T::kThreads>(k_tiles, k + kv_slice_offset, 0, kv_tokens);
  }
  cp_async_commit();
  if (!kCausal || kv_tiles > 0) {
    load_tile_async<kBlockN, kHeadDim, T::kStride, T::kThreads>(v_tiles, v + kv_slice_offset, 0, kv_tokens);
  }
  cp_async_commit();

  uint32_t q_fragments[kRowGroups][T::kDChunks][4];
  float o_acc[kRowGroups][T::kDTiles][4] = {};
  float row_max[kRows];  // raw score units
  float row_sum[kRows];  // this lane's share; the quad's sum at the end
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = kCausal ? kPaddedScore : -INFINITY;  // a row that sees no key keeps kPaddedScore
    row_sum[r] = 0.0f;
  }

  for (int tile = 0; tile < kv_tiles; ++tile) {
    const Element* k_tile = k_tiles + (tile % 2) * kBlockN * T::kStride;
    const Element* v_tile = v_tiles + (tile % 2) * kBlockN * T::kStride;
    const int tile_keys = min(kBlockN, kv_tokens - tile * kBlockN);  // < kBlockN only at the end

    cp_async_wait<1>();  // K of this tile has landed (V may still be in flight)
    __syncthreads();
    if (tile == 0) {
      for (int g = 0; g < kRowGroups; ++g) {
        for (int c = 0; c < T::kDChunks; ++c) {
          ldmatrix_x4(q_fragments[g][c], q_tile + (warp * T::kWarpRows + g * 16 + lane % 16) * T::kStride +
                                             c * 16 + (lane / 16) * 8);
        }
      }
    }

    // S = Q K^T for this warp's rows and the tile's keys, in registers. Every tile runs the
    // full, branch-free loop, the last one too (see the chapter: skipping the empty part of
    // the last tile measured slower, because the branches break the MMA pipelining).
    float s_acc[kRowGroups][T::kKeyTiles][4] = {};
    for (int c = 0; c < T::kDChunks; ++c) {
      for (int pair = 0; pair < T::kKeyTiles / 2; ++pair) {
        uint32_t k_fragments[4];
        ldmatrix_x4(k_fragments, k_tile + (pair * 16 + lane % 8 + (lane / 16) * 8) * T::kStride +
                                     c * 16 + ((lane / 8) % 2) * 8);
        for (int g = 0; g < kRowGroups; ++g) {
          mma_16x8x16<Element>(s_acc[g][2 * pair], q_fragments[g][c], k_fragments[0], k_fragments[1]);
          mma_16x8x16<Element>(s_acc[g][2 * pair + 1], q_fragments[g][c], k_fragments[2], k_fragments[3]);
        }
      }
    }

    // Prefetch the next K tile into the other stage (its last reader finished before the
    // barrier above). An empty group is committed on the last tile to keep the count.
    if (tile + 1 < kv_tiles) {
      load_tile_async<kBlockN, kHeadDim, T::kStride, T::kThreads>(
          k_tiles + ((tile + 1) % 2) * kBlockN * T::kStride, k + kv_slice_offset, (tile + 1) * kBlockN, kv_tokens);
    }
    cp_async_commit();

    // Keys past N exist only in the last tile: give them a score of -inf, so p = 0.
    if (tile_keys < kBlockN) {
      for (int g = 0; g < kRowGroups; ++g) {
        for (int n = 0; n < T::kKeyTiles; ++n) {
          for (int e = 0; e < 4; ++e) {
            if (n * 8 + 2 * quad_lane + e % 2 >= tile_keys) s_acc[g][n][e] = -INFINITY;
          }
        }
      }
    }

    // Keys past a row's causal diagonal (kCausal), in the tiles it crosses: kPaddedScore.
    if (kCausal && tile >= first_partial) {
      for (int g = 0; g < kRowGroups; ++g) {
        for (int n = 0; n < T::kKeyTiles; ++n) {
          for (int e = 0; e < 4; ++e) {
            const int row = warp_row0 + g * 16 + group + 8 * (e / 2);
            const int key = tile * kBlockN + n * 8 + 2 * quad_lane + e % 2;
            if (key < kv_tokens && !mask.sees(row, key)) s_acc[g][n][e] = kPaddedScore;
          }
        }
      }
    }

    // Keys the mask marks as padding (kMasked): kPaddedScore.
    if constexpr (kMasked) {
      const uint8_t* padding = key_padding + (slice / heads) * kv_tokens + tile * kBlockN;
      for (int n = 0; n < T::kKeyTiles; ++n) {
        for (int column = 0; column < 2; ++column) {
          const int key = n * 8 + 2 * quad_lane + column;
          if (key < tile_keys && padding[key] != 0) {
            for (int g = 0; g < kRowGroups; ++g) {
              s_acc[g][n][column] = kPaddedScore;
              s_acc[g][n][column + 2] = kPaddedScore;
            }
          }
        }
      }
    }

    // BEGIN EXERCISE: the online softmax update for this tile
    for (int r = 0; r < kRows; ++r) {  // row group r / 2; half r % 2: row `group` or `group + 8`
      const int g = r / 2, half = r % 2;
      float tile_max = row_max[r];
      for (int n = 0; n < T::kKeyTiles; ++n) {
        tile_max = fmaxf(tile_max, fmaxf(s_acc[g][n][2 * half], s_acc[g][n][2 * half + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));  // across the quad
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // exp(x - m) = 2^(x * log2(e) - m * log2(e)); the 1/sqrt(D) scale rides along.
      const float max_scaled = tile_max * scale_log2;
      const float correction = fast_exp2(row_max[r] * scale_log2 - max_scaled);  // 0 at first
      row_max[r] = tile_max;
      row_sum[r] *= correction;
      for (int d = 0; d < T::kDTiles; ++d) {
        o_acc[g][d][2 * half] *= correction;
        o_acc[g][d][2 * half + 1] *= correction;
      }
      for (int n = 0; n < T::kKeyTiles; ++n) {
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s_acc[g][n][e] = fast_exp2(fmaf(s_acc[g][n][e], scale_log2, -max_scaled));
          row_sum[r] += s_acc[g][n][e];
        }
      }
    }
    // SKELETON: for (int r = 0; r < kRows; ++r) row_sum[r] = NAN;
    // END EXERCISE

    cp_async_wait<1>();  // V of this tile has landed (the next K may still be in flight)
    __syncthreads();

    // O += P V. The S accumulators of two neighbouring 8-key tiles are, packed to fp16 (or
    // bf16), exactly the A fragment of a 16-key step: P goes from registers to the tensor cores.
    for (int c = 0; c < T::kKeyChunks; ++c) {
      uint32_t p_fragments[kRowGroups][4];
      for (int g = 0; g < kRowGroups; ++g) {
        p_fragments[g][0] = pack_pair<Element>(s_acc[g][2 * c][0], s_acc[g][2 * c][1]);
        p_fragments[g][1] = pack_pair<Element>(s_acc[g][2 * c][2], s_acc[g][2 * c][3]);
        p_fragments[g][2] = pack_pair<Element>(s_acc[g][2 * c + 1][0], s_acc[g][2 * c + 1][1]);
        p_fragments[g][3] = pack_pair<Element>(s_acc[g][2 * c + 1][2], s_acc[g][2 * c + 1][3]);
      }
      for (int pair = 0; pair < T::kDTiles / 2; ++pair) {
        uint32_t v_fragments[4];
        ldmatrix_x4_trans(v_fragments, v_tile + (c * 16 + lane % 8 + ((lane / 8) % 2) * 8) * T::kStride +
                                           pair * 16 + (lane / 16) * 8);
        for (int g = 0; g < kRowGroups; ++g) {
          mma_16x8x16<Element>(o_acc[g][2 * pair], p_fragments[g], v_fragments[0], v_fragments[1]);
          mma_16x8x16<Element>(o_acc[g][2 * pair + 1], p_fragments[g], v_fragments[2], v_fragments[3]);
        }
      }
    }

    if (tile + 1 < kv_tiles) {
      load_tile_async<kBlockN, kHeadDim, T::kStride, T::kThreads>(
          v_tiles + ((tile + 1) % 2) * kBlockN * T::kStride, v + kv_slice_offset, (tile + 1) * kBlockN, kv_tokens);
    }
    cp_async_commit();
  }

  // Normalise, stage this warp's rows in its own rows of the Q tile (only this warp read
  // them), then store 16-byte chunks: consecutive lanes write consecutive addresses. L, when
  // asked for, is one float per row: the quad's first lane writes it.
  Element* o_stage = q_tile + warp * T::kWarpRows * T::kStride;
  for (int r = 0; r < kRows; ++r) {
    const int g = r / 2, half = r % 2;
    float total = row_sum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    // A row whose keys were all padding or past its diagonal: O = 0, L = -inf (the reference's
    // definition).
    const bool no_key = (kMasked || kCausal) && row_max[r] == kPaddedScore;
    const float inverse = no_key ? 0.0f : 1.0f / total;
    if constexpr (kWritesLse) {
      const int row = warp_row0 + g * 16 + group + 8 * half;
      if (quad_lane == 0 && row < tokens) {
        row_lse[slice * tokens + row] = no_key ? -INFINITY : log_sum_exp(row_max[r], total, scale_log2);
      }
    }
    for (int d = 0; d < T::kDTiles; ++d) {
      *reinterpret_cast<uint32_t*>(o_stage + (g * 16 + group + 8 * half) * T::kStride + d * 8 + 2 * quad_lane) =
          pack_pair<Element>(o_acc[g][d][2 * half] * inverse, o_acc[g][d][2 * half + 1] * inverse);
    }
  }
  __syncwarp();
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int chunk = lane; chunk < T::kWarpRows * kChunksPerRow; chunk += 32) {
    const int r = chunk / kChunksPerRow, column = (chunk % kChunksPerRow) * 8;
    const int row = warp_row0 + r;
    if (row < tokens) {
      *reinterpret_cast<uint4*>(o + slice_offset + int64_t(row) * kHeadDim + column) =
          *reinterpret_cast<const uint4*>(o_stage + r * T::kStride + column);
    }
  }
#endif
}

// ---- Launch ---------------------------------------------------------------------------------

template <typename Element, int kHeadDim, int kWarps, int kRowGroups, int kBlockN>
void launch_flash_for(Tiles<kHeadDim, kWarps, kRowGroups, kBlockN>, const attn::AttentionArgs& args) {
  using T = Tiles<kHeadDim, kWarps, kRowGroups, kBlockN>;
  // Separate kernels, not one with `if (row_lse != nullptr)`: that test, though never taken on
  // the inference path, changed the register allocation of the whole kernel and cost it up to
  // 11% at D = 128 on the H100 (chapter 12). The mask gets kernels of its own for the same reason.
  const int row_tiles = (args.tokens + T::kBlockM - 1) / T::kBlockM;
  const int64_t blocks = int64_t(row_tiles) * args.batch * args.heads;
  const float scale_log2 = float(M_LOG2E * args.scale);
  const int diagonal = int(attn::causal_diagonal(args.causal, args.tokens, args.kv_tokens));
  attn::with_flags(
      [&](auto lse, auto masked, auto causal) {
        constexpr bool kCausal = decltype(causal)::value;
        auto kernel = flash_attention_kernel<Element, kHeadDim, kWarps, kRowGroups, kBlockN,
                                             decltype(lse)::value, decltype(masked)::value, kCausal>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(T::kSharedBytes)));
        // The pointers are typed for fp16 (AttentionArgs); with bf16 they hold __nv_bfloat16 data.
        kernel<<<unsigned(blocks), T::kThreads, T::kSharedBytes, args.stream>>>(
            reinterpret_cast<const Element*>(args.q), reinterpret_cast<const Element*>(args.k),
            reinterpret_cast<const Element*>(args.v), reinterpret_cast<Element*>(args.o),
            args.log_sum_exp, args.key_padding_mask, args.heads, args.tokens,
            policies::Mask<kCausal>{args.kv_tokens, diagonal}, row_tiles, scale_log2);
      },
      args.log_sum_exp != nullptr, args.key_padding_mask != nullptr,
      args.causal != attn::Causal::none);
  CUDA_CHECK_LAUNCH();
}

// The tile shape of each head dim: warps, 16-row groups per warp, keys per K/V tile. 4 warps of
// 32 rows (128-row tiles) measured fastest at D = 64 on the H100 (chapter 07). At D = 80 and 128
// two row groups spill past 255 registers, so 16 rows per warp there, and at D = 96 between
// them (which v9's backward needs as its forward). A define replaces one, as scripts/tune.sh v6
// does: -DATTN_V6_TILES_D64=8\,1\,64 (nvcc needs the commas escaped).
#ifndef ATTN_V6_TILES_D32
#define ATTN_V6_TILES_D32 4, 2, 64
#endif
#ifndef ATTN_V6_TILES_D64
#define ATTN_V6_TILES_D64 4, 2, 64
#endif
#ifndef ATTN_V6_TILES_D80
#define ATTN_V6_TILES_D80 4, 1, 64
#endif
#ifndef ATTN_V6_TILES_D96
#define ATTN_V6_TILES_D96 4, 1, 64
#endif
#ifndef ATTN_V6_TILES_D128
#define ATTN_V6_TILES_D128 4, 1, 64
#endif

// The step's one list of them: the registration's head dims, the launch and the shared memory.
using TileTable = attn::TileTable<Tiles<32, ATTN_V6_TILES_D32>, Tiles<64, ATTN_V6_TILES_D64>,
                                  Tiles<80, ATTN_V6_TILES_D80>, Tiles<96, ATTN_V6_TILES_D96>,
                                  Tiles<128, ATTN_V6_TILES_D128>>;

void launch_flash(const attn::AttentionArgs& args) {
  TileTable::with_shape(args.head_dim, [&](auto tiles) {
    attn::with_element_type(args.dtype, [&](auto element) {
      launch_flash_for<decltype(element)>(tiles, args);
    });
  });
}

// Independent of N: Q, two K and two V tiles.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  std::size_t bytes = 0;
  TileTable::with_shape(shape.head_dim, [&](auto tiles) { bytes = decltype(tiles)::kSharedBytes; });
  return bytes;
}

// The tiles along N, for the tests (step.hpp): a block's query rows and a warp's, a K/V tile.
attn::TileSizes tile_sizes(int head_dim) {
  attn::TileSizes sizes;
  TileTable::with_shape(head_dim, [&](auto tiles) {
    using T = decltype(tiles);
    sizes = {{T::kBlockM, T::kWarpRows}, {T::kKeysPerTile}};
  });
  return sizes;
}

}  // namespace

ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID,
                                   "flash: online softmax, K/V streamed, P kept in registers",
                                   launch_flash)
                       .serving(TileTable::head_dims(), {attn::DType::fp16, attn::DType::bf16})
                       .with_shared_bytes(shared_bytes_needed)
                       .with_tiles(tile_sizes)
                       .writing_log_sum_exp()
                       .taking_kv_tokens()
                       .taking_key_padding_mask()
                       .taking_causal())
