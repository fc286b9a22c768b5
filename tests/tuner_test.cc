#include <gtest/gtest.h>

#include "core/base/error.h"
#include "core/collectives/tuner.h"

namespace railshard::collectives {
namespace {

TunerInput input(size_t bytes, int n, bool shm) {
  TunerInput in;
  in.bytes = bytes;
  in.world_size = n;
  in.shm = shm;
  in.shm_slot_bytes = shm ? (size_t{1} << 20) : 0;
  return in;
}

TEST(Tuner, SharedMemoryPicksDirectForSmallAndReduceScatterGatherForLarge) {
  EXPECT_EQ(chooseAllreduce(input(8, 2, true), "auto").algorithm, Algorithm::kShmDirect);
  EXPECT_EQ(chooseAllreduce(input(8, 8, true), "auto").algorithm, Algorithm::kShmDirect);
  EXPECT_EQ(chooseAllreduce(input(64 << 20, 2, true), "auto").algorithm,
            Algorithm::kShmReduceScatterGather);
  EXPECT_EQ(chooseAllreduce(input(512 << 10, 4, true), "auto").algorithm,
            Algorithm::kShmReduceScatterGather);
}

TEST(Tuner, TcpPicksRecursiveDoublingForSmallAndRingForLarge) {
  EXPECT_EQ(chooseAllreduce(input(8, 8, false), "auto").algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseAllreduce(input(8, 5, false), "auto").algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseAllreduce(input(64 << 20, 8, false), "auto").algorithm, Algorithm::kRing);
  // Two ranks: one round of recursive doubling against two ring steps, but the ring hides the
  // reduction behind the transfer; measured on the two-rail test bed at 64 MiB, ring 293 ms
  // against recursive doubling 326-373 ms (docs/multirail.md).
  EXPECT_EQ(chooseAllreduce(input(8, 2, false), "auto").algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseAllreduce(input(64 << 20, 2, false), "auto").algorithm, Algorithm::kRing);
  // Crossover is monotone: once ring wins it keeps winning as messages grow.
  bool ring = false;
  for (size_t bytes = 8; bytes <= (size_t{1} << 28); bytes *= 2) {
    const bool now = chooseAllreduce(input(bytes, 4, false), "auto").algorithm == Algorithm::kRing;
    EXPECT_FALSE(ring && !now) << bytes;
    ring = ring || now;
  }
  EXPECT_TRUE(ring);
}

TEST(Tuner, ModelMatchesHandWorkedRingEstimate) {
  // ring, n=4, 1 MB over tcp (alpha 30 us, beta 1.5 GB/s):
  // 2(n-1) * (30 + 250000 B / 1500 B/us) = 6 * (30 + 166.67) = 1180 us
  EXPECT_NEAR(estimateMicros(Algorithm::kRing, input(1000000, 4, false)), 1180.0, 0.1);
}

TEST(Tuner, OverrideIsHonouredAndValidated) {
  EXPECT_EQ(chooseAllreduce(input(64 << 20, 4, false), "recursive_doubling").algorithm,
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseAllreduce(input(8, 4, true), "shm_rsag").algorithm,
            Algorithm::kShmReduceScatterGather);
  // shm_direct cannot take more than one slot: falls back to shm_rsag.
  EXPECT_EQ(chooseAllreduce(input(4 << 20, 4, true), "shm_direct").algorithm,
            Algorithm::kShmReduceScatterGather);
  EXPECT_THROW(chooseAllreduce(input(8, 4, false), "shm_direct"), ConfigError);
  try {
    chooseAllreduce(input(8, 4, false), "butterfly");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("butterfly"), std::string::npos);
  }
}

}  // namespace
}  // namespace railshard::collectives
