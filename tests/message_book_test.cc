// The messaging layer's book of one peer's messages (transport/messaging/message_book.h): random
// messages cut into random pieces that arrive in random order over several "links", with
// receives posted before, during and after their arrival, must land byte for byte as sent
// (the reference is the sender's own buffer); every check an arriving piece passes is hit
// once with its error kind and text.
#include "transport/messaging/message_book.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <random>

namespace railshard::transport::messaging {
namespace {

MessageTag tagOf(uint64_t sequence, uint32_t step = 0) {
  MessageTag tag;
  tag.sequence = sequence;
  tag.count = 100 + sequence;
  tag.collective = 1;
  tag.step = step;
  return tag;
}

RequestPtr receiveRequest(uint64_t bytes, const MessageTag& tag) {
  return std::make_shared<Request>(Request::Kind::kRecv, 1, bytes, tag);
}

// Lands a piece the way a transport does: into base() + offset, then counts it; on completion
// copies a staged message into the receive's buffer and completes the request.
void deliver(MessageBook& book, const PieceInfo& piece, const uint8_t* payload) {
  MessageBook::Arrival arrival = book.arrive(piece, nullptr);
  ASSERT_FALSE(arrival.problem) << arrival.problem->text;
  ASSERT_TRUE(arrival.entry);
  if (piece.length > 0) std::memcpy(arrival.entry->base() + piece.offset, payload, piece.length);
  if (IncomingPtr done = book.landed(piece.message, *arrival.entry, piece.length)) {
    if (done->staging && done->total > 0) std::memcpy(done->user, done->staged.data(), done->total);
    done->request->markDone();
  }
}

TEST(MessageBook, EveryMessageLandsAsSentWhateverTheOrderOfPostsAndPieces) {
  std::mt19937_64 rng(20261202);
  for (int round = 0; round < 40; ++round) {
    MessageBook book(0, 1, nullptr);
    const int messages = 1 + static_cast<int>(rng() % 12);
    std::vector<std::vector<uint8_t>> sent(static_cast<size_t>(messages));
    std::vector<std::vector<uint8_t>> received(static_cast<size_t>(messages));
    std::vector<RequestPtr> requests(static_cast<size_t>(messages));
    // Pieces of every message; each of 3 links delivers its own pieces in order, the links
    // interleave at random (as rails do).
    std::vector<std::deque<PieceInfo>> links(3);
    for (int m = 0; m < messages; ++m) {
      const uint64_t number = book.numberSend();
      ASSERT_EQ(number, static_cast<uint64_t>(m));
      auto& bytes = sent[static_cast<size_t>(m)];
      bytes.resize(rng() % 3 == 0 ? 0 : 1 + rng() % 5000);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      uint64_t offset = 0;
      do {
        const uint64_t length = std::min<uint64_t>(bytes.size() - offset, 1 + rng() % 1500);
        links[rng() % links.size()].push_back(
            PieceInfo{number, tagOf(number), bytes.size(), offset, bytes.size() ? length : 0});
        offset += length;
      } while (offset < bytes.size());
    }
    int posted = 0;
    auto postNext = [&] {
      const auto m = static_cast<size_t>(posted++);
      received[m].assign(sent[m].size(), 0xEE);
      requests[m] = receiveRequest(sent[m].size(), tagOf(m));
      MessageBook::Posted result =
          book.post(requests[m], received[m].data(), sent[m].size(), tagOf(m));
      ASSERT_EQ(result.message, m);
      ASSERT_FALSE(result.problem) << result.problem->text;
      if (result.complete) {
        if (!sent[m].empty()) {
          std::memcpy(received[m].data(), result.complete->staged.data(), sent[m].size());
        }
        requests[m]->markDone();
      }
    };
    for (;;) {
      std::vector<size_t> busy;
      for (size_t l = 0; l < links.size(); ++l) {
        if (!links[l].empty()) busy.push_back(l);
      }
      if (busy.empty() && posted == messages) break;
      if (posted < messages && (busy.empty() || rng() % 3 == 0)) {
        postNext();
        continue;
      }
      auto& link = links[busy[rng() % busy.size()]];
      const PieceInfo piece = link.front();
      link.pop_front();
      deliver(book, piece, sent[piece.message].data() + piece.offset);
    }
    for (int m = 0; m < messages; ++m) {
      EXPECT_TRUE(requests[static_cast<size_t>(m)]->done())
          << "round " << round << " message " << m;
      EXPECT_EQ(received[static_cast<size_t>(m)], sent[static_cast<size_t>(m)])
          << "round " << round << " message " << m;
    }
    EXPECT_FALSE(book.awaitsAny());
    EXPECT_FALSE(book.nextArrived());
  }
}

TagFormatter namingFormatter() {
  TagFormatter formatter;
  formatter.describe = [](const MessageTag& tag) {
    return "allreduce #" + std::to_string(tag.sequence);
  };
  formatter.mismatch = [](int me, const MessageTag& mine, int peer, const MessageTag& theirs) {
    return "rank " + std::to_string(me) + " runs step " + std::to_string(mine.step) + ", rank " +
           std::to_string(peer) + " step " + std::to_string(theirs.step);
  };
  return formatter;
}

TEST(MessageBook, ATagMismatchIsCaughtBeforeAByteLandsWhicheverSideCameFirst) {
  const TagFormatter formatter = namingFormatter();
  {  // receive posted first
    MessageBook book(0, 1, &formatter);
    std::vector<uint8_t> buffer(8, 0);
    book.post(receiveRequest(8, tagOf(0, 1)), buffer.data(), 8, tagOf(0, 1));
    MessageBook::Arrival arrival = book.arrive(PieceInfo{0, tagOf(0, 2), 8, 0, 8}, nullptr);
    ASSERT_TRUE(arrival.problem);
    EXPECT_FALSE(arrival.entry);
    EXPECT_EQ(arrival.problem->kind, ErrorKind::kMismatch);
    EXPECT_EQ(arrival.problem->text, "rank 0 runs step 1, rank 1 step 2");
  }
  {  // message first (staged), then the receive
    MessageBook book(0, 1, &formatter);
    ASSERT_TRUE(book.arrive(PieceInfo{0, tagOf(0, 2), 8, 0, 4}, nullptr).entry);
    EXPECT_TRUE(book.nextArrived());
    std::vector<uint8_t> buffer(8, 0);
    MessageBook::Posted posted =
        book.post(receiveRequest(8, tagOf(0, 1)), buffer.data(), 8, tagOf(0, 1));
    ASSERT_TRUE(posted.problem);
    EXPECT_EQ(posted.problem->kind, ErrorKind::kMismatch);
    EXPECT_EQ(posted.problem->text, "rank 0 runs step 1, rank 1 step 2");
  }
}

TEST(MessageBook, ASizeMismatchNamesBothSizes) {
  const TagFormatter formatter = namingFormatter();
  MessageBook book(2, 5, &formatter);
  std::vector<uint8_t> buffer(16, 0);
  book.post(receiveRequest(16, tagOf(3)), buffer.data(), 16, tagOf(3));
  MessageBook::Arrival arrival = book.arrive(PieceInfo{0, tagOf(3), 12, 0, 12}, nullptr);
  ASSERT_TRUE(arrival.problem);
  EXPECT_EQ(arrival.problem->kind, ErrorKind::kMismatch);
  EXPECT_EQ(arrival.problem->text,
            "rank 2 expected 16 bytes for allreduce #3 but rank 5 sent 12 (do all ranks use the "
            "same RAILSHARD_CHUNK_BYTES?)");
  EXPECT_EQ(std::vector<uint8_t>(16, 0), buffer);  // nothing landed
}

TEST(MessageBook, ProtocolViolationsAreProtocolErrorsNamingTheMessage) {
  MessageBook book(0, 1, nullptr);
  std::vector<uint8_t> buffer(8, 0);
  auto request = receiveRequest(8, tagOf(0));
  book.post(request, buffer.data(), 8, tagOf(0));
  auto expectProtocol = [&](const PieceInfo& piece, const std::string& text) {
    MessageBook::Arrival arrival = book.arrive(piece, nullptr);
    ASSERT_TRUE(arrival.problem) << text;
    EXPECT_EQ(arrival.problem->kind, ErrorKind::kProtocol);
    EXPECT_EQ(arrival.problem->text, text);
  };
  expectProtocol(PieceInfo{0, tagOf(0), 8, 6, 4},
                 "rank 0: rank 1 sent a piece [6, +4) outside its message of 8 bytes");
  // Staged message 1 (no receive yet), then a piece of it that says another size.
  ASSERT_TRUE(book.arrive(PieceInfo{1, tagOf(1), 4, 0, 2}, nullptr).entry);
  expectProtocol(PieceInfo{1, tagOf(1), 6, 2, 2},
                 "rank 0: rank 1 sent pieces of message 1 that disagree on its tag or size");
  // Message 0 completes; more of it is a protocol error.
  MessageBook::Arrival whole = book.arrive(PieceInfo{0, tagOf(0), 8, 0, 8}, nullptr);
  ASSERT_TRUE(whole.entry);
  EXPECT_EQ(book.landed(0, *whole.entry, 8), whole.entry);
  expectProtocol(PieceInfo{0, tagOf(0), 8, 0, 8},
                 "rank 0: rank 1 sent more of message 0, which was already complete");
}

TEST(MessageBook, PiecesAreCountedInBytesSoTooManyOfThemIsTheCompletedMessagesProtocolError) {
  // The messenger never sends a piece twice (messenger.h): re-sends after a failover are exact,
  // so a message's bytes beyond its size can only be a peer's error.
  MessageBook book(0, 1, nullptr);
  std::vector<uint8_t> buffer(8, 0);
  auto request = receiveRequest(8, tagOf(0));
  book.post(request, buffer.data(), 8, tagOf(0));
  const uint8_t half[4] = {1, 2, 3, 4};
  deliver(book, PieceInfo{0, tagOf(0), 8, 0, 4}, half);
  EXPECT_FALSE(request->done());
  const uint8_t rest[4] = {5, 6, 7, 8};
  deliver(book, PieceInfo{0, tagOf(0), 8, 4, 4}, rest);
  EXPECT_TRUE(request->done());
  EXPECT_EQ((std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}), buffer);
  MessageBook::Arrival again = book.arrive(PieceInfo{0, tagOf(0), 8, 4, 4}, nullptr);
  ASSERT_TRUE(again.problem);
  EXPECT_EQ(again.problem->kind, ErrorKind::kProtocol);
  EXPECT_EQ(again.problem->text,
            "rank 0: rank 1 sent more of message 0, which was already complete");
}

TEST(MessageBook, UnsolicitedMessagesAreCheckedAndBounded) {
  MessageBook book(0, 1, nullptr);
  auto otherCollective = [](const MessageTag& tag) -> std::optional<std::string> {
    if (tag.collective != 1) return "rank 1 runs another collective";
    return std::nullopt;
  };
  MessageTag broadcast = tagOf(0);
  broadcast.collective = 3;
  MessageBook::Arrival refused = book.arrive(PieceInfo{0, broadcast, 8, 0, 8}, otherCollective);
  ASSERT_TRUE(refused.problem);
  EXPECT_EQ(refused.problem->kind, ErrorKind::kMismatch);
  EXPECT_EQ(refused.problem->text, "rank 1 runs another collective");
  MessageBook::Arrival huge =
      book.arrive(PieceInfo{0, tagOf(0), kMaxStagedBytes + 1, 0, 1}, otherCollective);
  ASSERT_TRUE(huge.problem);
  EXPECT_EQ(huge.problem->kind, ErrorKind::kMismatch);
  EXPECT_NE(huge.problem->text.find("sent an unsolicited message of 17179869185 bytes"),
            std::string::npos)
      << huge.problem->text;
  // A staged message of the right collective passes, and checkStaged looks at it again when
  // the rank enters a collective.
  ASSERT_TRUE(book.arrive(PieceInfo{0, tagOf(0), 8, 0, 8}, otherCollective).entry);
  EXPECT_FALSE(book.checkStaged(otherCollective));
  EXPECT_EQ(book.checkStaged([](const MessageTag&) { return std::optional<std::string>("no"); }),
            std::optional<std::string>("no"));
}

TEST(MessageBook, PostedReceivesAreReportedFromAMessageNumberOn) {
  MessageBook book(0, 1, nullptr);
  std::vector<uint8_t> a(4), b(4);
  book.post(receiveRequest(4, tagOf(0)), a.data(), 4, tagOf(0));
  book.post(receiveRequest(4, tagOf(1)), b.data(), 4, tagOf(1));
  EXPECT_TRUE(book.awaitsFrom(1));
  EXPECT_FALSE(book.awaitsFrom(2));
  // A message staged beyond the receives is not a receive anybody waits on.
  ASSERT_TRUE(book.arrive(PieceInfo{5, tagOf(5), 4, 0, 4}, nullptr).entry);
  EXPECT_FALSE(book.awaitsFrom(2));
  book.clear();
  EXPECT_FALSE(book.awaitsAny());
}

// NCCL's receives (the plugin): a buffer that may be larger than the message, chosen once the
// message's first piece (or its staged copy) says its tag and size.
TEST(MessageBook, AChosenReceiveTakesASmallerMessageIntoTheBufferItsTagPicks) {
  MessageBook book(0, 1, nullptr);
  std::vector<uint8_t> for_tag3(64, 0), for_tag4(64, 0);
  std::vector<std::pair<MessageTag, uint64_t>> asked;
  auto chooser = [&](const MessageTag& tag, uint64_t total) {
    asked.emplace_back(tag, total);
    return Choice{tag.step == 3 ? for_tag3.data() : for_tag4.data(), std::nullopt};
  };
  auto first = receiveRequest(64, MessageTag{});
  auto second = receiveRequest(64, MessageTag{});
  ASSERT_FALSE(book.postChosen(first, chooser).problem);
  // The second message is whole before its receive is posted: chosen at the post.
  const std::vector<uint8_t> b(40, 0xB2);
  deliver(book, PieceInfo{1, tagOf(9, 3), 40, 0, 40}, b.data());
  EXPECT_TRUE(asked.empty());
  const std::vector<uint8_t> a(20, 0xA1);
  deliver(book, PieceInfo{0, tagOf(9, 4), 20, 0, 12}, a.data());
  ASSERT_EQ(asked.size(), 1u);  // once, at its first piece
  EXPECT_EQ(asked[0].second, 20u);
  EXPECT_FALSE(first->done());
  deliver(book, PieceInfo{0, tagOf(9, 4), 20, 12, 8}, a.data() + 12);
  EXPECT_TRUE(first->done());
  EXPECT_EQ(asked.size(), 1u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), for_tag4.begin()));
  EXPECT_EQ(for_tag4[20], 0) << "a byte beyond the message";
  MessageBook::Posted posted = book.postChosen(second, chooser);
  ASSERT_FALSE(posted.problem);
  ASSERT_TRUE(posted.complete);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1].first, tagOf(9, 3));
  EXPECT_EQ(posted.complete->total, 40u);
  EXPECT_EQ(posted.complete->user, for_tag3.data());
}

