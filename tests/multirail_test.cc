// The TCP transport over several rails, on this machine without root: 127.0.0.1 and
// 127.0.0.2 are both local, so two ranks in threads joined by "rails" on the two addresses
// exercise striping, reassembly, failover and re-admission over real sockets. What shaping
// and real link loss do is tested in the namespace test bed (multirail_netns_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/memory_store.h"
#include "test_util.h"
#include "tests/hostile_peer.h"
#include "tests/multirail_pair.h"
#include "transport/links/tcp/hello.h"

namespace {

using railshard::Deadline;
using railshard::MemoryStore;
using railshard::test::connectPair;
using railshard::test::connectPairThrough;
using railshard::test::kToken;
using railshard::test::Pair;
using railshard::test::pattern;
using railshard::test::railOneBackOnBoth;
using railshard::test::railsTo;
using railshard::test::soon;
using railshard::test::tagOf;
using railshard::transport::MessageTag;
using railshard::transport::RailStatus;
using railshard::transport::RequestPtr;
using railshard::transport::links::tcp::RailSpec;
using railshard::transport::messaging::Mesh;
using ::testing::HasSubstr;

TEST(MultiRail, OneConnectionPerRailEachNamedAndUp) {
  Pair pair;
  connectPair(pair, 2, railshard::RailWeights::kAdaptive, 2);
  const auto rails = railsTo(*pair.t[0], 1);
  ASSERT_EQ(rails.size(), 4u);  // 2 rails x 2 sockets
  EXPECT_EQ(rails[0].name, "lo0#0");
  EXPECT_EQ(rails[1].name, "lo0#1");
  EXPECT_EQ(rails[2].name, "lo1#0");
  EXPECT_EQ(rails[3].local, "127.0.0.2");
  for (const auto& r : rails) {
    EXPECT_TRUE(r.up);
    EXPECT_NEAR(r.fraction, 0.25, 1e-9);
  }
}

// Sizes around every boundary of the split (small messages whole on one rail, aligned cut
// points, odd tails), posted before and after the matching receive (staged path), both ways.
// Every connected TCP socket of this process (listening ones excluded), found through
// /proc/self/fd, with whether Nagle's algorithm is off on it.
std::vector<std::pair<int, bool>> connectedTcpSockets() {
  std::vector<std::pair<int, bool>> result;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    int type = 0;
    int listening = 0;
    int protocol = 0;
    socklen_t length = sizeof(int);
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) {
      continue;
    }
    length = sizeof(int);
    ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &length);
    length = sizeof(int);
    ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length);
    if (protocol != IPPROTO_TCP || listening != 0) continue;
    int nodelay = 0;
    length = sizeof(int);
    ::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &length);
    result.emplace_back(fd, nodelay != 0);
  }
  return result;
}

// Both ends of every rail: an accepted socket does not inherit TCP_NODELAY, and with Nagle on
// a small message that follows an unacknowledged one waits for the peer's delayed ACK: two
// ranks on two rails took ~20 ms per 8-byte all-reduce instead of ~0.1 ms (test bed).
TEST(MultiRail, NagleIsOffOnBothEndsOfEveryRail) {
  Pair pair;
  connectPair(pair, 2);
  const auto sockets = connectedTcpSockets();
  EXPECT_GE(sockets.size(), 4u);  // two rails, both ends in this process
  for (const auto& [fd, nodelay] : sockets) EXPECT_TRUE(nodelay) << "fd " << fd;
}

TEST(MultiRail, StripedMessagesArriveExactlyWhateverTheSplit) {
  Pair pair;
  connectPair(pair, 2);
  const std::vector<size_t> sizes = {
      0, 1, 63, 64 << 10, (64 << 10) + 1, 1 << 20, (1 << 20) + 3, (8 << 20) + 77};
  for (int direction = 0; direction < 2; ++direction) {
    Mesh& sender = *pair.t[direction];
    Mesh& receiver = *pair.t[1 - direction];
    const int to = 1 - direction;
    std::vector<std::vector<uint8_t>> sent;
    std::vector<std::vector<uint8_t>> got;
    std::vector<RequestPtr> requests;
    for (size_t i = 0; i < sizes.size(); ++i) {
      sent.push_back(pattern(sizes[i], static_cast<uint32_t>(i * 31 + direction)));
      got.emplace_back(sizes[i], 0xEE);
    }
    // Half the receives before the sends, half after (their data is staged first).
    const size_t early = sizes.size() / 2;
    for (size_t i = 0; i < early; ++i) {
      requests.push_back(receiver.irecv(direction, got[i].data(), sizes[i], tagOf(i)));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      requests.push_back(sender.isend(to, sent[i].data(), sizes[i], tagOf(i)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = early; i < sizes.size(); ++i) {
      requests.push_back(receiver.irecv(direction, got[i].data(), sizes[i], tagOf(i)));
    }
    for (auto& r : requests) {
      (r->kind() == railshard::transport::Request::Kind::kSend ? sender : receiver).wait(r, soon());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(got[i], sent[i]) << "message " << i << " of " << sizes[i] << " bytes";
    }
  }
  // Every payload byte went over exactly one rail, and the large ones over both.
  const size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0});
  const auto rails = railsTo(*pair.t[0], 1);
  ASSERT_EQ(rails.size(), 2u);
  EXPECT_EQ(rails[0].bytes_sent + rails[1].bytes_sent, total);
  EXPECT_GT(rails[0].bytes_sent, size_t{1} << 20);
  EXPECT_GT(rails[1].bytes_sent, size_t{1} << 20);
}

