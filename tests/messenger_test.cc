// The messenger (transport/messaging/messenger.h) between two ranks over scripted fake links
// (tests/fakes/fake_link.h): no I/O, no thread of its own, no clock. The test plays the wire:
// it delivers what one side posted to the other, fails links, re-makes them. Every scenario is
// checked against the bytes sent (a reference the test keeps) and the errors by type and text:
// exact re-sending when a link fails with frames in flight, re-admission (re-dialled and by
// records), a mismatched tag refused before a byte lands on every kind of link, a peer lost
// while a receive waits, closing while sends are queued, a silent peer.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "base/error.h"
#include "tests/fakes/fake_link.h"
#include "transport/messaging/mesh.h"
#include "transport/messaging/rendezvous.h"

namespace railshard::test {
namespace {

using transport::MessageTag;
using transport::RequestPtr;
using transport::TagFormatter;
using transport::messaging::Mesh;
using transport::messaging::MessengerOptions;

MessageTag tagOf(uint64_t sequence, uint32_t step = 0) {
  MessageTag tag;
  tag.sequence = sequence;
  tag.count = 1000 + sequence;
  tag.collective = 1;
  tag.step = step;
  return tag;
}

TagFormatter formatter() {
  TagFormatter f;
  f.describe = [](const MessageTag& tag) { return "message #" + std::to_string(tag.sequence); };
  return f;
}

std::vector<uint8_t> pattern(size_t bytes, uint64_t seed) {
  std::vector<uint8_t> data(bytes);
  std::mt19937_64 rng(seed);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

// Two ranks, each a Mesh with one messenger to the other over the same list of fake links.
class Pair {
 public:
  // `now`: the clock the messengers read (tests that need one script it).
  Pair(const std::vector<LinkAttributes>& links, std::vector<bool> data,
       std::function<Clock::time_point()> now = nullptr, Duration heartbeat = Duration::zero(),
       std::vector<bool> up = {}) {
    for (int rank = 0; rank < 2; ++rank) {
      mesh[rank] = std::make_unique<Mesh>(rank, 2, formatter());
      auto group = mesh[rank]->group();
      group.now = now;
      MessengerOptions options;
      options.peer = 1 - rank;
      options.links.heartbeat_timeout =
          std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat);
      options.links.rail_timeout = std::chrono::seconds(2);
      options.initiator = rank == 1;
      auto messenger = std::make_unique<Messenger>(group, options);
      for (size_t i = 0; i < links.size(); ++i) {
        auto link = std::make_unique<FakeLink>(links[i]);
        fake[rank].push_back(link.get());
        messenger->addLink(std::move(link), data[i], up.empty() || up[i]);
      }
      m[rank] = messenger.get();
      mesh[rank]->addMessenger(std::move(messenger));
    }
  }

  // Delivers up to `max` frames that rank `from` put on link `l` (control frames first, as a
  // link sends them at the next frame boundary) to the other rank; lanes' frames complete at
  // the sender once delivered. Returns how many went.
  int deliver(int from, int l, int max = INT_MAX) {
    FakeLink& link = *fake[from][static_cast<size_t>(l)];
    Messenger& to = *m[1 - from];
    int delivered = 0;
    while (delivered < max && (!link.control.empty() || !link.wire.empty())) {
      const bool control = !link.control.empty();
      FakeLink::Wire frame = control ? link.control.front() : link.wire.front();
      (control ? link.control : link.wire).pop_front();
      {
        auto guard = to.guard();
        Messenger::Landing landing = to.arrivingLocked(l, frame.header);
        if (frame.header.length > 0 && !landing.discard) {
          EXPECT_NE(landing.target, nullptr);
          if (landing.target != nullptr)
            std::memcpy(landing.target, frame.payload.data(), frame.header.length);
        }
        to.landedLocked(l, frame.header, landing);
      }
      if (!control && link.attributes().delivery == Delivery::kCompletion &&
          !link.unfinished.empty()) {
        link.unfinished.pop_front();
        auto guard = m[from]->guard();
        m[from]->completedLocked(l, 1);
        m[from]->roomLocked(l);
      }
      ++delivered;
    }
    if (delivered > 0) {
      auto guard = to.guard();
      to.idleLocked(l);
    }
    return delivered;
  }
  // Link `l` comes up at `generation` on both ranks (as their drivers would report it).
  void upBoth(int l, uint32_t generation) {
    for (int rank = 0; rank < 2; ++rank) {
      auto guard = m[rank]->guard();
      fake[rank][static_cast<size_t>(l)]->down = false;
      m[rank]->linkUpLocked(l, generation);
    }
  }
  // Everything on every link both ways, until nothing moves.
  void deliverAll() {
    for (int moved = 1; moved > 0;) {
      moved = 0;
      for (int from = 0; from < 2; ++from) {
        for (size_t l = 0; l < fake[from].size(); ++l) {
          if (!fake[from][l]->down) moved += deliver(from, static_cast<int>(l));
        }
      }
    }
  }
  // Link `l` fails on both ranks (a cut cable): each takes it out and, nothing more arriving
  // on it, reports how much of it it took.
  void cut(int l) {
    for (int rank = 0; rank < 2; ++rank) {
      auto guard = m[rank]->guard();
      m[rank]->linkFailedLocked(l, "cut by the test", false);
      m[rank]->quiescedLocked(l);
    }
  }
  uint64_t received(int rank, int l) { return m[1 - rank]->bytesSent(l); }

  std::unique_ptr<Mesh> mesh[2];
  Messenger* m[2] = {nullptr, nullptr};
  std::vector<FakeLink*> fake[2];
};

void expectDone(Mesh& mesh, const RequestPtr& request) {
  ASSERT_TRUE(request->done()) << "request to rank " << request->peer() << " not complete";
  mesh.wait(request, deadlineAfter(std::chrono::seconds(1)));
}

template <typename E>
std::string errorOf(const std::function<void()>& body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong error type: ") + e.what();
  }
  return "(no error)";
}

TEST(Messenger, StripesByRateOverTwoLinksAndReassemblesExactly) {
  for (const auto& kind : {socketLike("rail0", 30), laneLike("mlx5_0:1", 30)}) {
    LinkAttributes slow = kind;
    slow.name += "-slow";
    slow.gbps = 10;
    Pair pair({kind, slow}, {true, true});
    const auto sent = pattern(4 << 20, 1);
    std::vector<uint8_t> got(sent.size(), 0);
    auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
    auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
    pair.deliverAll();
    expectDone(*pair.mesh[0], send);
    expectDone(*pair.mesh[1], recv);
    EXPECT_EQ(got, sent) << kind.name;
    const double fast_share =
        static_cast<double>(pair.m[0]->bytesSent(0)) / static_cast<double>(sent.size());
    EXPECT_NEAR(fast_share, 0.75, 0.02) << kind.name << ": 30 and 10 Gbit/s split 3:1";
    EXPECT_EQ(pair.m[0]->bytesSent(0) + pair.m[0]->bytesSent(1), sent.size());
  }
}

// A socket's share that completes as it is posted (a small piece is copied and released at
// once) must not complete the send while another link's share still waits for room: the
// caller would free a buffer the lane has yet to read.
TEST(Messenger, ASendCompletesOnlyWhenEveryLinksShareIsOut) {
  Pair pair({socketLike("tcp", 10), laneLike("lane", 10)}, {true, true});
  pair.fake[0][1]->room = 0;  // the lane has no room yet
  const auto sent = pattern(96 << 10, 9);
  std::vector<uint8_t> got(sent.size(), 0);
  auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
  auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
  EXPECT_EQ(pair.fake[0][0]->posts, 1) << "the socket's share went at once";
  EXPECT_EQ(pair.fake[0][1]->posts, 0);
  EXPECT_FALSE(send->done()) << "complete with the lane's share unsent";
  pair.fake[0][1]->room = INT_MAX;
  {
    auto guard = pair.m[0]->guard();
    pair.m[0]->roomLocked(1);
  }
  pair.deliverAll();
  expectDone(*pair.mesh[0], send);
  expectDone(*pair.mesh[1], recv);
  EXPECT_EQ(got, sent);
  EXPECT_GT(pair.m[0]->bytesSent(1), 0u);
}

// Frames of a 4 MiB message in flight on both links; link 1 is cut after some of its frames
// arrived: the rest of them come again on link 0, and every byte lands exactly once (a byte
// twice would be more bytes than the message has: a ProtocolError).
TEST(Messenger, ALinkFailingWithFramesInFlightIsReSentExactlyOnTheOther) {
  for (auto kind : {socketLike("rail", 10), laneLike("lane", 10)}) {
    kind.max_payload = std::min<uint64_t>(kind.max_payload, 64 << 10);  // several frames each
    LinkAttributes other = kind;
    other.name += "1";
    Pair pair({kind, other}, {true, true});
    const auto sent = pattern(4 << 20, 2);
    const auto small = pattern(300, 3);
    std::vector<uint8_t> got(sent.size(), 0);
    std::vector<uint8_t> got_small(small.size(), 0);
    auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
    auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
    ASSERT_GT(pair.fake[0][1]->wire.size(), 2u) << kind.name;
    const int before = pair.deliver(0, 1, 2);  // two frames of link 1 arrive, then it breaks
    ASSERT_EQ(before, 2);
    pair.cut(1);
    // A message posted after the failure goes on the link that is left.
    auto recv_small = pair.m[1]->irecv(got_small.data(), got_small.size(), tagOf(1));
    auto send_small = pair.m[0]->isend(small.data(), small.size(), tagOf(1));
    pair.deliverAll();
    expectDone(*pair.mesh[1], recv);
    expectDone(*pair.mesh[1], recv_small);
    expectDone(*pair.mesh[0], send);
    expectDone(*pair.mesh[0], send_small);
    EXPECT_EQ(got, sent) << kind.name;
    EXPECT_EQ(got_small, small) << kind.name;
    const auto rails = pair.m[0]->rails();
    ASSERT_EQ(rails.size(), 2u);
    EXPECT_TRUE(rails[0].up);
    EXPECT_FALSE(rails[1].up);
    EXPECT_EQ(rails[1].down_reason, "cut by the test");
  }
}

// The stall rule (RAILSHARD_RAIL_TIMEOUT, 2 s here): link 1's frames are on its wire for 4 s
// while link 0 delivers. A socket whose kernel keeps taking bytes is slow, not dead: it stays,
// and its frames land exact when they arrive. One whose kernel takes nothing is taken out, and
// its frames are re-sent on link 0.
TEST(Messenger, ASlowSocketThatKeepsTakingBytesIsNotTakenOutAndADeadOneIs) {
  for (const bool moving : {true, false}) {
    Clock::time_point t = Clock::now();
    LinkAttributes rail0 = socketLike("rail0", 10);
    LinkAttributes rail1 = socketLike("rail1", 10);
    rail0.max_payload = rail1.max_payload = 64 << 10;
    Pair pair({rail0, rail1}, {true, true}, [&] { return t; });
    const auto sent = pattern(1 << 20, 11);
    std::vector<uint8_t> got(sent.size(), 0);
    auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
    auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
    ASSERT_GT(pair.fake[0][1]->wire.size(), 0u);
    for (int second = 0; second < 4; ++second) {
      t += std::chrono::seconds(1);
      if (moving) pair.fake[0][1]->taken += 1000;
      pair.m[0]->tick();
      pair.m[1]->tick();
      // Link 0 both ways (its frames, the suspicion's pings and their answers); link 1 never.
      pair.deliver(0, 0);
      pair.deliver(1, 0);
    }
    const auto rails = pair.m[0]->rails();
    ASSERT_EQ(rails.size(), 2u);
    EXPECT_TRUE(rails[0].up);
    if (moving) {
      EXPECT_TRUE(rails[1].up) << "taken out while its socket moved bytes: "
                               << rails[1].down_reason;
    } else {
      EXPECT_FALSE(rails[1].up) << "a socket that took nothing for 4 s stayed in";
      EXPECT_NE(rails[1].down_reason.find("no progress for"), std::string::npos)
          << rails[1].down_reason;
      // Nothing more arrives on it at rank 0; rank 1 takes it out on rank 0's report, then
      // nothing arrives there either (each driver says so once the link is shut).
      {
        auto guard = pair.m[0]->guard();
        pair.m[0]->quiescedLocked(1);
      }
      pair.deliver(0, 0);
      EXPECT_FALSE(pair.m[1]->rails()[1].up) << "rank 1 did not take it out on the report";
      auto guard = pair.m[1]->guard();
      pair.m[1]->quiescedLocked(1);
    }
    pair.deliverAll();
    expectDone(*pair.mesh[1], recv);
    expectDone(*pair.mesh[0], send);
    EXPECT_EQ(got, sent) << (moving ? "slow socket" : "dead socket");
  }
}

TEST(Messenger, AFailedLinkIsReAdmittedAndCarriesTrafficAgain) {
  for (const auto& kind : {socketLike("rail", 10), laneLike("lane", 10)}) {
    LinkAttributes other = kind;
    other.name += "1";
    Pair pair({kind, other}, {true, true});
    pair.cut(1);
    pair.deliverAll();  // the reports
    // The initiator (rank 1) makes it again on its next tick: a socket is re-dialled by its
    // driver, a lane is connected by records exchanged over link 0 and probed.
    pair.m[1]->tick();
    if (kind.redials) {
      ASSERT_EQ(pair.fake[1][1]->redials, std::vector<uint32_t>{1});
      for (int rank = 0; rank < 2; ++rank) {
        auto guard = pair.m[rank]->guard();
        ASSERT_TRUE(pair.m[rank]->redialWantedLocked(1, 1) || rank == 1);
        pair.fake[rank][1]->down = false;
        pair.m[rank]->linkUpLocked(1, 1);
      }
    } else {
      pair.deliverAll();  // connect, answer, probe
      EXPECT_EQ(pair.fake[0][1]->accepted, "record-lane1-1");
      EXPECT_EQ(pair.fake[1][1]->completed_with, "answer-1");
    }
    ASSERT_TRUE(pair.m[0]->rails()[1].up) << kind.name;
    ASSERT_TRUE(pair.m[1]->rails()[1].up) << kind.name;
    const auto sent = pattern(2 << 20, 4);
    std::vector<uint8_t> got(sent.size(), 0);
    auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
    auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
    pair.deliverAll();
    expectDone(*pair.mesh[1], recv);
    EXPECT_EQ(got, sent);
    EXPECT_GT(pair.m[0]->bytesSent(1), 0u) << kind.name << ": the re-admitted link carries data";
  }
}

TEST(Messenger, AMismatchedTagIsRefusedBeforeAByteLandsOnEveryKindOfLink) {
  for (const auto& kind : {socketLike("rail", 10), laneLike("lane", 10), channelLike("shm")}) {
    Pair pair({kind}, {true});
    const auto sent = pattern(20000, 5);
    std::vector<uint8_t> got(sent.size(), 0xAB);
    auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(7, 1));
    pair.m[0]->isend(sent.data(), sent.size(), tagOf(7, 2));
    pair.deliverAll();
    const std::string receiver = errorOf<MismatchError>(
        [&] { pair.mesh[1]->wait(recv, deadlineAfter(std::chrono::seconds(1))); });
    EXPECT_NE(receiver.find("rank 1: rank 0 sent a message with another tag"), std::string::npos)
        << kind.name << ": " << receiver;
    const std::string sender = errorOf<MismatchError>([&] { pair.mesh[0]->checkHealthy(); });
    EXPECT_NE(sender.find("[reported by rank 1]"), std::string::npos)
        << kind.name << ": " << sender;
    EXPECT_EQ(std::count(got.begin(), got.end(), 0xAB), static_cast<long>(got.size()))
        << kind.name << ": a byte landed";
  }
}