TEST(MessageBook, AChosenReceiveThatRefusesTheMessageLandsNothing) {
  MessageBook book(0, 1, nullptr);
  auto refuse = [](const MessageTag&, uint64_t total) {
    return Choice{nullptr, Problem{ErrorKind::kMismatch, "rank 0: no buffer of the receive takes " +
                                                             std::to_string(total) + " bytes"}};
  };
  ASSERT_FALSE(book.postChosen(receiveRequest(8, MessageTag{}), refuse).problem);
  MessageBook::Arrival arrival = book.arrive(PieceInfo{0, tagOf(1), 100, 0, 100}, nullptr);
  ASSERT_TRUE(arrival.problem);
  EXPECT_FALSE(arrival.entry);
  EXPECT_EQ(arrival.problem->kind, ErrorKind::kMismatch);
  EXPECT_EQ(arrival.problem->text, "rank 0: no buffer of the receive takes 100 bytes");
  // Staged first, refused at the post.
  MessageBook other(0, 1, nullptr);
  ASSERT_TRUE(other.arrive(PieceInfo{0, tagOf(1), 100, 0, 100}, nullptr).entry);
  MessageBook::Posted posted = other.postChosen(receiveRequest(8, MessageTag{}), refuse);
  ASSERT_TRUE(posted.problem);
  EXPECT_FALSE(posted.complete);
  EXPECT_EQ(posted.problem->text, "rank 0: no buffer of the receive takes 100 bytes");
}

}  // namespace
}  // namespace railshard::transport::messaging
