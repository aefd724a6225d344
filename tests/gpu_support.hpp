// Shared by the GPU suite: the step chosen with --step=ID on the command line, and the limits of
// the GPU it runs on (what the harness judges refusals against).
#pragma once

#include <algorithm>
#include <set>
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