TEST(MultiRail, EqualWeightsSplitLargeMessagesEvenly) {
  Pair pair;
  connectPair(pair, 2, railshard::RailWeights::kEqual);
  const size_t bytes = 16 << 20;
  auto data = pattern(bytes, 7);
  std::vector<uint8_t> got(bytes);
  auto r = pair.t[1]->irecv(0, got.data(), bytes, tagOf(1));
  auto s = pair.t[0]->isend(1, data.data(), bytes, tagOf(1));
  pair.t[0]->wait(s, soon());
  pair.t[1]->wait(r, soon());
  EXPECT_EQ(got, data);
  const auto rails = railsTo(*pair.t[0], 1);
  EXPECT_EQ(rails[0].bytes_sent, bytes / 2);
  EXPECT_EQ(rails[1].bytes_sent, bytes / 2);
  EXPECT_DOUBLE_EQ(rails[0].gbps, 1.0);  // equal weights are never re-estimated
}

TEST(MultiRail, StaticWeightsSplitByTheGraphsSpeedsAndStayThere) {
  Pair pair;
  connectPair(pair, 2, railshard::RailWeights::kStatic, 1, {10, 30});
  const size_t bytes = 16 << 20;
  auto data = pattern(bytes, 11);
  std::vector<uint8_t> got(bytes);
  for (int round = 0; round < 3; ++round) {
    auto r = pair.t[1]->irecv(0, got.data(), bytes, tagOf(round));
    auto s = pair.t[0]->isend(1, data.data(), bytes, tagOf(round));
    pair.t[0]->wait(s, soon());
    pair.t[1]->wait(r, soon());
    EXPECT_EQ(got, data);
  }
  const auto rails = railsTo(*pair.t[0], 1);
  EXPECT_DOUBLE_EQ(rails[0].gbps, 10);  // measured traffic does not move static weights
  EXPECT_DOUBLE_EQ(rails[1].gbps, 30);
  EXPECT_NEAR(rails[0].fraction, 0.25, 1e-9);
  // 1:3 of every message, to the 64-byte cut.
  EXPECT_NEAR(static_cast<double>(rails[0].bytes_sent), 0.25 * 3 * bytes, 3 * 64);
  EXPECT_EQ(rails[0].bytes_sent + rails[1].bytes_sent, 3 * bytes);
}

TEST(MultiRail, TagMismatchIsStillCaughtOnEveryRank) {
  Pair pair;
  connectPair(pair, 2);
  std::vector<uint8_t> data(1 << 20, 1);
  std::vector<uint8_t> got(1 << 20);
  auto r = pair.t[1]->irecv(0, got.data(), got.size(), tagOf(2));
  // The receiver's report can reach the sender while its isend is still handing frames to the
  // rails (about 1 in 100 runs here): then the isend itself raises it.
  RequestPtr s;
  std::string early;
  try {
    s = pair.t[0]->isend(1, data.data(), data.size(), tagOf(3));
  } catch (const railshard::MismatchError& e) {
    early = e.what();
  }
  EXPECT_THROW(pair.t[1]->wait(r, soon()), railshard::MismatchError);
  if (!early.empty()) {
    EXPECT_THAT(early, HasSubstr("reported by rank 1"));
    return;
  }
  // The sender's own send may complete (it is all on the wire); its next receive from that
  // peer gets the receiver's error.
  try {
    pair.t[0]->wait(s, soon());
    auto next = pair.t[0]->irecv(1, got.data(), got.size(), tagOf(4));
    pair.t[0]->wait(next, soon());
    FAIL() << "expected MismatchError";
  } catch (const railshard::MismatchError& e) {
    EXPECT_THAT(e.what(), HasSubstr("reported by rank 1"));
  }
}

