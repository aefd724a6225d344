// The mask policy: which keys a query sees, asked in the three ways a tiled kernel needs.
//
//   1. Which K/V tiles does a tile of query rows need at all? (kv_tiles) A forward's producer
//      loads exactly those and its consumers walk exactly those: the two roles agree because
//      they ask the same object.
//   2. Which of them hold a key some row of the tile must not see? (first_partial_tile) Only
//      those pay for a mask element by element; the others run the unmasked code.
//   3. Which query tiles does a K/V tile need, for a backward that walks the queries past a
//      block's keys? (first_row) and which of those cross the diagonal? (rows_all_see)
//
// A key j exists for j < kv_tokens (keys past it are a tile's tail, TMA's zero rows), and under
// the causal mask query i sees it only where j <= i + diagonal (problem.hpp: diagonal 0 puts it
// at the top left, as PyTorch's is_causal; N_k - N at the bottom right, as FlashAttention).
// Rows and keys are counted from the start of the sequence, so what comes next fits the same
// rule: a batch of sequences of different lengths gives each work tile its own sequence's
// kv_tokens and diagonal (policies/sequences.cuh); a block of keys that another GPU holds, starting at key `offset` of
// the whole sequence, is the same mask with diagonal - offset.
//
// The key-padding mask is data, not geometry: it never removes a tile (any key may be padding),
// so it lives beside this policy, in each kernel's element mask, and combines with it freely.
#pragma once

namespace policies {

// The score an element mask gives a key a row must not see (padding, or past the diagonal):
// lower than any real score can be, and finite, so a row whose keys so far are all masked still
// has a maximum, and exp2(s scale - max scale) is exactly exp2(0) for them (2^100 times the
// scale is exact: a power of two). Such a row's P is thrown away as soon as a real key raises
// the maximum (its correction is exp2(-huge) = 0); a row that never meets one keeps
// kPaddedScore as its maximum and is written as O = 0, L = -inf.
constexpr float kPaddedScore = -0x1p100f;

template <bool kCausal>
struct Mask {
  int kv_tokens;     // keys of the slice (N_k)
  int diagonal = 0;  // query i sees keys j <= i + diagonal (with kCausal)

  // Whether query `row` sees key `key`.
  __host__ __device__ bool sees(int row, int key) const {
    return key < kv_tokens && (!kCausal || key <= row + diagonal);
  }

  // The keys rows [row0, row0 + rows) see, together: [0, key_end).
  __host__ __device__ int key_end(int row0, int rows) const {
    if (!kCausal) return kv_tokens;
    const int end = row0 + rows + diagonal;  // one past the last row's last key
    return end < 0 ? 0 : end < kv_tokens ? end : kv_tokens;
  }
  // K/V tiles of block_n keys that rows [row0, row0 + rows) need: tiles [0, kv_tiles). Zero
  // where every row lies above the diagonal (bottom right with N > N_k): O = 0 and L = -inf.
  __host__ __device__ int kv_tiles(int row0, int rows, int block_n) const {
    return (key_end(row0, rows) + block_n - 1) / block_n;
  }
  // The first K/V tile holding a key that some row of [row0, ...) does not see (past the
  // diagonal of row0, the tile's first row, or past N_k): tiles before it are whole for every
  // row, tiles from it on need the element mask.
  __host__ __device__ int first_partial_tile(int row0, int block_n) const {
    int seen_by_all = kv_tokens;  // keys 0 .. seen_by_all - 1 every row of the tile sees
    if (kCausal) {
      const int first_row_end = row0 + diagonal + 1;
      seen_by_all = first_row_end < 0 ? 0 : first_row_end < kv_tokens ? first_row_end : kv_tokens;
    }
    return seen_by_all / block_n;
  }

  // For a backward that walks query tiles past a block of keys [key0, ...): the first row that
  // sees key0, so tiles of block_m rows before first_row(key0) / block_m are skipped.
  __host__ __device__ int first_row(int key0) const {
    return kCausal && key0 - diagonal > 0 ? key0 - diagonal : 0;
  }
  // Whether every row from row0 on sees every key of [key0, key0 + keys) that exists: rows
  // tiles from here on need no element mask.
  __host__ __device__ bool rows_all_see(int row0, int key0, int keys) const {
    return !kCausal || key0 + keys - 1 <= row0 + diagonal;
  }
};

}  // namespace policies
