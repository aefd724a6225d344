// The forward epilogue of a Hopper step (v7, v8): O and L of one warpgroup's 64 rows of a tile.
//
// At the end of a tile a thread holds, for its two rows (policies/online_softmax.cuh gives the
// layout), the unnormalised O in o_acc and the online softmax's maximum and its lane's share of
// the sum. The epilogue
//   1. adds up each row's sum across its quad and writes L = log(sum) + max (the quad's first
//      lane, rows before N only), when the step is asked for L;
//   2. waits until the staging buffer's previous store has read it (nothing to wait for on a
//      block's first tile), then every thread writes its share of O / sum into the buffer, in the
//      swizzled layout the TMA store reads;
//   3. fences (ordinary stores, read next by the copy engine: the async proxy) and meets the
//      warpgroup at its named barrier; one thread issues the store and commits it. Rows past N
//      are dropped by the store. The store runs on while the warpgroup goes on; before shared
//      memory goes away, the block waits for it (StagingBuffer::wait).
// kMaybeNoKey: a mask may have left a row no key; its maximum is then still kPaddedScore, and
// the row is written as O = 0, L = -inf (the references' definition).
//
// Packed sequences (policies/sequences.cuh) change where the rows go, not how they are made. A
// TMA store drops only the rows past the end of the whole tensor, and the rows past one
// sequence's end belong to the next sequence: so there the warpgroup copies its rows out itself,
// 16 bytes a thread at a time, each row only if it lies before its sequence's end, and L goes
// to [H, total] instead of [B, H, N].
#pragma once

#include <cstdint>

#include "hopper/layout.cuh"
#include "hopper/pipeline.cuh"
#include "hopper/ptx.cuh"
#include "policies/mask.cuh"
#include "policies/tile_scheduler.cuh"

namespace hopper {

// Where a tile's O rows and L rows go (the last argument of store_output).
template <bool kPacked>
struct OutputRows;
// Sequences of one length: O by the TMA store into [B, H, N, D], L at [B, H, N].
template <>
struct OutputRows<false> {};
// Packed sequences: O rows copied by the threads into [total, H, D] (its strides in bytes), L at
// [H, total]; q_start is the tile's sequence's first row.
template <>
struct OutputRows<true> {
  unsigned char* o;
  int64_t token_stride_bytes, head_stride_bytes;
  int total_tokens, q_start;
};

// T: the step's tile shape (kBlockM rows staged per tile, kTileColumns columns in kColumnBlocks
// swizzle blocks of kSwizzleColumns). o_tile: the staging tile, [column block][kBlockM][columns];
// this warpgroup (`group`) owns rows 64 group .. 64 group + 63 of it, the sequence's rows from
// first_row on; the sequence has `tokens` rows.
template <typename T, bool kWritesLse, bool kMaybeNoKey, typename Element, bool kPacked = false>
__device__ __forceinline__ void store_output(Element* o_tile, StagingBuffer& o_staging,
                                             const CUtensorMap& o_map,
                                             const float (&o_acc)[T::kTileColumns / 2],
                                             const float (&row_max)[2], const float (&row_sum)[2],
                                             float* __restrict__ row_lse,
                                             const policies::WorkTile& tile, int tokens, int group,
                                             int first_row, int warp, int lane, float scale_log2,
                                             const OutputRows<kPacked>& rows = {}) {
  const int quad_lane = lane % 4, thread_in_group = threadIdx.x % 128;
  float inverse[2];
  for (int half = 0; half < 2; ++half) {
    float total = row_sum[half];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const bool no_key = kMaybeNoKey && row_max[half] == policies::kPaddedScore;
    inverse[half] = no_key ? 0.0f : 1.0f / total;
    if constexpr (kWritesLse) {
      const int row = first_row + warp * 16 + lane / 4 + 8 * half;
      if (quad_lane == 0 && row < tokens) {
        int64_t lse_index = int64_t(tile.slice) * tokens + row;
        if constexpr (kPacked) lse_index = int64_t(tile.head) * rows.total_tokens + rows.q_start + row;
        row_lse[lse_index] =
            no_key ? -INFINITY : log_sum_exp(row_max[half], total, scale_log2);
      }
    }
  }
  if (thread_in_group == 0) o_staging.wait_read();
  o_staging.sync();
  o_staging.begin_writes();
  unsigned char* o_bytes = reinterpret_cast<unsigned char*>(o_tile);
  for (int d = 0; d < T::kTileColumns / 8; ++d) {
    for (int half = 0; half < 2; ++half) {
      const int row = group * 64 + warp * 16 + lane / 4 + 8 * half;
      *reinterpret_cast<uint32_t*>(o_bytes + swizzled_offset<T::kSwizzle>(row, 8 * d + 2 * quad_lane, T::kBlockM)) =
          pack_pair<Element>(o_acc[4 * d + 2 * half] * inverse[half],
                             o_acc[4 * d + 2 * half + 1] * inverse[half]);
    }
  }
  o_staging.fence();  // these ordinary stores are read next by the copy engine
  o_staging.sync();
  if constexpr (kPacked) {
    // The warpgroup's 64 rows, each of kHeadDim / 8 chunks of 16 bytes (8 columns, contiguous in
    // every swizzle), the columns past D left out; rows past the sequence's end stay where they are.
    constexpr int kChunks = T::kHeadDim / 8;
    const unsigned char* staged = reinterpret_cast<const unsigned char*>(o_tile);
    for (int index = thread_in_group; index < 64 * kChunks; index += 128) {
      const int row = index / kChunks, chunk = index % kChunks;
      if (first_row + row >= tokens) break;  // the rows go in order: every later one lies past it too
      const uint4 value = *reinterpret_cast<const uint4*>(
          staged + swizzled_offset<T::kSwizzle>(group * 64 + row, 8 * chunk, T::kBlockM));
      *reinterpret_cast<uint4*>(rows.o + int64_t(rows.q_start + first_row + row) * rows.token_stride_bytes +
                                int64_t(tile.head) * rows.head_stride_bytes + 16 * chunk) = value;
    }
    if (thread_in_group == 0) o_staging.commit();  // no copy: an empty group, the protocol's count
  } else if (thread_in_group == 0) {
    for (int c = 0; c < T::kColumnBlocks; ++c) {
      tma_store(&o_map, o_tile + (c * T::kBlockM + group * 64) * T::kSwizzleColumns,
                c * T::kSwizzleColumns, first_row, tile.head, tile.batch);
    }
    o_staging.commit();
  }
}

}  // namespace hopper
