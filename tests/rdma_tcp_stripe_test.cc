// RDMA lanes and TCP connections striped together (RAILSHARD_STRIPE_TCP=1): the TCP transport's
// connections are one more rail of the RDMA transport's scheduler, their pieces land in the
// same MessageBook as the lanes'. Over the libibverbs emulation (two HCAs, threads as ranks,
// loopback TCP): results against a scalar reference, bytes counted on every rail of both
// kinds, a mismatch caught before a byte lands, and the last RDMA lane failing mid-run with
// TCP taking everything over. This runs our protocol, not hardware (docs/rdma.md).
#include <gtest/gtest.h>

#ifdef FAKE_IBVERBS_PATH

#include <infiniband/verbs.h>

#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/over_emulation.h"
#include "transport/transport.h"

namespace railshard {
namespace {

Config stripedConfig() {
  Config config = rdmaConfig();
  config.links.stripe_tcp = true;
  // Static weights: the HCAs say 100 Gbit/s, TCP says nothing (loopback, no rails), so it
  // starts at their mean: a striped message is split in thirds (adaptive weights would follow
  // the emulation's memcpy timings).
  config.links.weights = RailWeights::kStatic;
  config.chunk_bytes = 1 << 20;  // pieces above the scheduler's 64 KiB small-message limit
  return config;
}

using StripedOverTcpToo = OverEmulation;

TEST_F(StripedOverTcpToo, CollectivesMatchAScalarReferenceWithBytesOnEveryRailOfBothKinds) {
  constexpr int kSize = 3;
  const uint64_t before0 = hooks_.bytes_written("fake0");
  const uint64_t before1 = hooks_.bytes_written("fake1");
  const std::vector<size_t> counts = {0, 1, 100, 2049, 65536, 1 << 20, (1 << 20) + 13};
  std::vector<uint64_t> tcp_bytes(kSize, 0);
  test::rethrowFirst(withRanks(kSize, stripedConfig(), [&](Communicator& comm) {
    ASSERT_EQ(comm.transport().name(), "ibverbs");
    const int rank = comm.rank();
    checkAllreducesAndBroadcast(comm, counts, 2);
    if (::testing::Test::HasFatalFailure()) return;
    comm.barrier();
    // Per peer: both lanes and the TCP rail, all up, each with a third of a large message.
    std::map<int, int> rails_per_peer;
    for (const auto& rail : comm.transport().rails()) {
      EXPECT_TRUE(rail.up) << rail.name;
      EXPECT_TRUE(rail.name == "fake0:1" || rail.name == "fake1:1" || rail.name == "tcp")
          << rail.name;
      EXPECT_NEAR(rail.fraction, 1.0 / 3, 1e-9) << rail.name;
      if (rail.name == "tcp") tcp_bytes[static_cast<size_t>(rank)] += rail.bytes_sent;
      ++rails_per_peer[rail.peer];
    }
    EXPECT_EQ(rails_per_peer.size(), static_cast<size_t>(kSize - 1));
    for (const auto& [peer, rails] : rails_per_peer) EXPECT_EQ(rails, 3) << "peer " << peer;
    // No rank closes (its queue pairs gone: our last credit write to it fails, the lane goes
    // down) before every rank has looked. A CI run failed on that race.
    comm.barrier();
  }));
  // The 4 MB all-reduces and the 2.4 MB broadcast went over all three rails.
  EXPECT_GT(hooks_.bytes_written("fake0") - before0, 1u << 20);
  EXPECT_GT(hooks_.bytes_written("fake1") - before1, 1u << 20);
  uint64_t tcp_total = 0;
  for (uint64_t b : tcp_bytes) tcp_total += b;
  EXPECT_GT(tcp_total, 1u << 20);
}

TEST_F(StripedOverTcpToo, AdaptiveWeightsReEstimateTheTcpRailAndResultsStayExact) {
  // The TCP rail's estimate comes from its sends' times (posting to written), the lanes' from
  // their completions: whatever they measure here, every rail keeps a share and every
  // result is exact.
  Config config = stripedConfig();
  config.links.weights = RailWeights::kAdaptive;
  std::vector<double> tcp_gbps(2, 0);
  test::rethrowFirst(withRanks(2, config, [&](Communicator& comm) {
    const int rank = comm.rank();
    for (int iteration = 0; iteration < 20; ++iteration) {
      std::vector<float> data(600000);
      for (size_t i = 0; i < data.size(); ++i) data[i] = input(rank, i) - iteration;
      comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < data.size(); i += 5) {
        ASSERT_NEAR(data[i], input(0, i) + input(1, i) - 2.0f * iteration, 1e-3)
            << "iteration " << iteration << " element " << i;
      }
    }
    for (const auto& rail : comm.transport().rails()) {
      EXPECT_TRUE(rail.up) << rail.name;
      EXPECT_GE(rail.fraction, 0.05 - 1e-9) << rail.name;  // the scheduler's minimum share
      if (rail.name == "tcp") tcp_gbps[static_cast<size_t>(rank)] = rail.gbps;
    }
    comm.barrier();  // no rank closes before every rank has looked (as above)
  }));
  // Measured, not the starting 100 Gbit/s (the lanes' mean; no loopback runs at that rate).
  for (double gbps : tcp_gbps) {
    EXPECT_GT(gbps, 0);
    EXPECT_LT(gbps, 100);
  }
}

// Every queue pair of this process into the error state: both lanes of the pair fail.
void breakEveryQueuePair(const FakeHooks& hooks) {
  int broken = 0;
  for (uint32_t qpn = 1; qpn < 100000 && broken < 4; ++qpn) {
    if (hooks.break_qp(qpn, IBV_WC_RETRY_EXC_ERR) == 0) ++broken;
  }
  EXPECT_EQ(broken, 4) << "2 ranks x 2 lanes";
}

TEST_F(StripedOverTcpToo, AMismatchOverTheTcpRailIsMismatchErrorOnEveryRank) {
  // Every lane broken first, so that everything after goes over TCP: the mismatched
  // all-reduce meets the book through the TCP transport's pieces.
  const auto errors = withRanks(2, stripedConfig(), [&](Communicator& comm) {
    std::vector<float> data(600000, 1.0f);
    comm.barrier();
    if (comm.rank() == 1) breakEveryQueuePair(hooks_);
    comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(data[12345], 2.0f);
    for (const auto& rail : comm.transport().rails()) {
      if (rail.name != "tcp") {
        EXPECT_FALSE(rail.up) << rail.name;
      }
    }
    comm.allreduce(data.data(), data.size(), DataType::kFloat32,
                   comm.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax);
  });
  expectMismatchOnEveryRank(errors);
}

TEST_F(StripedOverTcpToo, WhenEveryLaneFailsTcpCarriesEverythingAndResultsStayExact) {
  constexpr int kSize = 2;
  std::vector<std::string> lanes_down(kSize);
  std::vector<uint64_t> tcp_after(kSize, 0);
  test::rethrowFirst(withRanks(kSize, stripedConfig(), [&](Communicator& comm) {
    const int rank = comm.rank();
    uint64_t tcp_at_break = 0;
    for (int iteration = 0; iteration < 30; ++iteration) {
      checkTwoRankAllreduce(comm, iteration);
      if (::testing::Test::HasFatalFailure()) return;
      if (iteration == 5) {
        comm.barrier();
        if (rank == 1) breakEveryQueuePair(hooks_);
        for (const auto& rail : comm.transport().rails()) {
          if (rail.name == "tcp") tcp_at_break = rail.bytes_sent;
        }
      }
    }
    int down = 0;
    for (const auto& rail : comm.transport().rails()) {
      if (rail.name == "tcp") {
        EXPECT_TRUE(rail.up);
        EXPECT_NEAR(rail.fraction, 1.0, 1e-9);
        tcp_after[static_cast<size_t>(rank)] = rail.bytes_sent - tcp_at_break;
      } else if (!rail.up) {
        ++down;
        lanes_down[static_cast<size_t>(rank)] += rail.name + ": " + rail.down_reason + "; ";
      }
    }
    EXPECT_EQ(down, 2) << "rank " << rank << ": " << lanes_down[static_cast<size_t>(rank)];
  }));
  for (int r = 0; r < kSize; ++r) {
    EXPECT_NE(lanes_down[static_cast<size_t>(r)].find("RDMA rail fake"), std::string::npos)
        << "rank " << r << ": " << lanes_down[static_cast<size_t>(r)];
    // 24 all-reduces of 2.4 MB after the break, each sending about half of it: all over TCP.
    EXPECT_GT(tcp_after[static_cast<size_t>(r)], uint64_t{24} << 20) << "rank " << r;
  }
}

}  // namespace
}  // namespace railshard

#else
TEST(StripedOverTcpToo, NotBuilt) {
  GTEST_SKIP() << "built without infiniband/verbs.h: no RDMA transport and no emulation";
}
#endif
