// Step v5: a larger query tile, and shared-memory rows padded against bank conflicts.
//
// What changed from v4, two things:
//
// 1. The block owns kQueryRows = 32 query rows with 8 warps, arranged as 2 row groups x 4
//    (warp w works on rows 16*(w / 4) on, and on keys or output columns 16*(w % 4) on). Every
//    K and V tile brought from L2 into shared memory now serves 32 rows instead of 16: half
//    the L2-to-SM traffic for the same work, and twice the tensor-core work per barrier.
//
// 2. Padded rows. With rows of 64 halves (128 bytes), as in v3 and v4, the 16 rows of a
//    fragment all start on the same shared-memory bank, so loading one 16 x 16 fragment
//    (8 or 16 rows read together) serialises on the same banks. Here every row of the Q, K
//    and V tiles is kTileStride = 64 + 8 halves (144 bytes) apart: consecutive rows start 4
//    banks further on, and 8 rows of 16 bytes cover all 32 banks. The fp32 score rows are
//    padded by 4 floats (16 bytes) the same way, and so is the fp32 O staging tile. (wmma asks
//    ldm to be a multiple of 8 halves or 4 floats; 72 and n_padded + 4 are.)
//
// Fitting 32 rows: 32 fp32 score rows plus 32 fp16 P rows at N = 1025 would need 205 KB, over
// an A100's 163 KB per block. So P overwrites the scores in place: row r of P (fp16) lies in the
// first half of the bytes of score row r, a half row of stride 2 * score_stride. Safe, because
// each row belongs to one warp, which walks it in steps of 32 keys: step i reads scores
// 32i..32i+31, then (after a __syncwarp) writes p for keys 32i..32i+31, i.e. bytes 64i..64i+63,
// which hold scores 16i..16i+15 <= 32i+15. Those were read at step i/2 <= i, before the
// __syncwarp of step i, and later steps read only scores from 32(i+1) on. The P rows keep the
// 16-byte padding of the score rows.
//
// Limit: head dim 64 only, and N by the GPU's shared memory per block: 32 padded fp32 score
// rows, about 128*N_padded bytes plus 23 KB of tiles (N <= 320, 576, 1088, 1600 at 64, 99,
// 163, 227 KB).
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
constexpr int kQueryRows = 32;  // query rows per block: two fragments' rows
constexpr int kWarpSize = 32;
constexpr int kRowGroups = 2;    // 16-row groups of the query tile
constexpr int kColumnWarps = 4;  // warps per row group
constexpr int kWarps = kRowGroups * kColumnWarps;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kKeyTile = 64;   // K and V rows staged in shared memory at a time
constexpr int kFragment = 16;  // wmma shape 16 x 16 x 16
constexpr int kTileStride = kHeadDim + 8;     // halves between rows of the Q, K, V and O tiles
constexpr int kStagingStride = kHeadDim + 4;  // floats between rows of the O staging tile
constexpr int kScorePad = 4;                  // floats added to every score row
static_assert(kQueryRows == kRowGroups * kFragment, "each row group is one fragment tall");
static_assert(kKeyTile / kFragment == kColumnWarps, "one score fragment of a key tile per warp");
static_assert(kHeadDim / kFragment == kColumnWarps, "one block of output columns per warp");
static_assert(kTileStride % 8 == 0 && kStagingStride % 4 == 0 && kScorePad % 4 == 0 &&
                  kKeyTile % kWarpSize == 0,
              "wmma ldm: multiples of 8 halves or 4 floats; whole warp steps along a row");

__host__ __device__ constexpr int padded_tokens(int tokens) {
  return (tokens + kKeyTile - 1) / kKeyTile * kKeyTile;
}

// Floats between score rows (n_padded + 4: rows 16 bytes off the 128-byte bank period); the
// fp16 P row that overwrites a score row has twice as many halves between rows.
__host__ __device__ constexpr int score_stride(int n_padded) { return n_padded + kScorePad; }

