// The online softmax of one tile of scores, for a thread's two rows of a tensor-core accumulator.
//
// Both generations of tensor-core instruction hand a thread the same part of a score tile:
// mma.sync's m16n8 blocks (v6, v9) and wgmma's m64nN (v7, v8, v10) give it, for each block of 8
// keys, four floats: row r, keys 2q and 2q + 1 (elements 0, 1) and row r + 8, the same keys
// (elements 2, 3), where q is its lane in its quad (lane % 4). A thread's "half" 0 is row r,
// half 1 row r + 8; the quad's four lanes hold the rest of both rows.
//
// For each row, with the tile's scores s and the running maximum m and sum l (m in raw score
// units, l this lane's share):
//
//   m' = max(m, max_j s_j)          (the quad's four lanes agree through two shuffles)
//   c  = exp2((m - m') scale log2(e))   the factor O and l shrink by: 0 on the first tile
//   p_j = exp2(s_j scale log2(e) - m' scale log2(e))   one FFMA and one ex2 per score
//   l' = l c + sum_j p_j
//
// The scores become p in place; `correction` keeps c for O, which the caller rescales
// (rescale_rows) when it may: a step that overlaps P V with the next softmax (v8) must first
// wait for the P V in flight.
#pragma once

#include "ampere/fragment_math.cuh"

namespace policies {

// Folds kCount values (a power of two) in pairs: ((v0 op v1) op (v2 op v3)) for four, a tree of
// independent operations rather than one chain. Overwrites `values`.
template <int kCount, typename Op>
__device__ __forceinline__ float pairwise(float (&values)[kCount], Op op) {
  static_assert((kCount & (kCount - 1)) == 0, "a power of two");
  for (int width = 1; width < kCount; width *= 2) {
    for (int i = 0; i + width < kCount; i += 2 * width) values[i] = op(values[i], values[i + width]);
  }
  return values[0];
}

// One tile of kKeys scores (s_acc: kKeys / 8 blocks of four floats), in place. kChains: the
// maxima and sums are kept as that many independent partial results, not one chain in which
// every instruction waits for the one before; v8 needs 4, because while its softmax runs the
// other consumer's warps mostly wait on their wgmma, so each warp's own instruction-level
// parallelism decides its speed.
template <int kKeys, int kChains = 1>
__device__ __forceinline__ void online_softmax(float (&s_acc)[kKeys / 2], float (&row_max)[2],
                                               float (&row_sum)[2], float (&correction)[2],
                                               float scale_log2) {
  for (int half = 0; half < 2; ++half) {
    float maxima[kChains];
    for (int c = 0; c < kChains; ++c) maxima[c] = row_max[half];
    for (int i = 0; i < kKeys / 8; ++i) {
      maxima[i % kChains] = fmaxf(maxima[i % kChains],
                                  fmaxf(s_acc[4 * i + 2 * half], s_acc[4 * i + 2 * half + 1]));
    }
    float tile_max = pairwise(maxima, [](float a, float b) { return fmaxf(a, b); });
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));  // across the quad
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float max_scaled = tile_max * scale_log2;
    correction[half] = fragment_math::fast_exp2(row_max[half] * scale_log2 - max_scaled);  // 0 at first
    row_max[half] = tile_max;
    float sums[kChains] = {};
    for (int i = 0; i < kKeys / 8; ++i) {
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        s_acc[4 * i + e] = fragment_math::fast_exp2(fmaf(s_acc[4 * i + e], scale_log2, -max_scaled));
        sums[i % kChains] += s_acc[4 * i + e];
      }
    }
    row_sum[half] = row_sum[half] * correction[half] +
                    pairwise(sums, [](float a, float b) { return a + b; });
  }
}

// O shrinks by each row's correction when its maximum grows: o_acc holds kColumns / 8 blocks
// of four floats in the same layout.
template <int kColumns>
__device__ __forceinline__ void rescale_rows(float (&o_acc)[kColumns / 2], const float (&correction)[2]) {
  for (int half = 0; half < 2; ++half) {
    for (int d = 0; d < kColumns / 8; ++d) {
      o_acc[4 * d + 2 * half] *= correction[half];
      o_acc[4 * d + 2 * half + 1] *= correction[half];
    }
  }
}

}  // namespace policies
