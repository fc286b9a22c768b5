// Point-to-point messages between processes of one host through shared memory
// (transport/links/shm/shm_channel.h, one link of each same-host pair's messenger): ranks of
// tests/programs/p2p_check started by hand, each its own process, so large messages really are read
// out of another process (process_vm_readv).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/p2p_check";

struct Counted {
  unsigned long long payload = 0;
  unsigned long long tcp = 0;
  int sockets = -1;
};

Counted countedBytes(const test::ProcessResult& r) {
  std::smatch m;
  static const std::regex line(R"(ok payload=([0-9]+) tcp_bytes=([0-9]+) sockets=([0-9]+))");
  if (!std::regex_search(r.out, m, line)) return {};
  return {std::stoull(m[1].str()), std::stoull(m[2].str()), std::stoi(m[3].str())};
}

// The ring exchange (sizes around the inline limit and past 1 MiB, each message checked byte
// for byte by the program) between three processes: with RAILSHARD_P2P_SHM=1 no payload byte
// crosses a socket, and no connection to a peer is even made (each rank holds exactly two
// sockets fewer than with the fallback: one per peer); with 0 (the fallback a refused
// cross-memory read also takes) the same messages arrive over loopback TCP, every payload byte
// counted on the connections.
TEST(ShmMessages, ProcessesExchangeExactlyThroughSharedMemoryAndOverTheFallback) {
  std::vector<int> sockets[2];  // by setting, by rank
  for (const std::string setting : {"1", "0"}) {
    SCOPED_TRACE("RAILSHARD_P2P_SHM=" + setting);
    auto results =
        test::runRanksByHand(kCheck, 3, {"--rounds", "3"}, {{"RAILSHARD_P2P_SHM", setting}},
                             std::chrono::seconds(120), "shm-messages-" + setting);
    for (int rank = 0; rank < 3; ++rank) {
      const auto& r = results[static_cast<size_t>(rank)];
      ASSERT_EQ(r.exit_code, 0) << "rank " << rank << ": " << r.out << r.err;
      const Counted bytes = countedBytes(r);
      ASSERT_GT(bytes.payload, 3u << 20) << r.out;
      if (setting == "1") {
        EXPECT_EQ(bytes.tcp, 0u) << "rank " << rank << ": " << r.out;
      } else {
        EXPECT_GE(bytes.tcp, bytes.payload) << "rank " << rank << ": " << r.out;
      }
      ASSERT_GE(bytes.sockets, 0) << r.out;
      sockets[setting == "1" ? 0 : 1].push_back(bytes.sockets);
    }
  }
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(sockets[1][static_cast<size_t>(rank)] - sockets[0][static_cast<size_t>(rank)], 2)
        << "rank " << rank << ": " << sockets[0][static_cast<size_t>(rank)]
        << " sockets through shared memory, " << sockets[1][static_cast<size_t>(rank)]
        << " over TCP";
  }
}

// A sender that dies with its large message posted and unread: its receiver (reading from a
// process that is gone) and the rank whose large send it will never read both raise
// PeerLostError naming it, long before the 60 s timeout.
TEST(ShmMessages, AKilledSenderIsAPeerLostErrorOnTheRanksThatWaitForIt) {
  auto results = test::runRanksByHand(
      kCheck, 3, {"--rounds", "4", "--bytes", "4000000", "--die-rank", "1", "--die-after", "2"},
      {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(60), "shm-messages-kill");
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].err;
  for (int rank : {0, 2}) {
    const auto& r = results[static_cast<size_t>(rank)];
    ASSERT_FALSE(r.timed_out) << "rank " << rank << ": " << r.err;
    EXPECT_EQ(r.exit_code, 1) << "rank " << rank << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("PeerLostError: "), std::string::npos) << "rank " << rank << ": " << r.err;
    EXPECT_NE(r.err.find("rank 1"), std::string::npos) << "rank " << rank << ": " << r.err;
  }
}

}  // namespace
}  // namespace railshard