__host__ __device__ constexpr std::size_t round_up_128(std::size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// Byte offsets of the buffers carved from the block's dynamic shared memory. Each starts on a
// 128-byte boundary, more than the 32 bytes wmma asks of a fragment's pointer. P has no buffer
// of its own: it overwrites the scores.
struct SharedLayout {
  std::size_t q_tile, kv_tile, scores, o_staging, row_sums, total;
};

__host__ __device__ constexpr SharedLayout shared_layout(int n_padded) {
  SharedLayout layout{};
  layout.q_tile = 0;
  layout.kv_tile = round_up_128(layout.q_tile + kQueryRows * kTileStride * sizeof(__half));
  layout.scores = round_up_128(layout.kv_tile + kKeyTile * kTileStride * sizeof(__half));
  layout.o_staging = round_up_128(layout.scores + std::size_t(kQueryRows) *
                                                      score_stride(n_padded) * sizeof(float));
  layout.row_sums = round_up_128(layout.o_staging + kQueryRows * kStagingStride * sizeof(float));
  layout.total = layout.row_sums + kQueryRows * sizeof(float);
  return layout;
}

// The shared memory a shape needs: the harness compares it with the GPU's limit and
// refuses an N that does not fit (exit 2), so the limit is the GPU's, not this file's.
std::size_t shared_bytes_needed(const attn::Shape& shape) {
  return shared_layout(padded_tokens(int(shape.tokens))).total;
}

// A staged row of kHeadDim halves travels as kChunksPerRow 16-byte chunks (uint4, 8 halves);
// in shared memory its rows lie kTileStride halves apart.
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
    *reinterpret_cast<uint4*>(tile + row * kTileStride + d) = value;
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
          *reinterpret_cast<const uint4*>(tile + row * kTileStride + d);
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
    large_tile_attention_kernel(const __half* q, const __half* k, const __half* v, __half* o,
                                int tokens, float scale) {
  const int n_padded = padded_tokens(tokens);
  const SharedLayout layout = shared_layout(n_padded);
  extern __shared__ __align__(128) unsigned char shared[];
  const int stride = score_stride(n_padded);  // floats between score rows
  const int prob_stride = 2 * stride;         // halves between P rows
  // Each buffer as [rows][row stride], its data in the first columns of a row.
  __half* q_tile = reinterpret_cast<__half*>(shared + layout.q_tile);    // [32][kTileStride]
  __half* kv_tile = reinterpret_cast<__half*>(shared + layout.kv_tile);  // [kKeyTile][kTileStride]
  float* scores = reinterpret_cast<float*>(shared + layout.scores);      // [32][stride]
  __half* probs = reinterpret_cast<__half*>(scores);                     // [32][prob_stride]
  float* o_staging = reinterpret_cast<float*>(shared + layout.o_staging);  // [32][kStagingStride]
  float* row_sums = reinterpret_cast<float*>(shared + layout.row_sums);    // [32]

  const int tid = threadIdx.x;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row_group = warp / kColumnWarps;    // rows 16*row_group on
  const int column_warp = warp % kColumnWarps;  // keys (S) or output columns (O) 16*column_warp on
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
    // BEGIN EXERCISE: this warp's score fragment (its row group x its 16 keys), 4 steps along D
    wmma::fill_fragment(score_frag, 0.0f);
#pragma unroll
    for (int d = 0; d < kHeadDim; d += kFragment) {
      wmma::load_matrix_sync(q_frag, q_tile + row_group * kFragment * kTileStride + d, kTileStride);
      // K row-major [keys x D] read column-major is K^T: element (d, key) at key*kTileStride + d.
      wmma::load_matrix_sync(k_frag, kv_tile + column_warp * kFragment * kTileStride + d,
                             kTileStride);
      wmma::mma_sync(score_frag, q_frag, k_frag, score_frag);
    }
    wmma::store_matrix_sync(scores + row_group * kFragment * stride + key_start +
                                column_warp * kFragment,
                            score_frag, stride, wmma::mem_row_major);
    // SKELETON: wmma::fill_fragment(score_frag, NAN);
    // SKELETON: wmma::store_matrix_sync(scores + row_group * kFragment * stride + key_start + column_warp * kFragment, score_frag, stride, wmma::mem_row_major);
    // END EXERCISE
  }
  __syncthreads();  // every score is in shared memory before warps read other warps' stores

  // Softmax, each row by one warp (warp w takes rows w, w + kWarps, ...), stably. scale > 0, so
  // the maximum of the scaled row is scale * row_max. P is rounded to fp16 for the PV product;
  // the row sum adds the rounded values, so O is exactly the weighted mean of V under the
  // weights actually used. P overwrites the row's scores in place (the header says why that is
  // safe): n_padded is a multiple of 32, so every lane takes the same steps and meets each
  // __syncwarp.
  for (int row = warp; row < kQueryRows; row += kWarps) {
    const float* score_row = scores + row * stride;
    __half* prob_row = probs + row * prob_stride;  // the same bytes as score_row
    float row_max = -INFINITY;
    for (int j = lane; j < tokens; j += kWarpSize) row_max = fmaxf(row_max, score_row[j]);
    row_max = warp_max(row_max);
    float row_sum = 0.0f;
    for (int j = lane; j < n_padded; j += kWarpSize) {
      const float score = score_row[j];
      __syncwarp();  // every lane has read its score before any p of this step is written
      const __half p = __float2half(j < tokens ? expf(scale * (score - row_max)) : 0.0f);
      prob_row[j] = p;
      row_sum += __half2float(p);
    }
    row_sum = warp_sum(row_sum);
    if (lane == 0) row_sums[row] = row_sum;
  }

  // O = P V, this warp's output fragment (its row group x its 16 columns) held in registers over
  // all keys. Padded keys have p = 0 and zero-filled V rows.
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
      wmma::load_matrix_sync(p_frag, probs + row_group * kFragment * prob_stride + key_start + key,
                             prob_stride);
      wmma::load_matrix_sync(v_frag, kv_tile + key * kTileStride + column_warp * kFragment,
                             kTileStride);
      wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
    }
    // SKELETON: wmma::fill_fragment(o_frag, NAN);
    // END EXERCISE
  }

  // Normalise through the fp32 staging tile into the O tile (the Q tile, no longer needed),
  // then store the rows inside the slice in coalesced chunks.
  wmma::store_matrix_sync(o_staging + row_group * kFragment * kStagingStride +
                              column_warp * kFragment,
                          o_frag, kStagingStride, wmma::mem_row_major);
  __syncthreads();
  __half* o_tile = q_tile;
  for (int i = tid; i < kQueryRows * kHeadDim; i += kThreads) {
    const int row = i / kHeadDim;
    const int d = i % kHeadDim;
    o_tile[row * kTileStride + d] =
        __float2half(o_staging[row * kStagingStride + d] / row_sums[row]);
  }
  __syncthreads();
  store_tile(o, o_tile, first_row, kQueryRows, tokens);
}

void launch_large_tile(const attn::AttentionArgs& args) {
  const std::size_t shared_bytes = shared_layout(padded_tokens(args.tokens)).total;
  CUDA_CHECK(cudaFuncSetAttribute(large_tile_attention_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  const dim3 grid(unsigned((args.tokens + kQueryRows - 1) / kQueryRows),
                  unsigned(args.batch) * unsigned(args.heads));
  const dim3 block(kThreads);
  const float scale = float(args.scale);
  large_tile_attention_kernel<<<grid, block, shared_bytes, args.stream>>>(
      args.q, args.k, args.v, args.o, args.tokens, scale);
  CUDA_CHECK_LAUNCH();
}

// The tiles along N, for the tests (step.hpp): a block's query rows, a staged K/V tile.
attn::TileSizes tile_sizes(int) { return {{kQueryRows}, {kKeyTile}}; }

}  // namespace

ATTN_REGISTER_STEP(attn::step_info(ATTN_STEP_ID, "large tile: 32 rows, 8 warps, padded smem rows",
                                   launch_large_tile)
                       .serving({64})
                       .with_shared_bytes(shared_bytes_needed)
                       .with_tiles(tile_sizes))
