#include <gtest/gtest.h>

#include "base/error.h"
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

// Two hosts x two ranks over a 1.25 Gbit/s pair of rails (the test bed's 1 Gbit + 250 Mbit).
TunerInput hosts(size_t bytes, int host_count, int per_host) {
  TunerInput in = input(bytes, host_count * per_host, false);
  in.hosts = host_count;
  in.ranks_per_host = per_host;
  in.host_shm = true;
  in.shm_slot_bytes = size_t{1} << 20;
  in.network = {30.0, 1.25 / 8};
  return in;
}

TEST(Tuner, SeveralRanksPerHostPickTwoLevelDirectForSmallAndTwoLevelForLarge) {
  EXPECT_EQ(chooseAllreduce(hosts(8, 2, 2), "auto").algorithm, Algorithm::kTwoLevelDirect);
  EXPECT_EQ(chooseAllreduce(hosts(8, 4, 8), "auto").algorithm, Algorithm::kTwoLevelDirect);
  EXPECT_EQ(chooseAllreduce(hosts(64 << 20, 2, 2), "auto").algorithm, Algorithm::kTwoLevel);
  EXPECT_EQ(chooseAllreduce(hosts(64 << 20, 3, 2), "auto").algorithm, Algorithm::kTwoLevel);
  // The flat ring over 4 ranks pushes 1.5x the two-level's bytes through each host's link;
  // the two-level's ~4 passes over memory (at 8 GB/s) overlap the rails in 8 chunks.
  const double ring = estimateMicros(Algorithm::kRing, hosts(64 << 20, 2, 2));
  const double two = estimateMicros(Algorithm::kTwoLevel, hosts(64 << 20, 2, 2));
  EXPECT_NEAR(ring, 6 * (30 + (16 << 20) / 156.25), 1.0);
  const double in_host = 64 * 4 + (64 << 20) * 4 / 8000.0;
  const double across = 2 * 30 * 8 + (64 << 20) / 156.25;
  EXPECT_NEAR(two, across + (in_host + across) / 8, 1.0);
  // Without per-host segments (RAILSHARD_TRANSPORT=tcp) neither applies.
  TunerInput flat = hosts(64 << 20, 2, 2);
  flat.host_shm = false;
  EXPECT_EQ(chooseAllreduce(flat, "auto").algorithm, Algorithm::kRing);
  EXPECT_THROW(chooseAllreduce(flat, "two_level"), ConfigError);
  EXPECT_THROW(chooseAllreduce(flat, "two_level_direct"), ConfigError);
  // Forced direct falls back above one slot.
  EXPECT_EQ(chooseAllreduce(hosts(4 << 20, 2, 2), "two_level_direct").algorithm,
            Algorithm::kTwoLevel);
}

