// The single-copy all-reduce between processes of one host (core/collectives/
// shm_single_copy.cc; WIP on branch wip-26): ranks of tests/programs/collective_check started
// by hand, each its own process, so the peers' buffers really are read out of other processes
// (process_vm_readv). Every result is checked element by element by the program against the
// sum it computes on its own; the same runs with the single copy switched off
// (RAILSHARD_SHM_SINGLE_COPY=0) and with cross-memory reads refused (RAILSHARD_P2P_SHM=0, what
// a ptrace_scope or container policy does) take the staged path, same results; a peer killed
// mid-run is a PeerLostError naming it on every survivor.
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

TEST(ShmSingleCopy, ProcessesAllreduceExactlyOnTheSingleCopyAndOnBothFallbacks) {
  const std::vector<std::map<std::string, std::string>> settings = {
      {{"RAILSHARD_SHM_SINGLE_COPY", "1"}},
      {{"RAILSHARD_SHM_SINGLE_COPY", "0"}},
      {{"RAILSHARD_P2P_SHM", "0"}},
  };
  for (const auto& env : settings) {
    SCOPED_TRACE(env.begin()->first + "=" + env.begin()->second);
    // 3 processes, 300,000 int64 (2.4 MB: past the single copy's 1 MiB threshold).
    auto results = test::runRanksByHand(kCheck, 3, {"--iterations", "6", "--count", "300000"}, env,
                                        std::chrono::seconds(120), "single-copy");
    for (int rank = 0; rank < 3; ++rank) {
      const auto& r = results[static_cast<size_t>(rank)];
      ASSERT_EQ(r.exit_code, 0) << "rank " << rank << ": " << r.out << r.err;
      EXPECT_NE(r.out.find("ok after 6 allreduces over shm"), std::string::npos) << r.out;
    }
  }
}

TEST(ShmSingleCopy, APeerKilledMidRunIsAPeerLostErrorOnEverySurvivor) {
  auto results = test::runRanksByHand(kCheck, 3,
                                      {"--iterations", "200", "--count", "2000000", "--die-rank",
                                       "1", "--die-after", "3", "--die-how", "kill"},
                                      {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(90),
                                      "single-copy-kill");
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].err;
  for (int rank : {0, 2}) {
    const auto& r = results[static_cast<size_t>(rank)];
    ASSERT_FALSE(r.timed_out) << "rank " << rank << ": " << r.err;
    EXPECT_NE(r.exit_code, 0) << "rank " << rank << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("PeerLostError"), std::string::npos) << "rank " << rank << ": " << r.err;
    EXPECT_NE(r.err.find("rank 1"), std::string::npos) << "rank " << rank << ": " << r.err;
  }
}

}  // namespace
}  // namespace railshard
