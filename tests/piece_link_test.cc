// The TCP transport as a link for another layer's pieces (messaging::PieceLink, the RDMA
// transport's TCP rail): two transports in threads joined by two loopback "rails". The sink
// here is a plain buffer per message, so what lands is compared with what was sent byte for
// byte, and the bytes the sink is told landed must add up to each message exactly, also when
// a rail breaks mid-stream (a piece cut short counts what arrived; its tail comes again).
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "base/error.h"
#include "tests/hostile_peer.h"
#include "tests/multirail_pair.h"
#include "transport/messaging/piece_link.h"

namespace {

using railshard::test::connectPair;
using railshard::test::Pair;
using railshard::test::pattern;
using railshard::test::soon;
using railshard::test::tagOf;
using railshard::transport::RequestPtr;
using railshard::transport::messaging::PieceInfo;
using railshard::transport::messaging::PieceSink;
using railshard::transport::messaging::Problem;

// Lands every piece in a buffer per message (sized by the piece's total) and counts what it
// is told landed; refuses the message numbers in `refuse` with a MismatchError.
class BufferSink : public PieceSink {
 public:
  Landing pieceArriving(int peer, const PieceInfo& piece) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Landing landing;
    if (refuse_.count(piece.message) != 0) {
      landing.problem = Problem{railshard::ErrorKind::kMismatch,
                                "refused message " + std::to_string(piece.message) + " from rank " +
                                    std::to_string(peer)};
      return landing;
    }
    auto& buffer = buffers_[piece.message];
    buffer.resize(piece.total);
    landing.target = buffer.data() + piece.offset;
    return landing;
  }
  void pieceLanded(int, const PieceInfo& piece, uint64_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      landed_[piece.message] += bytes;
    }
    changed_.notify_all();
  }
  // Waits (bounded) until `bytes` have landed of `message`; returns what landed.
  uint64_t waitLanded(uint64_t message, uint64_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, soon(20), [&] { return landed_[message] >= bytes; });
    return landed_[message];
  }
  std::vector<uint8_t> buffer(uint64_t message) {
    std::lock_guard<std::mutex> lock(mutex_);
    return buffers_[message];
  }
  void refuse(uint64_t message) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_[message] = true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, std::vector<uint8_t>> buffers_;
  std::map<uint64_t, uint64_t> landed_;
  std::map<uint64_t, bool> refuse_;
};

// Sends `messages` messages of `bytes` from t[0] to t[1] as three pieces each (the way the
// RDMA scheduler hands its TCP rail a third), breaking rail 1 after message `break_after`.
void sendAndCheck(Pair& pair, BufferSink& sink, int messages, size_t bytes, int break_after) {
  std::vector<std::vector<uint8_t>> sent;
  std::vector<RequestPtr> sends;
  for (int m = 0; m < messages; ++m) {
    sent.push_back(pattern(bytes, static_cast<uint32_t>(m + 7)));
    const size_t cut1 = bytes / 3;
    const size_t cut2 = bytes - bytes / 5;
    for (auto [offset, end] : {std::pair{size_t{0}, cut1}, {cut1, cut2}, {cut2, bytes}}) {
      PieceInfo piece{static_cast<uint64_t>(m), tagOf(m), bytes, offset, end - offset};
      RequestPtr request = pair.t[0]->sendPiece(1, piece, sent.back().data() + offset);
      ASSERT_TRUE(request) << "message " << m;
      sends.push_back(request);
    }
    if (m == break_after) pair.t[0]->breakConnectionForTesting(1, 1);
  }
  for (auto& s : sends) pair.t[0]->wait(s, soon());
  for (int m = 0; m < messages; ++m) {
    EXPECT_EQ(sink.waitLanded(static_cast<uint64_t>(m), bytes), bytes)
        << "message " << m << ": the landed bytes must add up to the message exactly";
    EXPECT_EQ(sink.buffer(static_cast<uint64_t>(m)), sent[static_cast<size_t>(m)])
        << "message " << m;
  }
}

TEST(PieceLink, PiecesLandWhereTheSinkSaysOverBothRailsAndAddUpExactly) {
  Pair pair;
  connectPair(pair, 2);
  BufferSink sink;
  pair.t[1]->setPieceSink(&sink);
  sendAndCheck(pair, sink, 12, (3 << 20) + 17, -1);
  // Striped over both rails (pieces above the small-message limit are split again), and
  // counted as pieces: exactly what was posted.
  EXPECT_EQ(pair.t[0]->pieceBytesSent(1), uint64_t{12} * ((3 << 20) + 17));
  const auto rails = railshard::test::railsTo(*pair.t[0], 1);
  ASSERT_EQ(rails.size(), 2u);
  EXPECT_GT(rails[0].bytes_sent, 1u << 20);
  EXPECT_GT(rails[1].bytes_sent, 1u << 20);
  EXPECT_DOUBLE_EQ(pair.t[0]->pieceGbps(1), 20);  // the two rails' nominal 10 Gbit/s
  pair.t[1]->setPieceSink(nullptr);
}

TEST(PieceLink, ARailBrokenMidStreamCutsPiecesThatStillAddUpExactly) {
  Pair pair;
  connectPair(pair, 2);
  BufferSink sink;
  pair.t[1]->setPieceSink(&sink);
  {
    railshard::test::StderrCapture log;
    sendAndCheck(pair, sink, 24, 4 << 20, 3);
    // The rail really was taken out while pieces were on it.
    EXPECT_NE(log.text().find("taken out"), std::string::npos) << log.text();
  }
  pair.t[1]->setPieceSink(nullptr);
}

// Expects `t` to fail (within 20 s) with an error of type E containing `needle`.
template <typename E>
void expectFails(railshard::transport::tcp::TcpTransport& t, const std::string& needle) {
  const railshard::Deadline until = soon(20);
  while (railshard::Clock::now() < until) {
    try {
      t.checkHealthy();
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong error type: " << e.what();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "no failure containing '" << needle << "'";
}

TEST(PieceLink, APieceTheSinkRefusesFailsBothRanksWithItsError) {
  Pair pair;
  connectPair(pair, 1);
  BufferSink sink;
  sink.refuse(5);
  pair.t[1]->setPieceSink(&sink);
  const auto data = pattern(1000, 1);
  ASSERT_TRUE(pair.t[0]->sendPiece(1, PieceInfo{5, tagOf(5), 1000, 0, 1000}, data.data()));
  expectFails<railshard::MismatchError>(*pair.t[1], "refused message 5 from rank 0");
  expectFails<railshard::MismatchError>(*pair.t[0], "refused message 5 from rank 0");
  pair.t[1]->setPieceSink(nullptr);
}

TEST(PieceLink, APieceWithNowhereToGoIsAProtocolErrorNamingTheSetting) {
  Pair pair;
  connectPair(pair, 1);
  const auto data = pattern(64, 2);
  ASSERT_TRUE(pair.t[0]->sendPiece(1, PieceInfo{0, tagOf(0), 64, 0, 64}, data.data()));
  expectFails<railshard::ProtocolError>(*pair.t[1], "RAILSHARD_STRIPE_TCP");
}

}  // namespace