// A rail breaks while megabytes are in flight on it: its undelivered bytes are re-sent on
// the other, every message arrives intact, and the rail is reconnected and used again.
TEST(MultiRail, BrokenRailIsFailedOverWithoutLossAndReadmitted) {
  Pair pair;
  connectPair(pair, 2);
  constexpr int kMessages = 24;
  constexpr size_t kBytes = 4 << 20;
  std::vector<std::vector<uint8_t>> sent;
  std::vector<std::vector<uint8_t>> got(kMessages, std::vector<uint8_t>(kBytes));
  for (int i = 0; i < kMessages; ++i) sent.push_back(pattern(kBytes, static_cast<uint32_t>(i)));
  std::vector<RequestPtr> recvs;
  std::vector<RequestPtr> sends;
  for (int i = 0; i < kMessages; ++i) {
    recvs.push_back(pair.t[1]->irecv(0, got[static_cast<size_t>(i)].data(), kBytes, tagOf(i)));
  }
  for (int i = 0; i < kMessages; ++i) {
    sends.push_back(pair.t[0]->isend(1, sent[static_cast<size_t>(i)].data(), kBytes, tagOf(i)));
    if (i == 3) railshard::test::tcpDriverOf(*pair.t[0]).breakForTesting(1, 1);  // mid-stream
  }
  for (auto& s : sends) pair.t[0]->wait(s, soon());
  for (auto& r : recvs) pair.t[1]->wait(r, soon());
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(got[static_cast<size_t>(i)], sent[static_cast<size_t>(i)]) << "message " << i;
  }

  // Re-admitted within a few rejoin intervals, on both ranks, and carrying traffic again.
  ASSERT_TRUE(railOneBackOnBoth(pair)) << railsTo(*pair.t[0], 1)[1].down_reason;
  const uint64_t before = railsTo(*pair.t[0], 1)[1].bytes_sent;
  auto data = pattern(8 << 20, 99);
  std::vector<uint8_t> back(data.size());
  auto r = pair.t[1]->irecv(0, back.data(), back.size(), tagOf(100));
  auto s = pair.t[0]->isend(1, data.data(), data.size(), tagOf(100));
  pair.t[0]->wait(s, soon());
  pair.t[1]->wait(r, soon());
  EXPECT_EQ(back, data);
  EXPECT_GT(railsTo(*pair.t[0], 1)[1].bytes_sent, before);
}

// After start-up the rail listeners stay open for re-admission (tcp_transport_rejoin.cc), and
// hold the same line as start-up: the fixed hello is checked before the token is read, the
// token must be the job's, and the hello must ask to rejoin. Each hostile connection is closed
// with its reason logged, and the broken rail is still re-admitted and carries data.
TEST(MultiRail, RejoinListenerRefusesHostileConnectionsAndTheRailStillComesBack) {
  using railshard::test::closedByPeer;
  using railshard::test::connectTo;
  using railshard::test::sendSome;
  namespace tcp = railshard::transport::links::tcp;
  railshard::test::StderrCapture log;
  MemoryStore store;
  Pair pair;
  connectPairThrough(store, pair, 2);
  // Rank 0 accepts its rails from rank 1: its listener for rail lo1 (127.0.0.2).
  std::string target;
  for (const std::string& address : railshard::test::tcpDriverOf(*pair.t[0]).listening()) {
    if (address.rfind("127.0.0.2:", 0) == 0) target = address;
  }
  ASSERT_FALSE(target.empty()) << "rank 0 keeps no listener on rail lo1";
  railshard::test::tcpDriverOf(*pair.t[0]).breakForTesting(1, 1);

  auto hello = [](const std::string& token, uint16_t flags, uint16_t announced) {
    tcp::Hello h;
    h.rank = 1;
    h.world_size = 2;
    h.channel = 1;
    h.channels = 2;
    h.flags = flags;
    h.generation = 1;
    h.token_bytes = announced;
    std::vector<uint8_t> bytes(sizeof(h) + token.size());
    std::memcpy(bytes.data(), &h, sizeof(h));
    if (!token.empty()) std::memcpy(bytes.data() + sizeof(h), token.data(), token.size());
    return bytes;
  };
  const std::string wrong(sizeof(kToken) - 1, 'x');
  const std::vector<std::pair<const char*, std::vector<uint8_t>>> attacks = {
      {"wrong token", hello(wrong, tcp::kHelloRejoin, static_cast<uint16_t>(wrong.size()))},
      {"garbage", std::vector<uint8_t>(4096, 0xab)},
      {"oversized token", hello("", tcp::kHelloRejoin, 65535)},
      {"not a rejoin", hello(kToken, 0, static_cast<uint16_t>(sizeof(kToken) - 1))},
      {"truncated", std::vector<uint8_t>(10, 0)},
      {"silent", {}},
  };
  for (const auto& [what, bytes] : attacks) {
    tcp::Fd fd = connectTo(target);
    if (std::string(what) == "truncated") {
      auto part = hello(kToken, tcp::kHelloRejoin, static_cast<uint16_t>(sizeof(kToken) - 1));
      part.resize(10);
      sendSome(fd.get(), part);
      ::shutdown(fd.get(), SHUT_WR);
    } else {
      sendSome(fd.get(), bytes);
    }
    EXPECT_TRUE(closedByPeer(fd.get(), std::chrono::seconds(5))) << what;
  }

  ASSERT_TRUE(railOneBackOnBoth(pair)) << railsTo(*pair.t[0], 1)[1].down_reason;
  auto data = pattern(8 << 20, 7);
  std::vector<uint8_t> back(data.size());
  const uint64_t before = railsTo(*pair.t[0], 1)[1].bytes_sent;
  auto r = pair.t[1]->irecv(0, back.data(), back.size(), tagOf(1));
  auto s = pair.t[0]->isend(1, data.data(), data.size(), tagOf(1));
  pair.t[0]->wait(s, soon());
  pair.t[1]->wait(r, soon());
  EXPECT_EQ(back, data);
  EXPECT_GT(railsTo(*pair.t[0], 1)[1].bytes_sent, before);

  const std::string text = log.text();
  EXPECT_THAT(text, HasSubstr("refused a rail rejoin connection"));
  EXPECT_THAT(text, HasSubstr("wrong job token"));
  EXPECT_THAT(text, HasSubstr("bad hello magic"));
  EXPECT_THAT(text, HasSubstr("exceeds the limit"));
  EXPECT_THAT(text, HasSubstr("not a rejoin"));
  EXPECT_THAT(text, HasSubstr("rejoin hello"));  // the truncated and the silent one
}

