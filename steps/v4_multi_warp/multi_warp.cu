// Step v4: several warps per block. The same 16-row tile and the same shared memory as v3,
// but 4 warps (128 threads) share the staged Q, K and V tiles instead of one warp doing all
// the fragments in turn.
//
// What changed from v3: in S = Q K^T each warp computes one 16 x 16 score fragment of the
// 64-key tile (warp w takes keys 16w..16w+15); the softmax rows are spread over the warps
// (warp w takes rows w, w + 4, ...); in O = P V each warp owns 16 of the 64 output columns
// and keeps one accumulator fragment instead of four. The tile loads spread over 128 threads.
//
// Prediction: a block needs the same shared memory as in v3, so the same number of blocks fit
// on an SM (shared memory is the limit: 1 block at N = 1025, 3 at N = 577 on an H100), but
// each brings 4 warps instead of 1. With 4x the warps resident, while one warp waits on a
// shared-memory load, an exp or a barrier, others have fragments ready for the tensor cores:
// latency hiding, with the work per block unchanged and split 4 ways.
//
// Limit: as v3, head dim 64 only and N by the GPU's shared memory per block: 16 rows of fp32
// scores and 16 rows of fp16 P, 96*N_padded bytes plus 14 KB of tiles (N <= 512, 896, 1536,
// 2240 at 64, 99, 163, 227 KB).
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda_check.hpp"
#include "step.hpp"

