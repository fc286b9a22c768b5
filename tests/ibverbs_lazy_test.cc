// RDMA lanes connected when a pair first talks (RAILSHARD_IB_CONNECT, ibverbs_transport_lazy.cc)
// over the in-process libibverbs emulation: a ring all-reduce connects each rank to its two
// neighbours only (fewer verbs objects than eager start-up, counted by the emulation), every
// result exact against a scalar loop; a one-way send completes before its receiver ever asked
// for the peer (the store notice); a first message that is a rendezvous is exact; auto is
// eager up to 8 RDMA peers, lazy beyond. A failed lazy lane with nothing to fail over to:
// ibverbs_rendezvous_test's AQueuePairFailingDuringARendezvousIsPeerLostOnEveryRank.
#include <gtest/gtest.h>

#ifdef FAKE_IBVERBS_PATH

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/over_emulation.h"
#include "transport/transport.h"

namespace railshard {
namespace {

// The peers whose every RDMA lane is up, and those with none up (and why, the first reason).
struct LaneView {
  std::set<int> up;
  std::set<int> down;
  std::string reason;
  uint64_t bytes = 0;  // sent over RDMA lanes
};

LaneView viewOf(Communicator& comm) {
  LaneView view;
  std::set<int> any_down;
  for (const auto& rail : comm.transport().rails()) {
    if (rail.name == "tcp") continue;
    view.bytes += rail.bytes_sent;
    if (rail.up) {
      view.up.insert(rail.peer);
    } else {
      any_down.insert(rail.peer);
      if (view.reason.empty()) view.reason = rail.down_reason;
    }
  }
  for (int peer : any_down) {
    view.up.erase(peer);
    view.down.insert(peer);
  }
  return view;
}

std::set<int> neighboursOf(int rank, int size) {
  return {(rank + 1) % size, (rank + size - 1) % size};
}

TEST_F(OverEmulation, LazyLanesConnectOnlyThePairsARingAllreduceUses) {
  constexpr int kSize = 6;
  std::vector<LaneView> before(kSize), after(kSize);
  std::vector<int> objects(2);  // verbs objects alive after the all-reduces: eager, lazy
  for (LaneConnect connect : {LaneConnect::kEager, LaneConnect::kLazy}) {
    const bool lazy = connect == LaneConnect::kLazy;
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    Config config = rdmaConfig();
    config.rdma.connect = connect;
    config.algorithm = "ring";
    std::atomic<int> looked{0};
    std::atomic<int> finished{0};
    std::atomic<bool> counted{false};
    test::rethrowFirst(withRanks(kSize, config, [&](Communicator& comm) {
      const auto rank = static_cast<size_t>(comm.rank());
      if (lazy) before[rank] = viewOf(comm);
      // Traffic starts once every rank has looked (a faster rank's first send would connect
      // its neighbours' lanes before they looked).
      ++looked;
      const auto start_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (looked.load() < kSize && std::chrono::steady_clock::now() < start_by) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      checkAllreducesAndBroadcast(comm, {1, 1000, 100000}, 0);
      // A ring broadcast goes round the ring too: still only neighbours.
      if (lazy) after[rank] = viewOf(comm);
      // Rank 0 counts once every rank is done and before any closes: nothing is connected or
      // closed meanwhile.
      ++finished;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (finished.load() < kSize && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (rank == 0) {
        objects[lazy ? 1 : 0] = hooks_.live_objects();
        counted = true;
      }
      while (!counted.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }));
  }
  for (int r = 0; r < kSize; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(before[static_cast<size_t>(r)].up.empty()) << "a lane up before any traffic";
    EXPECT_EQ(before[static_cast<size_t>(r)].down.size(), static_cast<size_t>(kSize - 1));
    EXPECT_NE(before[static_cast<size_t>(r)].reason.find("not connected yet"), std::string::npos)
        << before[static_cast<size_t>(r)].reason;
    EXPECT_EQ(after[static_cast<size_t>(r)].up, neighboursOf(r, kSize));
    EXPECT_EQ(after[static_cast<size_t>(r)].down.size(), static_cast<size_t>(kSize - 3));
    EXPECT_GT(after[static_cast<size_t>(r)].bytes, 0u);
  }
  // Eager: 6 x 5 lanes x 2 rails, each a queue pair and two registered rings; lazy: 6 x 2.
  EXPECT_LT(objects[1], objects[0]) << "eager " << objects[0] << " vs lazy " << objects[1];
}

TEST_F(OverEmulation, AOneWaySendConnectsThroughTheStoreNotice) {
  Config config = rdmaConfig();
  config.rdma.connect = LaneConnect::kLazy;
  config.rdma.readmit = std::chrono::milliseconds(50);  // how often a notice is looked for
  std::atomic<bool> sent{false};
  std::vector<int64_t> received(25000, -1);
  std::vector<LaneView> views(2);
  test::rethrowFirst(withRanks(2, config, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<int64_t> data(received.size());
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int64_t>(i * 7 + 1);
      // Completes with rank 1 not yet asking for rank 0: only the notice connects the lanes.
      comm.send(data.data(), data.size(), DataType::kInt64, 1, 5);
      sent = true;
    } else {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!sent.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(sent.load()) << "the send never completed";
      comm.recv(received.data(), received.size(), DataType::kInt64, 0, 5);
    }
    views[static_cast<size_t>(comm.rank())] = viewOf(comm);
    comm.barrier();
  }));
  for (size_t i = 0; i < received.size(); ++i) {
    ASSERT_EQ(received[i], static_cast<int64_t>(i * 7 + 1)) << "element " << i;
  }
  EXPECT_EQ(views[0].up, (std::set<int>{1}));
  EXPECT_EQ(views[1].up, (std::set<int>{0}));
  EXPECT_GE(views[0].bytes, received.size() * sizeof(int64_t));
}

// The first message between a pair is a rendezvous: the offer can arrive before the
// receiver's own probe is acknowledged; the lane is up for it then (an arrival says both sides
// are connected), so it is read or granted over it, not refused for want of a rail.
TEST_F(OverEmulation, AFirstMessageThatIsARendezvousIsExact) {
  ScopedEnv one_rail("FAKE_IBVERBS_DEVICES", "1");
  for (RendezvousVerb verb : {RendezvousVerb::kRead, RendezvousVerb::kWrite}) {
    SCOPED_TRACE(verb == RendezvousVerb::kRead ? "read" : "write");
    for (int round = 0; round < 3; ++round) {
      Config config = rdmaConfig();
      config.rdma.connect = LaneConnect::kLazy;
      config.chunk_bytes = 4 << 20;
      config.rdma.rendezvous_bytes = 64 << 10;
      config.rdma.rendezvous_verb = verb;
      std::vector<uint64_t> in_place(3);
      test::rethrowFirst(withRanks(3, config, [&](Communicator& comm) {
        checkAllreducesAndBroadcast(comm, {1 << 20}, 2);
        for (const auto& rail : comm.transport().rails()) {
          in_place[static_cast<size_t>(comm.rank())] += rail.bytes_in_place;
        }
        comm.barrier();
      }));
      for (size_t r = 0; r < 3; ++r) EXPECT_GT(in_place[r], 0u) << "rank " << r;
    }
  }
}

TEST_F(OverEmulation, AutoConnectsEagerlyUpToEightPeersAndLazilyBeyond) {
  for (int size : {3, 10}) {
    SCOPED_TRACE(std::to_string(size) + " ranks");
    Config config = rdmaConfig();  // RAILSHARD_IB_CONNECT=auto
    config.algorithm = "ring";
    std::vector<LaneView> at_start(static_cast<size_t>(size)), after(static_cast<size_t>(size));
    std::atomic<int> looked{0};
    std::atomic<int> finished{0};
    test::rethrowFirst(withRanks(size, config, [&](Communicator& comm) {
      const auto rank = static_cast<size_t>(comm.rank());
      at_start[rank] = viewOf(comm);
      // Traffic starts once every rank has looked (a faster rank's first send would connect
      // its neighbours' lanes before they looked).
      ++looked;
      const auto start_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (looked.load() < size && std::chrono::steady_clock::now() < start_by) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      checkAllreducesAndBroadcast(comm, {1000}, 1);
      after[rank] = viewOf(comm);
      // Every rank stays until all have looked (no collective: a barrier's pairs would connect
      // more lanes while a slower rank has yet to look).
      ++finished;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (finished.load() < size && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }));
    for (int r = 0; r < size; ++r) {
      const auto& start = at_start[static_cast<size_t>(r)];
      SCOPED_TRACE("rank " + std::to_string(r));
      if (size == 3) {
        EXPECT_EQ(start.up.size(), 2u);
        EXPECT_TRUE(start.down.empty());
      } else {
        EXPECT_TRUE(start.up.empty());
        EXPECT_EQ(after[static_cast<size_t>(r)].up, neighboursOf(r, size));
      }
    }
  }
}

}  // namespace
}  // namespace railshard

#else
TEST(IbverbsLazy, NotBuilt) {
  GTEST_SKIP() << "built without infiniband/verbs.h: no RDMA transport and no emulation";
}
#endif