TEST(MultiRail, FailoverWorksInBothDirectionsAtOnce) {
  Pair pair;
  connectPair(pair, 2);
  constexpr int kMessages = 16;
  constexpr size_t kBytes = 2 << 20;
  std::vector<std::vector<uint8_t>> sent[2];
  std::vector<std::vector<uint8_t>> got[2];
  std::vector<RequestPtr> requests[2];
  for (int side = 0; side < 2; ++side) {
    for (int i = 0; i < kMessages; ++i) {
      sent[side].push_back(pattern(kBytes, static_cast<uint32_t>(side * 1000 + i)));
      got[side].emplace_back(kBytes);
    }
  }
  for (int side = 0; side < 2; ++side) {
    for (int i = 0; i < kMessages; ++i) {
      requests[side].push_back(pair.t[side]->irecv(
          1 - side, got[side][static_cast<size_t>(i)].data(), kBytes, tagOf(i)));
    }
  }
  for (int i = 0; i < kMessages; ++i) {
    for (int side = 0; side < 2; ++side) {
      requests[side].push_back(pair.t[side]->isend(
          1 - side, sent[side][static_cast<size_t>(i)].data(), kBytes, tagOf(i)));
    }
    if (i == 2) railshard::test::tcpDriverOf(*pair.t[1]).breakForTesting(0, 0);
  }
  for (int side = 0; side < 2; ++side) {
    for (auto& r : requests[side]) pair.t[side]->wait(r, soon());
  }
  for (int side = 0; side < 2; ++side) {
    for (int i = 0; i < kMessages; ++i) {
      EXPECT_EQ(got[side][static_cast<size_t>(i)], sent[1 - side][static_cast<size_t>(i)])
          << "rank " << side << " message " << i;
    }
  }
}

TEST(MultiRail, LosingEveryRailIsPeerLostNamingTheRails) {
  Pair pair;
  connectPair(pair, 2);
  std::vector<uint8_t> got(1 << 20);
  auto r = pair.t[1]->irecv(0, got.data(), got.size(), tagOf(1));
  railshard::test::tcpDriverOf(*pair.t[0]).breakForTesting(1, 0);
  railshard::test::tcpDriverOf(*pair.t[0]).breakForTesting(1, 1);
  try {
    pair.t[1]->wait(r, soon());
    FAIL() << "expected PeerLostError";
  } catch (const railshard::PeerLostError& e) {
    EXPECT_THAT(e.what(), HasSubstr("lo0"));
    EXPECT_THAT(e.what(), HasSubstr("lo1"));
  }
}

}  // namespace
