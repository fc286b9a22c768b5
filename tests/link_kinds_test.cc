// The messenger's scenarios over real links of every kind, through communicators of thread
// ranks: TCP connections on loopback, RDMA lanes over the in-process libibverbs emulation
// (tests/fakes/fake_ibverbs.cc), and the shared-memory channel between two ranks of one host.
// The messenger's unit tests (tests/messenger_test.cc) script the same scenarios over fake
// links; here the drivers, the wire and the peer's parser are real. The reference is a byte
// pattern that is a function of (message, byte), regenerated on the receiving side.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "tests/test_util.h"
#include "transport/transport.h"
#ifdef FAKE_IBVERBS_PATH
#include "tests/over_emulation.h"
#endif

namespace railshard {
namespace {

#ifdef FAKE_IBVERBS_PATH
// Points the RDMA links at the emulation and checks every verbs object is freed.
using Fixture = OverEmulation;
#else
// Built without infiniband/verbs.h: the TCP and shared-memory kinds only.
using Fixture = ::testing::Test;
Config rdmaConfig() {
  return Config();
}
std::string messageOf(const std::exception_ptr& error) {
  if (!error) return "(no error)";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}
#endif

// Sizes around every boundary that matters to some link: empty, one byte, a slot of the small
// RDMA rings (8 KiB), a mail entry (64 KiB) and one more, past the copy threshold, megabytes.
const std::vector<size_t> kSizes = {0, 1, 8191, 8193, 65536, 65537, 300000, (1 << 20) + 7, 3 << 20};

uint8_t patternByte(size_t message, size_t i) {
  return static_cast<uint8_t>(i * 131 + message * 29 + 7);
}

std::vector<uint8_t> patternOf(size_t message, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = patternByte(message, i);
  return out;
}

struct Kind {
  const char* name;
  TransportKind transport;
};

class LinkKinds : public Fixture, public ::testing::WithParamInterface<Kind> {
 protected:
  Config config() const {
    Config config = GetParam().transport == TransportKind::kIbverbs ? rdmaConfig() : Config();
    config.transport = GetParam().transport;
    config.timeout = std::chrono::seconds(30);
    config.connect_timeout = std::chrono::seconds(30);
    return config;
  }
  std::unique_ptr<Communicator> open(Store& store, int rank) const {
    Communicator::Options options;
    options.rank = rank;
    options.size = 2;
    options.config = config();
    return Communicator::create(store, options);
  }
  // What carried the pair's messages, from rank 1's side: RDMA lanes and TCP connections are
  // rails (with bytes), the shared-memory channel is not a rail.
  void expectCarriedBy(Communicator& comm) const {
    const std::string name(comm.transport().name());
    if (GetParam().transport == TransportKind::kIbverbs) {
      EXPECT_EQ(name, "ibverbs");
    } else {
      EXPECT_EQ(name, "tcp");
    }
    if (GetParam().transport == TransportKind::kShm) {
      EXPECT_TRUE(comm.usesSharedMemory());
      for (const auto& rail : comm.transport().rails()) EXPECT_EQ(rail.bytes_sent, 0u) << rail.name;
    }
  }
};

// A rank that posts its sends and closes its communicator at once, never waiting: closing
// drains what is queued behind a goodbye (bounded by the linger), so the peer receives every
// message exactly, and then learns that the rank closed — a receive beyond the last message is
// a PeerLostError saying so, not a hang to the deadline.
TEST_P(LinkKinds, ClosingWithSendsQueuedDeliversThemThenSaysGoodbye) {
  MemoryStore store;
  std::vector<std::vector<uint8_t>> outgoing;
  for (size_t m = 0; m < kSizes.size(); ++m) outgoing.push_back(patternOf(m, kSizes[m]));
  std::atomic<bool> posted{false};
  std::string after_close;
  const auto errors = test::runRanks(2, [&](int rank) {
    auto comm = open(store, rank);
    if (rank == 0) {
      comm->barrier();
      for (size_t m = 0; m < outgoing.size(); ++m) {
        comm->isend(outgoing[m].data(), outgoing[m].size(), DataType::kUInt8, 1, 4);
      }
      posted = true;
      comm.reset();  // closes with every send still queued or in flight
      return;
    }
    expectCarriedBy(*comm);
    comm->barrier();
    while (!posted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (size_t m = 0; m < kSizes.size(); ++m) {
      std::vector<uint8_t> in(kSizes[m], 0xEE);
      comm->recv(in.data(), in.size(), DataType::kUInt8, 0, 4);
      ASSERT_EQ(in, patternOf(m, kSizes[m])) << "message " << m << " of " << kSizes[m] << " bytes";
    }
    uint8_t one = 0;
    try {
      comm->recv(&one, 1, DataType::kUInt8, 0, 4, std::chrono::seconds(20));
      after_close = "(no error)";
    } catch (const PeerLostError& e) {
      after_close = e.what();
    } catch (const std::exception& e) {
      after_close = std::string("wrong type: ") + e.what();
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(errors[static_cast<size_t>(rank)])
        << "rank " << rank << ": " << messageOf(errors[static_cast<size_t>(rank)]);
  }
  EXPECT_NE(after_close.find("rank 1: cannot receive"), std::string::npos) << after_close;
  EXPECT_NE(after_close.find("from rank 0"), std::string::npos) << after_close;
  EXPECT_NE(after_close.find("it closed its communicator"), std::string::npos) << after_close;
}

// Many messages of every size both ways at once, receives posted in a random order relative
// to the sends, waited in reverse: each kind of link reassembles every message exactly.
TEST_P(LinkKinds, MessagesBothWaysAtOnceArriveExactly) {
  MemoryStore store;
  const auto errors = test::runRanks(2, [&](int rank) {
    auto comm = open(store, rank);
    const int peer = 1 - rank;
    std::vector<std::vector<uint8_t>> out;
    std::vector<std::vector<uint8_t>> in;
    for (size_t m = 0; m < kSizes.size(); ++m) {
      out.push_back(patternOf(m * 2 + static_cast<size_t>(rank), kSizes[m]));
      in.emplace_back(kSizes[m], 0xEE);
    }
    std::vector<Communicator::P2PRequest> requests;
    for (size_t m = 0; m < kSizes.size(); ++m) {
      // Rank 0 posts each receive before its send, rank 1 after: early messages are staged.
      if (rank == 0)
        requests.push_back(comm->irecv(in[m].data(), in[m].size(), DataType::kUInt8, peer, 2));
      requests.push_back(comm->isend(out[m].data(), out[m].size(), DataType::kUInt8, peer, 2));
      if (rank == 1)
        requests.push_back(comm->irecv(in[m].data(), in[m].size(), DataType::kUInt8, peer, 2));
    }
    for (auto it = requests.rbegin(); it != requests.rend(); ++it) comm->wait(*it);
    for (size_t m = 0; m < kSizes.size(); ++m) {
      ASSERT_EQ(in[m], patternOf(m * 2 + static_cast<size_t>(peer), kSizes[m]))
          << "rank " << rank << ", message " << m << " of " << kSizes[m] << " bytes";
    }
    expectCarriedBy(*comm);
    comm->barrier();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(errors[static_cast<size_t>(rank)])
        << "rank " << rank << ": " << messageOf(errors[static_cast<size_t>(rank)]);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryKind, LinkKinds,
                         ::testing::Values(Kind{"tcp", TransportKind::kTcp},
#ifdef FAKE_IBVERBS_PATH
                                           Kind{"rdma", TransportKind::kIbverbs},
#endif
                                           Kind{"shm", TransportKind::kShm}),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace railshard
