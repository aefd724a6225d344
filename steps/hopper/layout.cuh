// Where a tile's elements sit in shared memory, and how wgmma is told so.
//
// TMA writes a tile in a swizzled layout and wgmma reads it back through a matrix descriptor
// that names the same swizzle. A swizzle of W bytes (128, 64 or 32) cuts the tile into column
// blocks W bytes wide (W / 2 fp16 columns), each holding every row of the tile, one row per W
// bytes; inside a block the 16-byte chunks of a row are permuted by XOR with the row's place in
// an 8-row pattern, so that the 8 rows a tensor-core read touches at once fall in different
// shared-memory banks. In bytes: bits 4.. of an offset are XORed with bits 7.. of it, as many
// bits as W has 16-byte chunks to choose from (3 for 128, 2 for 64, 1 for 32):
//
//   128-byte swizzle: chunk c of row r is stored at chunk c ^ (r % 8)        (8 chunks a row)
//    64-byte swizzle: chunk c of row r is stored at chunk c ^ ((r / 2) % 4)  (4 chunks a row)
//    32-byte swizzle: chunk c of row r is stored at chunk c ^ ((r / 4) % 2)  (2 chunks a row)
//
// The pattern repeats every 8 * W bytes and is computed from address bits, so every tile starts
// on a 1024-byte boundary; then the copy engine, the tensor cores and swizzled_offset() agree.
// Head dims that are multiples of 64 use 128-byte blocks; narrower widths are for head dims
// that are not (a 32-column tail is one 64-byte block).
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "hopper/ptx.cuh"
#include "step.hpp"

namespace hopper {

// The most shared memory a block of an H100 or H200 may ask for (227 KB): the budget of compute
// capability 9.0 in the contract's table of GPUs (attn::kSharedBudgets).
constexpr uint32_t hopper_shared_budget() {
  for (const attn::SharedBudget& budget : attn::kSharedBudgets) {
    if (budget.capabilities[0] == 90) return uint32_t(budget.bytes);
  }
  return 0;
}
constexpr uint32_t kMaxSharedBytesPerBlock = hopper_shared_budget();
static_assert(kMaxSharedBytesPerBlock > 0, "the contract's table names the Hopper budget");

// The values are the descriptor's swizzle field (bits 62-63).
enum class Swizzle : uint32_t { bytes128 = 1, bytes64 = 2, bytes32 = 3 };

// Bytes in one swizzled row (the width of a column block), and the 16-bit columns that holds.
__host__ __device__ constexpr int row_bytes(Swizzle swizzle) {
  return swizzle == Swizzle::bytes128 ? 128 : swizzle == Swizzle::bytes64 ? 64 : 32;
}
__host__ __device__ constexpr int row_columns(Swizzle swizzle) {
  return row_bytes(swizzle) / int(sizeof(__half));
}
// How a tile of D columns is stored: head dims that are multiples of 64 in 128-byte blocks of 64
// columns, the others (32, 80, 96) in 64-byte blocks of 32, the tile padded to whole blocks (at
// D = 80 to 96 columns, the 16 past D filled with zeros by TMA).
__host__ __device__ constexpr Swizzle head_dim_swizzle(int head_dim) {
  return head_dim % 64 == 0 ? Swizzle::bytes128 : Swizzle::bytes64;
}
__host__ __device__ constexpr int tile_columns(int head_dim) {
  const int block = row_columns(head_dim_swizzle(head_dim));
  return (head_dim + block - 1) / block * block;
}
// The tensor map's name for the same swizzle (the host builds maps with it).
constexpr CUtensorMapSwizzle tensor_map_swizzle(Swizzle swizzle) {
  return swizzle == Swizzle::bytes128  ? CU_TENSOR_MAP_SWIZZLE_128B
         : swizzle == Swizzle::bytes64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                       : CU_TENSOR_MAP_SWIZZLE_32B;
}

// Byte offset of element (row, column) in a tile of `rows` rows laid out as above.
template <Swizzle kSwizzle>
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int row, int column, int rows) {
  constexpr int kBytes = row_bytes(kSwizzle), kColumns = row_columns(kSwizzle);
  constexpr int kChunks = kBytes / 16, kRowsPerPatternRow = 128 / kBytes;
  const int block = column / kColumns, chunk = (column % kColumns) / 8;
  return uint32_t(block * rows * kBytes + row * kBytes +
                  ((chunk ^ ((row / kRowsPerPatternRow) % kChunks)) * 16) + (column % 8) * 2);
}

// The 64-bit shared-memory matrix descriptor: start address, leading and stride byte offsets
// (each stored >> 4), and the swizzle mode.
template <Swizzle kSwizzle>
__device__ __forceinline__ uint64_t matrix_descriptor(const void* tile, uint32_t leading_bytes,
                                                      uint32_t stride_bytes) {
  return uint64_t((shared_address(tile) & 0x3FFFF) >> 4) | (uint64_t(leading_bytes >> 4) << 16) |
         (uint64_t(stride_bytes >> 4) << 32) | (uint64_t(kSwizzle) << 62);
}

