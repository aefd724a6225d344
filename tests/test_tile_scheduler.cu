// The persistent walk of steps/policies/tile_scheduler.cuh, on the host: every work tile taken
// exactly once by some block, in each of the walks step 8 launches (slice by slice; causal, with
// and without longest_first), including a last round that does not fill the blocks; and the
// balance of the causal walks counted in K/V visits with the mask policy itself, the figures
// chapter 20 quotes from scripts/causal_walk.py; and the walk over packed sequences (every row
// tile of every sequence once, in order, found from the prefix sums alone).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "policies/mask.cuh"
#include "policies/tile_scheduler.cuh"

namespace {

constexpr int kRows = 128;  // the walk's rows a tile only scale row0

template <bool kCausalWalk>
policies::PersistentScheduler<kRows, kCausalWalk> make_order(int row_tiles, int heads, int batch,
                                                             bool longest_first) {
  return {{row_tiles, heads}, row_tiles * heads * batch, longest_first};
}

// (slice, tile) of every index a block walks (first(), next(): block b takes b, b + blocks, ...).
template <bool kCausalWalk>
std::vector<std::vector<std::pair<int, int>>> walks(const policies::PersistentScheduler<kRows, kCausalWalk>& order,
                                                    int blocks) {
  std::vector<std::vector<std::pair<int, int>>> taken(blocks);
  for (int block = 0; block < blocks; ++block) {
    for (int index = block; index < order.work_tiles; index += blocks) {
      const policies::WorkTile tile = order.walk(index, blocks);
      CHECK(tile.slice == tile.batch * order.heads + tile.head);
      CHECK(tile.row0 == tile.tile * kRows);
      taken[block].push_back({tile.slice, tile.tile});
    }
  }
  return taken;
}

template <bool kCausalWalk>
void check_permutation(int row_tiles, int heads, int batch, int blocks, bool longest_first) {
  CAPTURE(row_tiles);
  CAPTURE(heads);
  CAPTURE(batch);
  CAPTURE(blocks);
  CAPTURE(longest_first);
  const auto order = make_order<kCausalWalk>(row_tiles, heads, batch, longest_first);
  std::set<std::pair<int, int>> seen;
  int count = 0;
  for (const auto& block : walks(order, blocks)) {
    for (const auto& tile : block) {
      CHECK(tile.first >= 0);
      CHECK(tile.first < heads * batch);
      CHECK(tile.second >= 0);
      CHECK(tile.second < row_tiles);
      seen.insert(tile);
      ++count;
    }
  }
  CHECK(count == row_tiles * heads * batch);
  CHECK(seen.size() == std::size_t(count));  // none taken twice, so every one taken
}

// The busiest block's K/V visits over the mean, under the causal mask (diagonal 0, N_k = N).
double busiest_over_mean(int tokens, int heads, int batch, int block_n, bool longest_first) {
  const int row_tiles = (tokens + kRows - 1) / kRows, blocks = 132;
  const policies::Mask<true> mask{tokens, 0};
  const auto order = make_order<true>(row_tiles, heads, batch, longest_first);
  std::vector<int> visits;
  for (const auto& block : walks(order, blocks)) {
    int sum = 0;
    for (const auto& tile : block) sum += mask.kv_tiles(tile.second * kRows, kRows, block_n);
    visits.push_back(sum);
  }
  const double mean = std::accumulate(visits.begin(), visits.end(), 0.0) / blocks;
  return *std::max_element(visits.begin(), visits.end()) / mean;
}

}  // namespace

TEST_SUITE("tile_scheduler") {
  TEST_CASE("every walk takes every work tile once, partial last rounds included") {
    for (int row_tiles : {1, 2, 5, 33, 128}) {
      for (int heads : {1, 3, 16}) {
        for (int batch : {1, 2, 8}) {
          for (int blocks : {1, 4, 7, 132}) {
            check_permutation<false>(row_tiles, heads, batch, blocks, false);
            check_permutation<true>(row_tiles, heads, batch, blocks, false);
            check_permutation<true>(row_tiles, heads, batch, blocks, true);
          }
        }
      }
    }
  }

  TEST_CASE("longest first takes every slice's bottom row tile in the first round") {
    const auto order = make_order<true>(128, 16, 1, true);
    for (int index = 0; index < 16; ++index) CHECK(order.walk(index, 132).tile == 127);
    CHECK(order.walk(order.work_tiles - 1, 132).tile == 0);  // the last round is partial: not reversed
  }

  TEST_CASE("the causal walks' balance at (1, 16, 16384, 128), 160-key tiles: chapter 20's count") {
    CHECK(busiest_over_mean(16384, 16, 1, 160, false) == doctest::Approx(1.543).epsilon(0.001));
    CHECK(busiest_over_mean(16384, 16, 1, 160, true) == doctest::Approx(1.008).epsilon(0.001));
  }

  TEST_CASE("the packed walk takes every row tile of every sequence and head once, and little else") {
    const std::vector<std::vector<int32_t>> mixes = {
        {197, 577, 50}, {1}, {0}, {0, 5, 0, 130, 0}, {128, 128, 127, 129, 256, 1},
        {4097, 197, 197, 1025, 2305, 577}, std::vector<int32_t>(100, 65)};
    for (const std::vector<int32_t>& lengths : mixes) {
      for (int heads : {1, 3, 16}) {
        CAPTURE(lengths.size());
        CAPTURE(heads);
        std::vector<int32_t> sums{0};
        for (int32_t length : lengths) sums.push_back(sums.back() + length);
        const int sequences = int(lengths.size());
        const policies::PackedScheduler<kRows> order{sums.data(), sequences, heads,
                                                     heads * (sums.back() / kRows + sequences)};
        std::set<std::pair<int, int>> seen;  // (slice, tile) of the tiles that exist
        int empty = 0;
        for (int index = 0; index < order.work_tiles; ++index) {
          const policies::WorkTile tile = order.at(index);
          REQUIRE(tile.batch >= 0);
          REQUIRE(tile.batch < sequences);
          CHECK(tile.slice == tile.batch * heads + tile.head);
          CHECK(tile.row0 == tile.tile * kRows);
          if (tile.row0 >= lengths[std::size_t(tile.batch)]) {
            ++empty;  // past its sequence's end: skipped by the kernels
            continue;
          }
          CHECK(seen.insert({tile.slice, tile.tile}).second);  // never twice
          if (index > 0) {  // in order: sequence by sequence, head by head, row tile by row tile
            const policies::WorkTile before = order.at(index - 1);
            CHECK(std::make_tuple(before.batch, before.head, before.tile) <
                  std::make_tuple(tile.batch, tile.head, tile.tile));
          }
        }
        int expected = 0;
        for (int32_t length : lengths) expected += heads * ((length + kRows - 1) / kRows);
        CHECK(int(seen.size()) == expected);  // every one taken
        CHECK(empty <= heads * sequences);    // at most one extra a (sequence, head)
      }
    }
  }
}
