// Which tile of which (batch, head) slice a block works on: the tile scheduler.
//
// A launch's work is slices x tiles: the query-row tiles of a forward (v7, v8), the K/V tiles of
// a backward block (v10). Work tile `index` is tile index % tiles of slice index / tiles, so
// consecutive indices are neighbouring tiles of one slice, which read the same K and V (or Q and
// dO) and find them in L2.
//
// Two ways to hand the indices out:
//   - one block per work tile (v7, v10): block b takes work tile b (this_block());
//   - persistent blocks (v8): one block per SM walks work tiles blockIdx.x, + gridDim.x, ...,
//     so a block's next tile is loaded while it finishes the current one. Every role of the
//     block walks the same sequence, so they agree on it without talking.
//
// Under a causal mask a backward block's K/V tile decides its work: the keys of tile 0 are seen
// by every query row, those of the last tile by the last rows only. Handed out slice by slice,
// each slice's longest block comes first, so the last slice's starts near the end of the launch
// and runs on after every other block has finished. longest_first() hands them out in groups of
// a few slices instead, K/V tile 0 of each slice of the group, then tile 1, ...: the long blocks
// start early and the short ones fill in behind them, while the blocks running at once still
// share the Q and dO of a few slices in L2.
//
// Under a causal mask a forward's row tile near the bottom walks many more K/V tiles than one
// near the top, and walked slice by slice a persistent block keeps about the same place in each
// slice round after round: where the tiles per slice divide the blocks (33 into 132 at N = 4097)
// exactly the same row tile, and at (1, 16, 16384) with 128 row tiles a place that moves by 4 a
// round, so the busiest block walks 1.54 times the mean (scripts/causal_walk.py counts it). So a
// causal walk (kCausalWalk) hands every other full round's tiles out in reverse, so a block that
// took a long row tile in one round takes a short one in the next (a permutation of the round:
// every tile is still taken once); and where the launch asks for it (longest_first), it hands out
// the bottom row tile of every slice first, then the one above it, and so on up: the longest work
// first, the short tiles filling in at the end (1.008 times the mean at (1, 16, 16384)). That
// order gives up the L2 reuse of the slice-by-slice walk, whose blocks work on neighbouring row
// tiles of a few slices and read the same K/V tiles together: a step asks for it only where each
// slice still has several blocks at once (chapter 20).
//
// Packed sequences of different lengths (chapter 21) get a walk of their own (PackedScheduler):
// only the row tiles that exist, sequence by sequence, head by head, in order, so that the
// blocks running at once work on neighbouring row tiles of one sequence (its K/V tiles shared
// in L2), and no block keeps one place in every slice: the tiles of different sequences differ
// in number, so the rounds drift across them.
#pragma once

#include <cstdint>

namespace policies {

struct WorkTile {
  int slice;       // b H + h
  int head, batch;
  int tile;        // which tile of the slice
  int row0;        // its first row (of queries in a forward, of keys in a backward block)
};

// kRowsPerTile: the rows of a tile (query rows in a forward, keys in a backward block).
template <int kRowsPerTile>
struct TileScheduler {
  int tiles_per_slice;  // row tiles (or K/V tiles) of one slice
  int heads;