// A wgmma operand stored K-major: its rows (of M or N) run along the k dimension, as Q and K do
// in S = Q K^T (rows of D). `rows` points at the operand's first row inside a swizzled tile
// whose column blocks hold kTileRows rows (a warpgroup's 64 rows of a 128-row Q tile, say).
// k_step(s) is the descriptor of k-step s, 16 values of k: along the swizzled row, then on to
// the next column block. The stride byte offset is the distance between 8-row groups; the
// leading one is unused with a swizzle.
template <int kTileRows, Swizzle kSwizzle = Swizzle::bytes128>
class KMajorOperand {
 public:
  __device__ explicit KMajorOperand(const void* rows)
      : base_(matrix_descriptor<kSwizzle>(rows, 0, 8 * row_bytes(kSwizzle))) {}
  __device__ uint64_t k_step(int step) const {
    constexpr uint32_t kStepsPerRow = row_columns(kSwizzle) / 16;
    const uint32_t column_block = step / kStepsPerRow, within_row = (step % kStepsPerRow) * 32;
    return base_ + ((column_block * kTileRows * row_bytes(kSwizzle) + within_row) >> 4);
  }

 private:
  uint64_t base_;
};

// A wgmma operand stored MN-major: its rows run along the k dimension, as V does in O = P V (its
// rows are keys, the k of the product). Column blocks of N (of D, for V) lie kTileRows rows
// apart: the leading byte offset. 8-row groups of k lie 8 swizzled rows apart: the stride byte
// offset. k_step(s) moves down 16 rows.
template <int kTileRows, Swizzle kSwizzle = Swizzle::bytes128>
class MNMajorOperand {
 public:
  __device__ explicit MNMajorOperand(const void* tile)
      : base_(matrix_descriptor<kSwizzle>(tile, kTileRows * row_bytes(kSwizzle),
                                          8 * row_bytes(kSwizzle))) {}
  __device__ uint64_t k_step(int step) const {
    return base_ + ((uint32_t(step) * 16 * row_bytes(kSwizzle)) >> 4);
  }

 private:
  uint64_t base_;
};

// ---- The tensor maps of a launch (host) --------------------------------------------------------

// Q, K, V and O of an attention launch as tensor maps, each box one swizzled column block wide:
// Q in boxes of q_rows tokens, K and V of kv_rows, O of o_rows (a warpgroup's rows). Q and O have
// N rows a slice, K and V N_k (AttentionArgs::kv_tokens: as many, but in cross-attention). The
// tensors may be views (AttentionArgs' strides): the maps carry the strides. Packed sequences
// (AttentionArgs::sequences) are [total, H, D] tensors instead.
struct AttentionMaps {
  CUtensorMap q, k, v, o;
};
// Packed sequences' tensors, [total, H, D]: the token and head strides given, or (H D, D). The
// maps see them as one batch element of `total` rows (its batch stride, past the last row, is
// never stepped).
inline attn::TensorStrides packed_strides(attn::TensorStrides given, int heads, int head_dim,
                                          int total) {
  const int64_t token = given.contiguous() ? int64_t(heads) * head_dim : given.token;
  const int64_t head = given.contiguous() ? head_dim : given.head;
  return {token * total, head, token};
}

template <Swizzle kSwizzle>
AttentionMaps attention_maps(const attn::AttentionArgs& args, int q_rows, int kv_rows, int o_rows) {
  if (args.sequences.packed()) {  // packed sequences: each tensor one batch element of all rows
    auto map = [&](const void* tensor, attn::TensorStrides given, int rows, int box_rows) {
      return tensor_map(tensor, args.dtype, 1, args.heads, rows, args.head_dim,
                        packed_strides(given, args.heads, args.head_dim, rows), box_rows,
                        row_columns(kSwizzle), tensor_map_swizzle(kSwizzle));
    };
    const int total = args.sequences.total_tokens, kv_total = args.sequences.total_kv_tokens;
    return {map(args.q, args.qkv_strides, total, q_rows), map(args.k, args.qkv_strides, kv_total, kv_rows),
            map(args.v, args.qkv_strides, kv_total, kv_rows), map(args.o, args.o_strides, total, o_rows)};
  }
  const attn::TensorStrides q =
      attn::actual_strides(args.qkv_strides, args.heads, args.tokens, args.head_dim);
  const attn::TensorStrides kv =
      attn::actual_strides(args.qkv_strides, args.heads, args.kv_tokens, args.head_dim);
  const attn::TensorStrides o =
      attn::actual_strides(args.o_strides, args.heads, args.tokens, args.head_dim);
  auto map = [&](const void* tensor, attn::TensorStrides strides, int rows, int box_rows) {
    return tensor_map(tensor, args.dtype, args.batch, args.heads, rows, args.head_dim, strides,
                      box_rows, row_columns(kSwizzle), tensor_map_swizzle(kSwizzle));
  };
  return {map(args.q, q, args.tokens, q_rows), map(args.k, kv, args.kv_tokens, kv_rows),
          map(args.v, kv, args.kv_tokens, kv_rows), map(args.o, o, args.tokens, o_rows)};
}

}  // namespace hopper
