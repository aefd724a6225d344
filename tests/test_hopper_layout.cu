// The swizzled tile layout of steps/hopper/layout.cuh, for every swizzle width, against the rule
// the copy engine and the tensor cores apply to shared-memory addresses: bits 4.. of a byte
// offset are XORed with bits 7.., as many bits as a row has 16-byte chunks to choose from. The
// steps use the 128-byte swizzle; head dims that are not multiples of 64 will need the others.
#include <doctest/doctest.h>

#include <set>

#include "hopper/layout.cuh"

namespace {

template <hopper::Swizzle kSwizzle>
void check_layout() {
  constexpr int kBytes = hopper::row_bytes(kSwizzle), kColumns = hopper::row_columns(kSwizzle);
  constexpr int kChunkBits = kBytes == 128 ? 3 : kBytes == 64 ? 2 : 1;
  constexpr int kRows = 24, kBlocks = 2;  // 24 rows: three 8-row groups; two column blocks
  std::set<uint32_t> offsets;
  for (int row = 0; row < kRows; ++row) {
    for (int column = 0; column < kBlocks * kColumns; ++column) {
      const uint32_t offset = hopper::swizzled_offset<kSwizzle>(row, column, kRows);
      const uint32_t linear = uint32_t((column / kColumns) * kRows * kBytes + row * kBytes +
                                       (column % kColumns) * 2);
      CAPTURE(row);
      CAPTURE(column);
      CHECK(offset == (linear ^ (((linear >> 7) & ((1u << kChunkBits) - 1)) << 4)));
      CHECK(offset / kBytes == linear / kBytes);  // a row stays in its own kBytes
      offsets.insert(offset);
    }
  }
  CHECK(offsets.size() == std::size_t(kRows * kBlocks * kColumns));  // no two elements collide
  CHECK(*offsets.rbegin() == uint32_t(kRows * kBlocks * kBytes - 2));
}

}  // namespace

TEST_SUITE("hopper_layout") {
  TEST_CASE("128-byte swizzle: chunk c of row r at c ^ (r % 8)") {
    check_layout<hopper::Swizzle::bytes128>();
    CHECK(hopper::swizzled_offset<hopper::Swizzle::bytes128>(3, 8, 64) == 3 * 128 + (1 ^ 3) * 16);
  }
  TEST_CASE("64-byte swizzle: chunk c of row r at c ^ ((r / 2) % 4)") {
    check_layout<hopper::Swizzle::bytes64>();
    CHECK(hopper::swizzled_offset<hopper::Swizzle::bytes64>(5, 8, 64) == 5 * 64 + (1 ^ 2) * 16);
  }
  TEST_CASE("32-byte swizzle: chunk c of row r at c ^ ((r / 4) % 2)") {
    check_layout<hopper::Swizzle::bytes32>();
    CHECK(hopper::swizzled_offset<hopper::Swizzle::bytes32>(4, 0, 64) == 4 * 32 + 16);
  }
  TEST_CASE("the widths and the tensor map's names agree") {
    CHECK(hopper::row_columns(hopper::Swizzle::bytes128) == 64);
    CHECK(hopper::row_columns(hopper::Swizzle::bytes64) == 32);
    CHECK(hopper::row_columns(hopper::Swizzle::bytes32) == 16);
    CHECK(hopper::tensor_map_swizzle(hopper::Swizzle::bytes64) == CU_TENSOR_MAP_SWIZZLE_64B);
  }
}