  __host__ __device__ __forceinline__ WorkTile at(int index) const {
    const int slice = index / tiles_per_slice, tile = index % tiles_per_slice;
    return {slice, slice % heads, slice / heads, tile, tile * kRowsPerTile};
  }
  // One block per work tile (v7, v10): this block's. at(blockIdx.x) but in unsigned arithmetic,
  // as blockIdx.x is: the divisions stay the unsigned ones the steps always compiled to.
  __device__ __forceinline__ WorkTile this_block() const {
    const int slice = blockIdx.x / unsigned(tiles_per_slice), tile = blockIdx.x % unsigned(tiles_per_slice);
    return {slice, slice % heads, slice / heads, tile, tile * kRowsPerTile};
  }
  // One block per work tile, longest first within groups of group_slices slices (the launch's
  // blocks are slices x tiles_per_slice; the last group may have fewer slices).
  __device__ __forceinline__ WorkTile longest_first(int group_slices) const {
    const int slices = int(gridDim.x) / tiles_per_slice, index = int(blockIdx.x);
    const int group_size = group_slices * tiles_per_slice, first_slice = index / group_size * group_slices;
    const int slices_here = min(group_slices, slices - first_slice), in_group = index % group_size;
    const int slice = first_slice + in_group % slices_here, tile = in_group / slices_here;
    return {slice, slice % heads, slice / heads, tile, tile * kRowsPerTile};
  }
};

// The persistent walk: for (int index = first(); index < work_tiles; index = next(index)),
// the work tile at(index).
template <int kRowsPerTile, bool kCausalWalk = false>
struct PersistentScheduler : TileScheduler<kRowsPerTile> {
  int work_tiles;
  bool longest_first;  // a causal walk's order: the longest row tiles of all slices first

  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int next(int index) const { return index + int(gridDim.x); }
  __device__ __forceinline__ WorkTile at(int index) const { return walk(index, int(gridDim.x)); }
  // The work tile at `index` of a launch of `blocks` blocks (on the host too, for the tests).
  __host__ __device__ __forceinline__ WorkTile walk(int index, int blocks) const {
    if (!kCausalWalk) return TileScheduler<kRowsPerTile>::at(index);
    const int round_start = index / blocks * blocks;
    const bool whole_round = round_start + blocks <= work_tiles;  // the last may be partial
    if ((index / blocks) % 2 == 1 && whole_round) index = round_start + blocks - 1 - (index - round_start);
    if (!longest_first) return TileScheduler<kRowsPerTile>::at(index);
    const int slices = work_tiles / this->tiles_per_slice;
    const int slice = index % slices, tile = this->tiles_per_slice - 1 - index / slices;
    return {slice, slice % this->heads, slice / this->heads, tile, tile * kRowsPerTile};
  }
};

// The walk over packed sequences (step.hpp's PackedSequences): work tile `index` is row tile t of
// head h of sequence s, the work tiles of s being those of its h, then t, in order. Sequence s's
// tiles begin at index heads * (cu_seqlens[s] / kRows + s): a sequence of n rows starting anywhere
// gets ceil(n / kRows) or one more row tiles of indices, so they are found from the prefix sums
// alone (a binary search, no table to build), and at most one tile a (sequence, head) lies past
// its end: at(index) gives it row0 >= its length, and the kernels skip it. The launch has
// heads * (total / kRows + sequences) work tiles. Persistent: block b takes b, b + gridDim.x, ...
template <int kRowsPerTile>
struct PackedScheduler {
  const int32_t* cu_seqlens;  // [sequences + 1], on the device (on the host for the tests)
  int sequences, heads;
  int work_tiles;

  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int next(int index) const { return index + int(gridDim.x); }
  __host__ __device__ __forceinline__ int start(int sequence) const {  // its first row tile index, per head
    return load(sequence) / kRowsPerTile + sequence;
  }
  __host__ __device__ __forceinline__ WorkTile at(int index) const {
    int low = 0, high = sequences - 1;  // the last sequence whose tiles begin at or before index
    while (low < high) {
      const int middle = (low + high + 1) / 2;
      if (heads * start(middle) <= index) low = middle; else high = middle - 1;
    }
    const int sequence = low, first = heads * start(sequence);
    const int tiles = start(sequence + 1) - start(sequence);  // its row tiles, per head
    const int local = index - first, head = local / tiles, tile = local % tiles;
    return {sequence * heads + head, head, sequence, tile, tile * kRowsPerTile};
  }

 private:
  __host__ __device__ __forceinline__ int load(int i) const {
#ifdef __CUDA_ARCH__
    return __ldg(cu_seqlens + i);
#else
    return cu_seqlens[i];
#endif
  }
};

}  // namespace policies
