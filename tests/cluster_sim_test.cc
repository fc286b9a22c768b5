// The simulator's engine on cases with closed forms (benchmarks/sim/): an idle machine
// reproduces the α-β cost of recursive doubling and the ring step by step, cores that ranks
// outnumber serialise their work, a NIC carries one message at a time, and the programs pair
// every send with a receive (a rank left waiting is an error, not a silent hang).
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "benchmarks/sim/sim_model.h"
#include "benchmarks/sim/sim_startup.h"

namespace railshard::sim {
namespace {

using collectives::Algorithm;

ClusterModel hostsOf(int hosts, int per_host) {
  ClusterModel m;
  m.ranks_per_host.assign(static_cast<size_t>(hosts), per_host);
  m.network = {10.0, 1.0};  // 10 us, 1 GB/s = 1000 bytes per us
  m.loopback = {20.0, 1.0};
  m.shm = {1.0, 4.0};
  m.reduce_gbps = 2.0;
  return m;
}

double run(const ClusterModel& m, Algorithm a, size_t bytes) {
  const auto layout = m.layout();
  return simulate(m, layout, allreducePrograms(a, m, layout, bytes)).micros;
}

TEST(ClusterSim, RecursiveDoublingOnIdleHostsIsRoundsTimesAlphaBeta) {
  // 8 hosts x 1 rank: 3 rounds of (10 us + 4000 B at 1000 B/us) and a 4000-byte reduction at
  // 2000 B/us each.
  EXPECT_NEAR(run(hostsOf(8, 1), Algorithm::kRecursiveDoubling, 4000), 3 * (10 + 4 + 2), 1e-9);
  // 6 hosts: ranks 1 and 3 fold into 0 and 2 (16 us), whose first round ends at 32; ranks 4
  // and 5 did theirs meanwhile and sent their second at 16, which reaches rank 0's NIC as
  // rank 2's first-round message is still arriving there (26-30 us): it lands at 34, rank 0
  // has reduced it by 36, and its result reaches rank 1 at 50.
  EXPECT_NEAR(run(hostsOf(6, 1), Algorithm::kRecursiveDoubling, 4000), 50, 1e-9);
}

TEST(ClusterSim, RingOnIdleHostsIsTwoNMinusOneSteps) {
  // 4 hosts: 6 steps of a 1000-byte segment (10 + 1 us), 3 of them reducing it (0.5 us).
  EXPECT_NEAR(run(hostsOf(4, 1), Algorithm::kRing, 4000), 6 * (10 + 1) + 3 * 0.5, 1e-9);
}

TEST(ClusterSim, RanksThatOutnumberTheCoresQueueForThem) {
  // One host of 4 ranks, shared memory: copy in (4000 B at 4000 B/us), meet, reduce 4 x 4000 B
  // (8 us). On 4 cores the ranks overlap: the first three find a later rank's flag not yet
  // posted and sleep, woken a hand-off (1 us) after it is. On 1 core their work runs one after
  // another (4 x 1 us of copies, 4 x 8 us of reductions) and the hand-offs hide under it.
  ClusterModel m = hostsOf(1, 4);
  EXPECT_NEAR(run(m, Algorithm::kShmDirect, 4000), 1 + 1 + 8, 1e-9);
  m.cores = 1;
  EXPECT_NEAR(run(m, Algorithm::kShmDirect, 4000), 4 * 1 + 4 * 8, 1e-9);
  // A wake-up costs CPU too: three of the four slept.
  m.wake_cpu_us = 0.5;
  EXPECT_NEAR(run(m, Algorithm::kShmDirect, 4000), 4 * 1 + 4 * 8 + 3 * 0.5, 1e-9);
  // And more where more ranks share each core: 4 ranks per core here, 0.25 us each.
  m.wake_per_crowding_us = 0.25;
  EXPECT_NEAR(run(m, Algorithm::kShmDirect, 4000), 4 * 1 + 4 * 8 + 3 * 1.5, 1e-9);
  // Looking at another rank's flag costs CPU as well, and reading its slot again (4000 bytes
  // do not travel in the flag's cache line): 0.1 us each for the 3 peers, after the slowest
  // rank's wake-up (4 cores again, free wake-ups). 8 bytes do, and skip the slots.
  m = hostsOf(1, 4);
  m.shm_peer_us = 0.1;
  EXPECT_NEAR(run(m, Algorithm::kShmDirect, 4000), 1 + 1 + 3 * 0.1 + 3 * 0.1 + 8, 1e-9);
  EXPECT_NEAR(run(m, Algorithm::kShmDirect, 8), 8 / 4000.0 + 1 + 3 * 0.1 + 4 * 8 / 2000.0, 1e-9);
}

TEST(ClusterSim, AWaitPollsYieldingTheCoreUntilItsSpinBudgetThenSleeps) {
  // Two ranks on one core meet; rank 1 first computes 10 us. Asleep, rank 0 is woken a
  // hand-off (0.25 us) after rank 1 posts at 11 (its first look, a 1 us poll, came first).
  ClusterModel m = hostsOf(1, 2);
  m.cores = 1;
  m.shm = {0.25, 4.0};
  const auto layout = m.layout();
  const std::vector<Program> programs{
      {{OpKind::kHostSync, -1, 0, 0}},
      {{OpKind::kCompute, -1, 0, 10}, {OpKind::kHostSync, -1, 0, 0}}};
  m.yield_us = 1;
  m.spin_us = 0.5;
  EXPECT_NEAR(simulate(m, layout, programs).micros, 1 + 10 + 0.25, 1e-9);
  // Polling on past the post: its next turn on the core comes after rank 1's computation.
  m.spin_us = 100;
  EXPECT_NEAR(simulate(m, layout, programs).micros, 1 + 10 + 1, 1e-9);
}

TEST(ClusterSim, AHostsNicSendsOneMessageAtATime) {
  // 2 hosts x 4 ranks, the direct variant: after the host sums, the 4 ranks of a host each
  // send the whole 4000 bytes across, one after another through the NIC (4 us each). The
  // host's last rank to post waited for nobody: its sum is done a hand-off sooner (9 us) and
  // goes first; the last message arrives 10 us after 9 + 4 x 4. The leader variant sends one.
  ClusterModel m = hostsOf(2, 4);
  EXPECT_NEAR(run(m, Algorithm::kTwoLevelDirect, 4000), 9 + 4 * 4 + 10 + 2, 1e-9);
  const double host_sum = 1 + 1 + 8;   // as above, a core per rank, for the leader
  const double broadcast = 1 + 1 + 1;  // the leader copies in, meet, everyone copies out
  EXPECT_NEAR(run(m, Algorithm::kTwoLevelLeader, 4000), host_sum + 10 + 4 + 2 + broadcast, 1e-9);
}

TEST(ClusterSim, PeersAcrossAreTheRanksAProgramExchangesWith) {
  ClusterModel m = hostsOf(4, 4);
  const auto layout = m.layout();
  const auto leader =
      simulate(m, layout, allreducePrograms(Algorithm::kTwoLevelLeader, m, layout, 8));
  EXPECT_EQ(leader.peers[0], (std::vector<int>{4, 8}));  // leaders 4 and 8: log2(4) rounds
  EXPECT_TRUE(leader.peers[1].empty());                  // not a leader: nothing across
  const auto ring = simulate(m, layout, allreducePrograms(Algorithm::kRing, m, layout, 4096));
  EXPECT_EQ(ring.peers[3], (std::vector<int>{4}));  // its ring neighbour on the next host
  EXPECT_EQ(ring.peers[0], (std::vector<int>{15}));
}

TEST(ClusterSim, ProgramsThatDoNotMatchAreAnError) {
  ClusterModel m = hostsOf(2, 1);
  const auto layout = m.layout();
  std::vector<Program> programs(2);
  programs[0].push_back({OpKind::kRecv, 1, 8, 0});  // rank 1 never sends
  try {
    simulate(m, layout, programs);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 never finished (step 0 of 1)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(simulate(m, layout, std::vector<Program>(3)), InvalidArgument);
}

TEST(ClusterSim, StoreRequestsQueueAtTheOneServer) {
  // 10 ranks x 3 requests of 5 us service and a 2 us round trip: the server is never idle
  // after the first arrival (1 us), so the last answer is 1 + 30 x 5 + 1 us.
  ClusterModel m = hostsOf(10, 1);
  StartupModel s;
  s.store_requests_per_rank = 3;
  s.store_requests_fixed = 0;
  s.store_service_us = 5;
  s.store_round_trip_us = 2;
  s.ring_allgathers = 0;
  const auto r = simulateStartup(m, m.layout(), s);
  EXPECT_EQ(r.store_requests, 30);
  EXPECT_NEAR(r.store_us, 1 + 30 * 5 + 1, 1e-9);
}

}  // namespace
}  // namespace railshard::sim
