// The RDMA transport's zero-copy rendezvous (ibverbs_transport_rendezvous*.cc) over the
// in-process libibverbs emulation: large messages are read by the receiver straight from the
// sender's buffer, or written by the sender straight into the buffer the receiver granted.
// Checked here: the bytes land exactly on the three paths (read, write, and copied through
// the slots with RAILSHARD_IB_RENDEZVOUS=0), whichever of send and receive is posted first,
// in both directions at once; which path carried them, by the bytes each rank's lanes moved
// and the bytes the emulation saw written without an immediate (only the write rendezvous
// does that); a queue pair failing while one-sided pieces are in flight moves them to the
// other rail, or is a PeerLostError on every rank without one, and no registration outlives
// the communicators (the fixture counts every verbs object). Over a real verbs stack:
// tests/rdma_rxe_test.cc in the Soft-RoCE guest.
#include <gtest/gtest.h>

#ifdef FAKE_IBVERBS_PATH

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "tests/over_emulation.h"
#include "transport/transport.h"

namespace railshard {
namespace {

constexpr size_t kThreshold = 64 << 10;

// Element i of the message `size` elements long that `from` sends: differs per message, per
// sender and per position.
int32_t pattern(int from, size_t size, size_t i) {
  return static_cast<int32_t>(i * 2654435761u) ^ static_cast<int32_t>(size * 31 + from);
}

uint64_t bytesMoved(Communicator& comm) {
  uint64_t total = 0;
  for (const auto& rail : comm.transport().rails()) total += rail.bytes_sent;
  return total;
}

uint64_t plainWritten(const FakeHooks& hooks) {
  return hooks.plain_write_bytes("fake0") + hooks.plain_write_bytes("fake1");
}

const char* verbName(RendezvousVerb verb) {
  return verb == RendezvousVerb::kRead ? "read" : "write";
}

struct Moved {
  uint64_t by_sender = 0;
  uint64_t by_receiver = 0;
};

// Rank 0 sends each size to rank 1 three ways (receive posted first; send first and the
// receive late, so the message is read into a staging buffer; both directions at once), each
// checked element by element. Returns the bytes rank 0's and rank 1's lanes moved for the
// one-way messages.
Moved sendEveryWay(const Config& config, const std::vector<size_t>& sizes) {
  Moved moved;
  test::rethrowFirst(withRanks(2, config, [&](Communicator& comm) {
    const int rank = comm.rank();
    const int other = 1 - rank;
    const uint64_t before = bytesMoved(comm);
    for (size_t size : sizes) {
      std::vector<int32_t> out(size), in(size, -1);
      for (size_t i = 0; i < size; ++i) out[i] = pattern(rank, size, i);
      // Receive posted first (messages and collectives share one order per pair, so the
      // sender waits by the clock, not at a barrier).
      if (rank == 1) {
        comm.recv(in.data(), size, DataType::kInt32, 0, 1);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        comm.send(out.data(), size, DataType::kInt32, 1, 1);
      }
      // Send first; the receive posted after the offer (or the pieces) arrived.
      if (rank == 0) {
        comm.send(out.data(), size, DataType::kInt32, 1, 2);
      } else {
        auto early = in;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        comm.recv(early.data(), size, DataType::kInt32, 0, 2);
        for (size_t i = 0; i < size; ++i) {
          ASSERT_EQ(early[i], pattern(0, size, i)) << "late receive, size " << size << " at " << i;
        }
      }
      if (rank == 1) {
        for (size_t i = 0; i < size; ++i) {
          ASSERT_EQ(in[i], pattern(0, size, i)) << "posted receive, size " << size << " at " << i;
        }
      }
    }
    comm.barrier();
    (rank == 0 ? moved.by_sender : moved.by_receiver) = bytesMoved(comm) - before;
    // Both directions at once: each rank's send waits for the other's reads.
    for (size_t size : sizes) {
      std::vector<int32_t> out(size), in(size, -1);
      for (size_t i = 0; i < size; ++i) out[i] = pattern(rank, size, i);
      auto send = comm.isend(out.data(), size, DataType::kInt32, other, 3);
      auto recv = comm.irecv(in.data(), size, DataType::kInt32, other, 3);
      comm.wait(send);
      comm.wait(recv);
      for (size_t i = 0; i < size; ++i) {
        ASSERT_EQ(in[i], pattern(other, size, i)) << "both ways, size " << size << " at " << i;
      }
    }
  }));
  return moved;
}

TEST_F(OverEmulation, RendezvousAndStagedPathsDeliverEveryByteAndTheBytesSayWhichRan) {
  ASSERT_NE(hooks_.plain_write_bytes, nullptr);
  Config config = rdmaConfig();
  config.links.weights = RailWeights::kStatic;  // one-sided pieces striped over both HCAs
  config.rdma.rendezvous_bytes = kThreshold;
  config.rdma.rendezvous_verb = RendezvousVerb::kRead;
  // In int32 elements: just below, at and above the threshold, several read pieces, odd sizes.
  const std::vector<size_t> sizes = {kThreshold / 4 - 1, kThreshold / 4, kThreshold / 4 + 1,
                                     (3 << 20) / 4 + 7};
  uint64_t large = 0;  // bytes of the messages at or above the threshold, sent twice each
  uint64_t small = 0;
  for (size_t size : sizes) (size * 4 >= kThreshold ? large : small) += 2 * size * 4;

  uint64_t plain = plainWritten(hooks_);
  const Moved read = sendEveryWay(config, sizes);
  // The receiver read the large messages; the sender wrote only the small ones (its offers
  // are no payload). Barrier and small collective bytes come on top, a few KiB at most.
  EXPECT_GE(read.by_receiver, large);
  EXPECT_LT(read.by_receiver, large + (64 << 10));
  EXPECT_GE(read.by_sender, small);
  EXPECT_LT(read.by_sender, small + (64 << 10));
  EXPECT_EQ(plainWritten(hooks_), plain) << "the read rendezvous wrote without an immediate";

  config.rdma.rendezvous_verb = RendezvousVerb::kWrite;
  plain = plainWritten(hooks_);
  const Moved written = sendEveryWay(config, sizes);
  // The sender wrote every byte, the large messages' with plain writes: the one-way ones and
  // both directions' of the both-ways ones (as many bytes again). The receiver only granted.
  EXPECT_EQ(plainWritten(hooks_) - plain, 2 * large);
  EXPECT_GE(written.by_sender, large + small);
  EXPECT_LT(written.by_sender, large + small + (64 << 10));
  EXPECT_LT(written.by_receiver, 64u << 10);

  config.rdma.rendezvous_bytes = 0;
  plain = plainWritten(hooks_);
  const Moved staged = sendEveryWay(config, sizes);
  EXPECT_GE(staged.by_sender, large + small);
  EXPECT_LT(staged.by_receiver, 64u << 10);
  EXPECT_EQ(plainWritten(hooks_), plain) << "the staged path wrote without an immediate";
}

TEST_F(OverEmulation, RendezvousSurvivesARailFailingAndStaysExact) {
  // The reads (or writes) of a 4 MiB message in flight on both rails when one queue pair
  // breaks: they move to the other rail (the same bytes to the same place can be moved again)
  // and every all-reduce stays exact.
  for (RendezvousVerb verb : {RendezvousVerb::kRead, RendezvousVerb::kWrite}) {
    SCOPED_TRACE(verbName(verb));
    Config config = rdmaConfig();
    config.links.weights = RailWeights::kStatic;
    config.chunk_bytes = 4 << 20;
    config.rdma.rendezvous_bytes = kThreshold;
    config.rdma.rendezvous_verb = verb;
    const uint64_t plain = plainWritten(hooks_);
    std::vector<uint64_t> moved(2);
    test::rethrowFirst(withRanks(2, config, [&](Communicator& comm) {
      for (int iteration = 0; iteration < 20; ++iteration) {
        checkTwoRankAllreduce(comm, iteration);
        if (::testing::Test::HasFatalFailure()) return;
        if (comm.rank() == 1 && iteration == 3) breakFirstQueuePair(hooks_);
      }
      int down = 0;
      for (const auto& rail : comm.transport().rails()) down += rail.up ? 0 : 1;
      EXPECT_EQ(down, 1) << "rank " << comm.rank();
      moved[static_cast<size_t>(comm.rank())] = bytesMoved(comm);
    }));
    // 20 exchanges of 600,000 floats' halves: at least 20 x 1.2 MB moved by each rank, in
    // place (written without an immediate only by the write rendezvous).
    for (uint64_t bytes : moved) EXPECT_GE(bytes, 20u * 1200000u);
    if (verb == RendezvousVerb::kWrite) {
      EXPECT_GE(plainWritten(hooks_) - plain, 2 * 20u * 1200000u);
    } else {
      EXPECT_EQ(plainWritten(hooks_), plain);
    }
  }
}

TEST_F(OverEmulation, AQueuePairFailingDuringARendezvousIsPeerLostOnEveryRank) {
  ScopedEnv one_rail("FAKE_IBVERBS_DEVICES", "1");  // nothing to fail over to
  // Lazy too: the lanes connected on first use fail the same way (the error names the rail,
  // not "not connected yet": they had been up).
  for (const auto& [verb, connect] : {std::pair{RendezvousVerb::kRead, LaneConnect::kEager},
                                      std::pair{RendezvousVerb::kWrite, LaneConnect::kEager},
                                      std::pair{RendezvousVerb::kRead, LaneConnect::kLazy}}) {
    SCOPED_TRACE(std::string(verbName(verb)) +
                 (connect == LaneConnect::kLazy ? ", lazy lanes" : ""));
    Config config = rdmaConfig();
    config.chunk_bytes = 4 << 20;
    config.rdma.rendezvous_bytes = kThreshold;
    config.rdma.rendezvous_verb = verb;
    config.rdma.connect = connect;
    const auto errors = withRanks(3, config, [&](Communicator& comm) {
      std::vector<float> data(1 << 20, 1.0f);
      for (int i = 0; i < 200; ++i) {
        comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
        if (comm.rank() == 1 && i == 2) breakFirstQueuePair(hooks_);
      }
    });
    expectOnEveryRank<PeerLostError>(errors, "RDMA rail fake0:1");
    // Every registration of a user buffer was dropped with its communicator.
    EXPECT_EQ(hooks_.live_objects(), 0);
  }
}

}  // namespace
}  // namespace railshard

#else
TEST(IbverbsRendezvous, NotBuilt) {
  GTEST_SKIP() << "built without infiniband/verbs.h: no RDMA transport and no emulation";
}
#endif