// Hosts whose ranks outnumber their cores: the direct variant's L ranks crossing at once
// queue for the cores, so from a few ranks per core on only each host's leader crosses. With
// a core per rank (real servers) the direct variant stays: the leader's broadcast is one more
// hand-off for nothing.
TEST(Tuner, CrowdedHostsSendOneRankPerHostAcrossForSmallMessages) {
  TunerInput crowded = hosts(8, 16, 16);
  crowded.ranks_per_core = 8;  // 16 ranks on 2 cores
  EXPECT_EQ(chooseAllreduce(crowded, "auto").algorithm, Algorithm::kTwoLevelLeader);
  // Four rounds at 30 us: the direct variant's grow eightfold and carry 16 copies of the 8
  // bytes (at 156.25 B/us); the leader adds a hand-off (1 us) and two 8-byte copies (8 GB/s).
  const double direct = estimateMicros(Algorithm::kTwoLevelDirect, crowded);
  const double leader = estimateMicros(Algorithm::kTwoLevelLeader, crowded);
  EXPECT_NEAR(direct - leader, 4 * 30 * 7 + 4 * (128 - 8) / 156.25 - 2 * 1.0 - 16 / 8000.0, 0.01);
  // Flat recursive doubling's rounds queue for the cores too: with a slow hand-off measured
  // (30 us) it still does not beat the leader variant (it did, by the bare α, and took 65-100
  // ms against the leader's 10 ms on 16 namespaced hosts x 16 ranks).
  TunerInput slow_hand_off = crowded;
  slow_hand_off.shm_link = {30.0, 8.0};
  EXPECT_EQ(chooseAllreduce(slow_hand_off, "auto").algorithm, Algorithm::kTwoLevelLeader);
  const double flat_rounds = estimateMicros(Algorithm::kRecursiveDoubling, slow_hand_off);
  EXPECT_NEAR(flat_rounds, 8 * (30 * 8 + 8 / 156.25) + 8 * 8 / 2000.0, 0.01);
  // The same hosts with a core per rank on a 100 Gbit/s network: the direct variant.
  TunerInput roomy = hosts(8, 16, 16);
  roomy.network = {5.0, 12.5};
  EXPECT_EQ(chooseAllreduce(roomy, "auto").algorithm, Algorithm::kTwoLevelDirect);
  TunerInput one_each = hosts(8, 4, 8);
  one_each.ranks_per_core = 1;
  EXPECT_EQ(chooseAllreduce(one_each, "auto").algorithm, Algorithm::kTwoLevelDirect);
  // Large messages keep the two-level ring; forced, the leader variant falls back above a slot.
  TunerInput large = hosts(64 << 20, 2, 2);
  large.ranks_per_core = 2;
  EXPECT_EQ(chooseAllreduce(large, "auto").algorithm, Algorithm::kTwoLevel);
  EXPECT_EQ(chooseAllreduce(hosts(4 << 20, 2, 2), "two_level_leader").algorithm,
            Algorithm::kTwoLevel);
  TunerInput flat = hosts(8, 2, 2);
  flat.host_shm = false;
  EXPECT_THROW(chooseAllreduce(flat, "two_level_leader"), ConfigError);
}

TEST(Tuner, NetworkFigureFromTheGraphReplacesTcpDefaults) {
  TunerInput slow = input(1 << 20, 2, false);
  slow.hosts = 2;
  slow.network = {30.0, 0.125};  // 1 Gbit/s
  const double at_default = estimateMicros(Algorithm::kRing, input(1 << 20, 2, false));
  const double at_1gbit = estimateMicros(Algorithm::kRing, slow);
  // 2 steps of 512 KiB: (30 + 524288/1500) * 2 vs (30 + 524288/125) * 2
  EXPECT_NEAR(at_default, 2 * (30 + 524288.0 / 1500), 0.1);
  EXPECT_NEAR(at_1gbit, 2 * (30 + 524288.0 / 125), 0.1);
}

// Measured figures (link_probe.h) replace the constants: shm_direct by hand with α 5 us and
// β 2 GB/s, 2 ranks, 64 KiB: 2 * 5 + 65536 * (1 + 2 + 1) / 2000 B/us = 141.07 us; recursive
// doubling's reduction term follows the measured kernel rate; half-measured shared memory (no
// α) keeps the constants.
TEST(Tuner, MeasuredSharedMemoryAndReductionRatesReplaceTheConstants) {
  TunerInput measured = input(64 << 10, 2, true);
  measured.shm_link = {5.0, 2.0};
  EXPECT_NEAR(estimateMicros(Algorithm::kShmDirect, measured), 10 + 65536.0 * 4 / 2000, 0.01);
  TunerInput half = input(64 << 10, 2, true);
  half.shm_link = {0, 2.0};
  EXPECT_DOUBLE_EQ(estimateMicros(Algorithm::kShmDirect, half),
                   estimateMicros(Algorithm::kShmDirect, input(64 << 10, 2, true)));
  // 2 ranks, 1 MB over tcp: one round, 30 + 1e6/1500 us, plus 1e6 B at the reduction rate.
  TunerInput fast_kernel = input(1000000, 2, false);
  fast_kernel.reduce_gbps = 10;
  EXPECT_NEAR(estimateMicros(Algorithm::kRecursiveDoubling, fast_kernel),
              30 + 1e6 / 1500 + 1e6 / 10000, 0.01);
  EXPECT_NEAR(estimateMicros(Algorithm::kRecursiveDoubling, input(1000000, 2, false)),
              30 + 1e6 / 1500 + 1e6 / 2000, 0.01);
}

}  // namespace
}  // namespace railshard::collectives
