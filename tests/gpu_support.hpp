// Shared by the GPU suite: the step chosen with --step=ID on the command line, and the limits of
// the GPU it runs on (what the harness judges refusals against).
#pragma once

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "step.hpp"

const attn::StepInfo& step_under_test();
const attn::DeviceLimits& device_under_test();

// N = k x tile and k x tile +- 1 (k = 1, 2, 3) for each tile, every size once, ascending.
inline std::vector<int64_t> sizes_around(const std::vector<int>& tiles) {
  std::set<int64_t> sizes;
  for (int tile : tiles) {
    for (int k = 1; k <= 3; ++k) {
      for (int offset = -1; offset <= 1; ++offset) {
        if (k * tile + offset >= 1) sizes.insert(int64_t(k) * tile + offset);
      }
    }
  }
  return {sizes.begin(), sizes.end()};
}

// The sizes of a large-score test: a few keys (N = 1, 2, 3, 5, 17: a row's L is then often far
// below 0) and one short of and past each tile.
inline std::vector<int64_t> few_keys_and_tile_edges(const attn::TileSizes& tiles) {
  std::set<int64_t> sizes = {1, 2, 3, 5, 17};
  for (const std::vector<int>* along : {&tiles.rows, &tiles.keys}) {
    for (int tile : *along) {
      if (tile > 1) sizes.insert(tile - 1);
      sizes.insert(tile + 1);
    }
  }
  return {sizes.begin(), sizes.end()};
}

// Every tile of a head dim, rows and keys together.
inline std::vector<int> all_tiles(const attn::TileSizes& tiles) {
  std::vector<int> all = tiles.rows;
  all.insert(all.end(), tiles.keys.begin(), tiles.keys.end());
  return all;
}

// Packed sequences of these lengths (self-attention, H = 3): the batch is their count, N the longest.
inline attn::Shape packed_shape(std::vector<int64_t> lengths, int64_t head_dim,
                                attn::Causal causal = attn::Causal::none,
                                attn::DType dtype = attn::DType::fp16) {
  attn::Shape shape{int64_t(lengths.size()), 3, *std::max_element(lengths.begin(), lengths.end()),
                    head_dim, dtype};
  shape.lengths = std::move(lengths);
  shape.causal = causal;
  return shape;
}

// The mixes of lengths a packed test runs: every length around every tile up to `longest` (a
// sequence ending one row short of, at, and past a tile), each between sequences of one token;
// ViT sizes; one long and many short; empty sequences among them; one token alone.
inline std::vector<std::vector<int64_t>> packed_length_mixes(const attn::TileSizes& tiles, int64_t longest) {
  std::vector<int64_t> around = {1};
  for (int64_t tokens : sizes_around(all_tiles(tiles))) {
    if (tokens <= longest) around.insert(around.end(), {tokens, 1});
  }
  return {around, {197, 577, 50}, {1025, 1, 2, 17, 65, 3}, {0, 5, 0, 130, 0}, {1}};
}