TEST(Messenger, APeerLostWhileAReceiveWaitsIsPeerLostErrorWithinItsDeadline) {
  Pair pair({socketLike("rail", 10), laneLike("lane", 10)}, {false, true});
  std::vector<uint8_t> got(1000);
  auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
  std::string error;
  const Clock::time_point start = Clock::now();
  std::thread waiter([&] {
    error = errorOf<PeerLostError>(
        [&] { pair.mesh[1]->wait(recv, deadlineAfter(std::chrono::seconds(10))); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    // The connection that ends with the peer's process ends without a goodbye.
    auto guard = pair.m[1]->guard();
    pair.m[1]->linkFailedLocked(0, "connection closed by the peer", true);
  }
  waiter.join();
  EXPECT_LT(secondsSince(start), 2.0) << "the waiter woke at the failure, not its deadline";
  EXPECT_NE(error.find("rank 1: lost connection to rank 0: connection closed by the peer"),
            std::string::npos)
      << error;
  ASSERT_EQ(pair.mesh[1]->lostPeers().size(), 1u);
  EXPECT_EQ(pair.mesh[1]->lostPeers()[0].rank, 0);
}

TEST(Messenger, ClosingWhileSendsAreQueuedDeliversThemThenSaysGoodbye) {
  Pair pair({laneLike("lane", 10)}, {true});
  pair.fake[0][0]->room = 1;  // one frame at a time: the rest wait in the messenger
  const auto sent = pattern(50000, 6);
  std::vector<RequestPtr> sends;
  for (uint64_t i = 0; i < 3; ++i)
    sends.push_back(pair.m[0]->isend(sent.data(), sent.size(), tagOf(i)));
  pair.m[0]->sayGoodbye();
  EXPECT_FALSE(pair.m[0]->drained()) << "frames are still queued";
  std::vector<std::vector<uint8_t>> got(3, std::vector<uint8_t>(sent.size()));
  std::vector<RequestPtr> recvs;
  for (uint64_t i = 0; i < 3; ++i)
    recvs.push_back(pair.m[1]->irecv(got[i].data(), sent.size(), tagOf(i)));
  pair.deliverAll();
  EXPECT_TRUE(pair.m[0]->drained());
  for (uint64_t i = 0; i < 3; ++i) {
    expectDone(*pair.mesh[1], recvs[i]);
    expectDone(*pair.mesh[0], sends[i]);
    EXPECT_EQ(got[i], sent);
  }
  // The goodbye said three messages: a fourth receive is for a peer that is gone.
  std::vector<uint8_t> more(10);
  const std::string error =
      errorOf<PeerLostError>([&] { pair.m[1]->irecv(more.data(), more.size(), tagOf(3)); });
  EXPECT_NE(error.find("cannot receive message #3 from rank 0: it closed its communicator"),
            std::string::npos)
      << error;
}

TEST(Messenger, APeerSilentPastTheHeartbeatTimeoutIsLost) {
  Clock::time_point t = Clock::now();
  Pair pair(
      {socketLike("rail", 10)}, {true}, [&] { return t; }, std::chrono::seconds(10));
  // Every 4 s both tick (a ping every fifth of the timeout); rank 0 hears rank 1 until t = 4 s.
  auto tick = [&] {
    pair.m[0]->tick();
    pair.m[1]->tick();
  };
  // Rank 0 awaits a message: only an awaited peer's silence counts (and each awaits the
  // other, so that each pings).
  std::vector<uint8_t> in0(8);
  std::vector<uint8_t> in1(8);
  auto r0 = pair.m[0]->irecv(in0.data(), in0.size(), tagOf(0));
  auto r1 = pair.m[1]->irecv(in1.data(), in1.size(), tagOf(0));
  tick();
  t += std::chrono::seconds(4);
  tick();
  ASSERT_GT(pair.deliver(1, 0), 0) << "rank 1's ping";
  t += std::chrono::seconds(4);
  tick();
  EXPECT_NO_THROW(pair.mesh[0]->checkHealthy());
  t += std::chrono::seconds(4);
  tick();
  EXPECT_NO_THROW(pair.mesh[0]->checkHealthy()) << "heard 8 s ago";
  t += std::chrono::seconds(3);
  pair.m[0]->tick();
  const std::string error = errorOf<PeerLostError>([&] { pair.mesh[0]->checkHealthy(); });
  EXPECT_NE(error.find("rank 0: rank 1 stopped answering: nothing heard from it for 11.0 s"),
            std::string::npos)
      << error;
}

// A peer nothing is awaited from is not pinged, and its silence is not held against it: an
// idle pair exchanges nothing (at 256 ranks every rank pinging every peer starved the job).
// Once a receive is posted the silence counts from then (the last tick before it), not from
// the last frame heard.
TEST(Messenger, OnlyAnAwaitedPeerIsPingedAndItsSilenceCountsFromTheWait) {
  Clock::time_point t = Clock::now();
  Pair pair(
      {socketLike("rail", 10)}, {true}, [&] { return t; }, std::chrono::seconds(10));
  for (int i = 0; i < 10; ++i) {
    t += std::chrono::seconds(4);
    pair.m[0]->tick();
    pair.m[1]->tick();
  }
  EXPECT_EQ(pair.deliver(0, 0), 0) << "rank 0 pinged an idle peer";
  EXPECT_EQ(pair.deliver(1, 0), 0) << "rank 1 pinged an idle peer";
  EXPECT_NO_THROW(pair.mesh[0]->checkHealthy()) << "40 s of an idle peer's silence counted";
  std::vector<uint8_t> in(8);
  auto request = pair.m[0]->irecv(in.data(), in.size(), tagOf(0));
  pair.m[0]->tick();
  EXPECT_EQ(pair.deliver(0, 0), 1) << "an awaited peer is pinged";
  // Rank 1 is stopped from here on: the wait is lost 10 s after it began.
  for (int second = 1; second <= 10; ++second) {
    t += std::chrono::seconds(1);
    pair.m[0]->tick();
    ASSERT_NO_THROW(pair.mesh[0]->checkHealthy()) << second << " s into the wait";
  }
  t += std::chrono::seconds(1);
  pair.m[0]->tick();
  const std::string error = errorOf<PeerLostError>([&] { pair.mesh[0]->checkHealthy(); });
  EXPECT_NE(error.find("rank 0: rank 1 stopped answering: nothing heard from it for 11.0 s"),
            std::string::npos)
      << error;
}

// A lane connected when the pair first talks: the first send waits for it, the rank that does
// not initiate asks for it over the control link, the records are exchanged there, the lane is
// probed, and the send goes on it.
TEST(Messenger, LinksConnectedOnFirstUseCarryTheSendsMadeBefore) {
  Pair pair({socketLike("control", 1), laneLike("lane", 10)}, {false, true}, nullptr,
            Duration::zero(), {true, false});
  const auto sent = pattern(100000, 7);
  std::vector<uint8_t> got(sent.size());
  auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
  EXPECT_FALSE(send->done());
  EXPECT_EQ(pair.fake[0][1]->posts, 0) << "nothing goes before the lane is up";
  auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
  pair.deliverAll();
  expectDone(*pair.mesh[0], send);
  expectDone(*pair.mesh[1], recv);
  EXPECT_EQ(got, sent);
  EXPECT_EQ(pair.fake[0][1]->accepted, "record-lane-1") << "rank 0 accepted rank 1's record";
  EXPECT_EQ(pair.fake[1][1]->completed_with, "answer-1");
  EXPECT_EQ(pair.m[0]->bytesSent(1), sent.size());
  EXPECT_EQ(pair.m[0]->bytesSent(0), 0u) << "the control link carries no data";
}

TEST(Messenger, BothRanksDialAFirstUseSocketAndTheHigherRanksConnectionIsKept) {
  // A socket connected on first use (RAILSHARD_TCP_CONNECT=lazy), used by both ranks at once:
  // each dials. The lower rank accepts the higher's dial although it dials too; the higher
  // refuses the lower's while its own is under way; once one is taken, no second is.
  Pair pair({socketLike("tcp", 10)}, {true}, nullptr, Duration::zero(), {false});
  const auto sent0 = pattern(70000, 1), sent1 = pattern(300, 2);
  std::vector<uint8_t> got0(sent1.size()), got1(sent0.size());
  auto send0 = pair.m[0]->isend(sent0.data(), sent0.size(), tagOf(0));
  auto recv0 = pair.m[0]->irecv(got0.data(), got0.size(), tagOf(0));
  auto send1 = pair.m[1]->isend(sent1.data(), sent1.size(), tagOf(0));
  auto recv1 = pair.m[1]->irecv(got1.data(), got1.size(), tagOf(0));
  ASSERT_EQ(pair.fake[0][0]->redials, std::vector<uint32_t>{1}) << "rank 0 dials at its send";
  ASSERT_EQ(pair.fake[1][0]->redials, std::vector<uint32_t>{1}) << "rank 1 dials at its send";
  EXPECT_EQ(pair.fake[0][0]->posts + pair.fake[1][0]->posts, 0) << "nothing goes before it is up";
  {
    auto guard = pair.m[1]->guard();
    EXPECT_FALSE(pair.m[1]->redialWantedLocked(0, 1)) << "the higher rank takes its own dial";
  }
  {
    auto guard = pair.m[0]->guard();
    EXPECT_FALSE(pair.m[0]->redialWantedLocked(0, 2)) << "only generation 1";
    ASSERT_TRUE(pair.m[0]->redialWantedLocked(0, 1)) << "the lower rank takes the higher's";
    pair.m[0]->dialAcceptedLocked(0);
    EXPECT_FALSE(pair.m[0]->redialWantedLocked(0, 1)) << "one connection, not a second";
  }
  pair.m[0]->tick();  // an accepted dial is not dialled again
  EXPECT_EQ(pair.fake[0][0]->redials.size(), 1u);
  pair.upBoth(0, 1);
  pair.deliverAll();
  expectDone(*pair.mesh[0], send0);
  expectDone(*pair.mesh[1], send1);
  expectDone(*pair.mesh[0], recv0);
  expectDone(*pair.mesh[1], recv1);
  EXPECT_EQ(got1, sent0);
  EXPECT_EQ(got0, sent1);
}

TEST(Messenger, LanesConnectedOnFirstUseWaitForAFirstUseSocketToCarryTheirRecords) {
  // Both made on first use: the lane's records go once the socket beside it is up.
  Pair pair({socketLike("control", 1), laneLike("lane", 10)}, {false, true}, nullptr,
            Duration::zero(), {false, false});
  const auto sent = pattern(100000, 9);
  std::vector<uint8_t> got(sent.size());
  auto send = pair.m[0]->isend(sent.data(), sent.size(), tagOf(0));
  auto recv = pair.m[1]->irecv(got.data(), got.size(), tagOf(0));
  ASSERT_EQ(pair.fake[0][0]->redials, std::vector<uint32_t>{1});
  EXPECT_TRUE(pair.fake[1][1]->accepted.empty() && pair.fake[0][0]->control.empty() &&
              pair.fake[1][0]->control.empty())
      << "no record before a link can carry it";
  pair.upBoth(0, 1);
  pair.deliverAll();
  expectDone(*pair.mesh[0], send);
  expectDone(*pair.mesh[1], recv);
  EXPECT_EQ(got, sent);
  EXPECT_EQ(pair.fake[0][1]->accepted, "record-lane-1");
  EXPECT_EQ(pair.m[0]->bytesSent(1), sent.size());
}

// What an offer or a grant carries: the buffer's address and one key per link of the pair.
TEST(MemoryDescriptor, RoundTripsAndRejectsWhatDoesNotFitThePair) {
  using transport::messaging::MemoryDescriptor;
  MemoryDescriptor in;
  in.address = 0x7f00123456789000ull;
  in.keys = {0, 0x11223344u, 0xa5a5a5a5u};
  const std::string text = in.encode();
  const std::vector<uint8_t> bytes(text.begin(), text.end());
  ASSERT_EQ(bytes.size(), 34u);
  const MemoryDescriptor out = MemoryDescriptor::decode(bytes, 3);
  EXPECT_EQ(out.address, in.address);
  EXPECT_EQ(out.keys, in.keys);
  auto expectRejected = [](const std::vector<uint8_t>& b, size_t links, const std::string& what) {
    try {
      MemoryDescriptor::decode(b, links);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expectRejected(bytes, 4, "of 34 bytes (expected 42 for 4 links)");
  std::vector<uint8_t> four = bytes;
  four[8] = 4;  // claims four keys in the room of three
  expectRejected(four, 3, "for 4 links on a pair of 3");
  MemoryDescriptor null_address = in;
  null_address.address = 0;
  const std::string null_text = null_address.encode();
  expectRejected(std::vector<uint8_t>(null_text.begin(), null_text.end()), 3, "null address");
}

}  // namespace
}  // namespace railshard::test
