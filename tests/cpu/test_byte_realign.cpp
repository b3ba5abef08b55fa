// The columnwise run stores of quantize_tile.cuh (numerics/byte_realign.hpp): qnum::realign_bytes
// against a plain byte copy for every shift and both chunk sizes, and a column's 8 lanes storing
// a run for every misalignment and length.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "numerics/byte_realign.hpp"

namespace groupmm::test {
namespace {

template <int N>
void check_all_shifts(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 64; ++trial) {
    uint32_t own[N], next[N], out[N];
    uint8_t bytes[8 * N];
    for (int i = 0; i < N; ++i) {
      own[i] = static_cast<uint32_t>(rng());
      next[i] = static_cast<uint32_t>(rng());
    }
    for (int i = 0; i < N; ++i)
      for (int k = 0; k < 4; ++k) {
        bytes[4 * i + k] = static_cast<uint8_t>(own[i] >> (8 * k));
        bytes[4 * N + 4 * i + k] = static_cast<uint8_t>(next[i] >> (8 * k));
      }
    for (int b = 0; b < 4 * N; ++b) {
      std::memset(out, 0xA5, sizeof(out));
      qnum::realign_bytes<N>(own, next, b, out);
      for (int k = 0; k < 4 * N; ++k)
        ASSERT_EQ(static_cast<uint8_t>(out[k / 4] >> (8 * (k % 4))), bytes[b + k])
            << "N=" << N << " b=" << b << " byte " << k;
    }
  }
}

TEST(ByteRealign, SixteenByteRunsEveryShift) {
  check_all_shifts<4>(1);
}
TEST(ByteRealign, EightByteRunsEveryShift) {
  check_all_shifts<2>(2);
}

// The 8 lanes of one column, as quantize_tile.cuh's store_col_run runs them: lane rg holds the
// run's bytes [4N rg, 4N rg + 4N) (past len: whatever the lane computed, here garbage), its
// realigned chunk takes lane rg + 1's words (lane 7 gets its own, as __shfl_down_sync past the
// warp does), and the edges read lane 0's own words and the tail lane's chunk (the shuffles). For
// every misalignment of the run and every length, the bytes [0, len) are the run and nothing
// around it is touched.
template <int N, bool kAligned>
void check_column_runs(uint64_t seed) {
  constexpr int kB = 4 * N, kLanes = 8, kMax = kB * kLanes;
  std::mt19937_64 rng(seed);
  alignas(64) uint8_t buf[kMax + 3 * kB];
  for (int mis = 0; mis < (kAligned ? 1 : kB); ++mis)
    for (int len = 1; len <= kMax; ++len) {
      uint8_t want[kMax];
      for (int i = 0; i < kMax; ++i) want[i] = static_cast<uint8_t>(rng());
      uint32_t lane[kLanes][N];
      for (int r = 0; r < kLanes; ++r)
        for (int j = 0; j < N; ++j) {
          uint32_t w = 0;
          for (int k = 0; k < 4; ++k) {
            const int off = kB * r + 4 * j + k;
            const uint8_t v = off < len ? want[off] : static_cast<uint8_t>(rng());
            w |= uint32_t(v) << (8 * k);
          }
          lane[r][j] = w;
        }
      std::memset(buf, 0xEE, sizeof(buf));
      uint8_t* const run = buf + kB + mis;  // kB-aligned + mis
      const int b = kAligned ? 0 : qnum::col_run_head<N>(run);
      ASSERT_EQ(b, (kB - mis) % kB);
      uint32_t chunk[kLanes][N];
      for (int r = 0; r < kLanes; ++r) {
        if (kAligned) {
          std::memcpy(chunk[r], lane[r], sizeof(chunk[r]));
        } else {
          qnum::realign_bytes<N>(lane[r], lane[r + 1 < kLanes ? r + 1 : r], b, chunk[r]);
        }
        qnum::store_col_run_chunk<N>(run, len, r, b, chunk[r]);
      }
      const int t = qnum::col_run_tail_lane<N>(len, b);
      for (int r = 0; r < kLanes; ++r)
        qnum::store_col_run_edges<N, kAligned>(run, len, r, b, lane[0], chunk[t]);
      for (int i = 0; i < int(sizeof(buf)); ++i) {
        const int off = i - (kB + mis);
        const uint8_t expect = off >= 0 && off < len ? want[off] : uint8_t(0xEE);
        ASSERT_EQ(buf[i], expect) << "N=" << N << " misaligned by " << mis << " len " << len
                                  << " offset " << off;
      }
    }
}

TEST(ByteRealign, ColumnRunsFp8EveryMisalignmentAndLength) {
  check_column_runs<4, false>(3);
  check_column_runs<4, true>(4);
}
TEST(ByteRealign, ColumnRunsFp4EveryMisalignmentAndLength) {
  check_column_runs<2, false>(5);
  check_column_runs<2, true>(6);
}

}  // namespace
}  // namespace groupmm::test