namespace {

using namespace nvcuda;

constexpr int kHeadDim = 64;
constexpr int kQueryRows = 16;  // query rows per block: one fragment's rows
constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kKeyTile = 64;   // K and V rows staged in shared memory at a time
constexpr int kFragment = 16;  // wmma shape 16 x 16 x 16
static_assert(kQueryRows == kFragment, "the block's rows are one fragment tall");
static_assert(kKeyTile / kFragment == kWarps, "one score fragment of a key tile per warp");
static_assert(kHeadDim / kFragment == kWarps, "one block of output columns per warp");

__host__ __device__ constexpr int padded_tokens(int tokens) {
  return (tokens + kKeyTile - 1) / kKeyTile * kKeyTile;
}

__host__ __device__ constexpr std::size_t round_up_128(std::size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// Byte offsets of the buffers carved from the block's dynamic shared memory. Each starts on a
// 128-byte boundary, more than the 32 bytes wmma asks of a fragment's pointer.
struct SharedLayout {
  std::size_t q_tile, kv_tile, scores, probs, o_staging, row_sums, total;
};

__host__ __device__ constexpr SharedLayout shared_layout(int n_padded) {
  SharedLayout layout{};
  layout.q_tile = 0;
  layout.kv_tile = round_up_128(layout.q_tile + kQueryRows * kHeadDim * sizeof(__half));
  layout.scores = round_up_128(layout.kv_tile + kKeyTile * kHeadDim * sizeof(__half));
  layout.probs = round_up_128(layout.scores + std::size_t(kQueryRows) * n_padded * sizeof(float));
  layout.o_staging =
      round_up_128(layout.probs + std::size_t(kQueryRows) * n_padded * sizeof(__half));
  layout.row_sums = round_up_128(layout.o_staging + kQueryRows * kHeadDim * sizeof(float));
  layout.total = layout.row_sums + kQueryRows * sizeof(float);
  return layout;
}

// The shared memory a shape needs: the harness compares it with the GPU's limit and
// refuses an N that does not fit (exit 2), so the limit is the GPU's, not this file's.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  return shared_layout(padded_tokens(int(shape.tokens))).total;
}

// A staged row of kHeadDim halves travels as kChunksPerRow 16-byte chunks (uint4, 8 halves).
constexpr int kChunkHalves = 8;
constexpr int kChunksPerRow = kHeadDim / kChunkHalves;

// Copies rows [first_row, first_row + rows) of a [tokens, kHeadDim] slice into a tile,
// zero-filling rows past the end. The rows are contiguous in the slice, so thread t takes
// chunks t, t + kThreads, ...: consecutive threads read consecutive 16 bytes.
__device__ void load_tile(__half* tile, const __half* slice, int first_row, int rows,
                          int tokens) {
  const int tid = threadIdx.x;
  for (int chunk = tid; chunk < rows * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow;
    const int d = chunk % kChunksPerRow * kChunkHalves;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (first_row + row < tokens) {
      value = *reinterpret_cast<const uint4*>(slice + (first_row + row) * kHeadDim + d);
    }
    *reinterpret_cast<uint4*>(tile + row * kHeadDim + d) = value;
  }
}

// Copies the tile's rows that lie inside the slice back to it, in coalesced 16-byte chunks.
__device__ void store_tile(__half* slice, const __half* tile, int first_row, int rows,
                           int tokens) {
  const int tid = threadIdx.x;
  for (int chunk = tid; chunk < rows * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow;
    const int d = chunk % kChunksPerRow * kChunkHalves;
    if (first_row + row < tokens) {
      *reinterpret_cast<uint4*>(slice + (first_row + row) * kHeadDim + d) =
          *reinterpret_cast<const uint4*>(tile + row * kHeadDim + d);
    }
  }
}

// Reductions over the 32 lanes of a warp, which shares one row of scores.
__device__ float warp_max(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

__device__ float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// grid = (query-row tiles, batch*heads), block = kWarps warps.
__global__ void __launch_bounds__(kThreads)
    multi_warp_attention_kernel(const __half* q, const __half* k, const __half* v, __half* o,
                                int tokens, float scale) {
  const int n_padded = padded_tokens(tokens);
  const SharedLayout layout = shared_layout(n_padded);
  extern __shared__ __align__(128) unsigned char shared[];
  __half* q_tile = reinterpret_cast<__half*>(shared + layout.q_tile);    // [kQueryRows][kHeadDim]
  __half* kv_tile = reinterpret_cast<__half*>(shared + layout.kv_tile);  // [kKeyTile][kHeadDim]
  float* scores = reinterpret_cast<float*>(shared + layout.scores);      // [kQueryRows][n_padded]
  __half* probs = reinterpret_cast<__half*>(shared + layout.probs);      // [kQueryRows][n_padded]
  float* o_staging = reinterpret_cast<float*>(shared + layout.o_staging);  // [kQueryRows][kHeadDim]
  float* row_sums = reinterpret_cast<float*>(shared + layout.row_sums);    // [kQueryRows]

  const int tid = threadIdx.x;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int first_row = blockIdx.x * kQueryRows;
  const int64_t slice_offset = int64_t(blockIdx.y) * tokens * kHeadDim;
  q += slice_offset;
  k += slice_offset;
  v += slice_offset;
  o += slice_offset;

  load_tile(q_tile, q, first_row, kQueryRows, tokens);

  // S = Q K^T, unscaled. Keys past the end meet zero-filled K rows, so their scores are finite;
  // the softmax skips them.
  wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, __half, wmma::row_major> q_frag;
  wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, __half, wmma::col_major> k_frag;
  wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float> score_frag;
  for (int key_start = 0; key_start < tokens; key_start += kKeyTile) {
    __syncthreads();  // the previous K tile has been read
    load_tile(kv_tile, k, key_start, kKeyTile, tokens);
    __syncthreads();  // the K tile (and, the first time, the Q tile) is complete
    // BEGIN EXERCISE: this warp's score fragment of the K tile (keys 16*warp on), 4 steps along D
    wmma::fill_fragment(score_frag, 0.0f);
#pragma unroll
    for (int d = 0; d < kHeadDim; d += kFragment) {
      wmma::load_matrix_sync(q_frag, q_tile + d, kHeadDim);
      // K row-major [keys x D] read column-major is K^T: element (d, key) at key*kHeadDim + d.
      wmma::load_matrix_sync(k_frag, kv_tile + warp * kFragment * kHeadDim + d, kHeadDim);
      wmma::mma_sync(score_frag, q_frag, k_frag, score_frag);
    }
    wmma::store_matrix_sync(scores + key_start + warp * kFragment, score_frag, n_padded,
                            wmma::mem_row_major);
    // SKELETON: wmma::fill_fragment(score_frag, NAN);
    // SKELETON: wmma::store_matrix_sync(scores + key_start + warp * kFragment, score_frag, n_padded, wmma::mem_row_major);
    // END EXERCISE
  }
  __syncthreads();  // every score is in shared memory before warps read other warps' stores

  // Softmax, each row by one warp (warp w takes rows w, w + kWarps, ...), stably. scale > 0, so
  // the maximum of the scaled row is scale * row_max. P is rounded to fp16 for the PV product;
  // the row sum adds the rounded values, so O is exactly the weighted mean of V under the
  // weights actually used.
  for (int row = warp; row < kQueryRows; row += kWarps) {
    const float* score_row = scores + row * n_padded;
    __half* prob_row = probs + row * n_padded;
    float row_max = -INFINITY;
    for (int j = lane; j < tokens; j += kWarpSize) row_max = fmaxf(row_max, score_row[j]);
    row_max = warp_max(row_max);
    float row_sum = 0.0f;
    for (int j = lane; j < n_padded; j += kWarpSize) {
      const __half p = __float2half(j < tokens ? expf(scale * (score_row[j] - row_max)) : 0.0f);
      prob_row[j] = p;
      row_sum += __half2float(p);
    }
    row_sum = warp_sum(row_sum);
    if (lane == 0) row_sums[row] = row_sum;
  }

  // O = P V, this warp's output fragment (columns 16*warp on) held in registers over all keys.
  // Padded keys have p = 0 and zero-filled V rows.
  wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, __half, wmma::row_major> p_frag;
  wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, __half, wmma::row_major> v_frag;
  wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float> o_frag;
  wmma::fill_fragment(o_frag, 0.0f);
  for (int key_start = 0; key_start < tokens; key_start += kKeyTile) {
    __syncthreads();  // the K (or previous V) tile has been read, P and the row sums are written
    load_tile(kv_tile, v, key_start, kKeyTile, tokens);
    __syncthreads();
    // BEGIN EXERCISE: accumulate this V tile into this warp's output fragment, 16 keys at a time
#pragma unroll
    for (int key = 0; key < kKeyTile; key += kFragment) {
      wmma::load_matrix_sync(p_frag, probs + key_start + key, n_padded);
      wmma::load_matrix_sync(v_frag, kv_tile + key * kHeadDim + warp * kFragment, kHeadDim);
      wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
    }
    // SKELETON: wmma::fill_fragment(o_frag, NAN);
    // END EXERCISE
  }

  // Normalise through the fp32 staging tile into the O tile (the Q tile, no longer needed),
  // then store the rows inside the slice in coalesced chunks.
  wmma::store_matrix_sync(o_staging + warp * kFragment, o_frag, kHeadDim, wmma::mem_row_major);
  __syncthreads();
  __half* o_tile = q_tile;
  for (int i = tid; i < kQueryRows * kHeadDim; i += kThreads) {
    o_tile[i] = __float2half(o_staging[i] / row_sums[i / kHeadDim]);
  }
  __syncthreads();
  store_tile(o, o_tile, first_row, kQueryRows, tokens);
}

void launch_multi_warp(const attn::AttentionArgs& args) {
  const std::size_t shared_bytes = shared_layout(padded_tokens(args.tokens)).total;
  CUDA_CHECK(cudaFuncSetAttribute(multi_warp_attention_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  const dim3 grid(unsigned((args.tokens + kQueryRows - 1) / kQueryRows),
                  unsigned(args.batch) * unsigned(args.heads));
  const dim3 block(kThreads);
  const float scale = float(args.scale);
  multi_warp_attention_kernel<<<grid, block, shared_bytes, args.stream>>>(
      args.q, args.k, args.v, args.o, args.tokens, scale);
  CUDA_CHECK_LAUNCH();
}

// The tiles along N, for the tests (step.hpp): a block's query rows, a staged K/V tile.
attn::TileSizes tile_sizes(int) { return {{kQueryRows}, {kKeyTile}}; }

}  // namespace

ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID, "multi-warp: 4 warps share the staged tiles",
                                   launch_multi_warp)
                       .serving({64})
                       .with_shared_bytes(shared_bytes_needed)
                       .with_tiles(tile_sizes))
