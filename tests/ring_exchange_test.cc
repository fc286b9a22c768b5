// The start-up ring (transport/bootstrap/ring_exchange.h) against a real store server: what it
// costs the store, that every rank gets every value in rank order, and how it fails.
#include "transport/bootstrap/ring_exchange.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "tests/expect_error.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

using namespace std::chrono_literals;
using transport::bootstrap::RingExchange;
using transport::bootstrap::RingOptions;

constexpr char kToken[] = "ring-test-token";

struct Server {
  launcher::TcpStoreServer server{transport::links::tcp::resolve("127.0.0.1:0", "test"), kToken};
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

RingOptions ringOptions(int rank, int size, Duration timeout = 30s) {
  RingOptions options;
  options.rank = rank;
  options.size = size;
  options.token = kToken;
  options.key_prefix = "job";
  options.timeout = timeout;
  return options;
}

// Rank r's value for call `call`: sizes differ by rank, and one rank's is larger than the
// sockets' buffers, so that sends and receives must go side by side.
std::string valueOf(int rank, int call) {
  const size_t bytes = rank == 1 ? (4u << 20) : static_cast<size_t>(1 + rank * 37 + call);
  std::string value(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) value[i] = static_cast<char>('a' + (i + rank + call) % 26);
  return value;
}

TEST(RingExchange, EveryRankGetsEveryValueInRankOrderForTwoStoreRequestsPerRank) {
  for (const int size : {2, 3, 8}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Server store;
    test::rethrowFirst(test::runRanks(size, [&](int rank) {
      launcher::TcpStore client(store.address(), kToken, 30s);
      RingExchange ring(client, ringOptions(rank, size));
      for (int call = 0; call < 3; ++call) {
        const auto values = ring.allGather(valueOf(rank, call), "call " + std::to_string(call));
        ASSERT_EQ(values.size(), static_cast<size_t>(size));
        for (int r = 0; r < size; ++r) {
          ASSERT_EQ(values[static_cast<size_t>(r)], valueOf(r, call))
              << "rank " << rank << ", value of rank " << r << ", call " << call;
        }
      }
    }));
    // Each rank published its address and read its successor's; the all-gathers asked nothing.
    const launcher::StoreStats stats = store.server.stats();
    EXPECT_EQ(stats.sets, static_cast<uint64_t>(size)) << stats.describe();
    EXPECT_EQ(stats.gets, static_cast<uint64_t>(size)) << stats.describe();
    EXPECT_EQ(stats.requests(), static_cast<uint64_t>(2 * size)) << stats.describe();
  }
}

TEST(RingExchange, OneRankAsksTheStoreNothing) {
  Server store;
  launcher::TcpStore client(store.address(), kToken, 30s);
  RingExchange ring(client, ringOptions(0, 1));
  EXPECT_EQ(ring.allGather("only", "alone"), std::vector<std::string>{"only"});
  EXPECT_EQ(store.server.stats().requests(), 0u);
}

TEST(RingExchange, ACallOtherRanksDoNotMakeIsAMismatchNamingIt) {
  Server store;
  constexpr int kSize = 4;
  const auto errors = test::runRanks(kSize, [&](int rank) {
    launcher::TcpStore client(store.address(), kToken, 30s);
    RingExchange ring(client, ringOptions(rank, kSize, 5s));
    ring.allGather("same", "first");
    ring.allGather("x", rank == 2 ? "host identity" : "tcp listeners");
  });
  // Rank 2's successor and rank 2 itself see the other call; the rest lose a neighbour that
  // gave up, or time out: every rank fails, none hangs.
  for (int r = 0; r < kSize; ++r) ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r;
  for (const int r : {2, 3}) {
    test::expectError<MismatchError>(errors[static_cast<size_t>(r)],
                                     "is at another start-up exchange",
                                     "rank " + std::to_string(r));
  }
}

TEST(RingExchange, ARankThatNeverComesIsATimeoutNamingIt) {
  Server store;
  constexpr int kSize = 3;
  const auto errors = test::runRanks(kSize, [&](int rank) {
    if (rank == 1) return;  // never joins
    launcher::TcpStore client(store.address(), kToken, 30s);
    RingExchange ring(client, ringOptions(rank, kSize, 1s));
  });
  // Rank 0 waits for rank 1's address; rank 2 waits for rank 1 to connect, and goes on
  // waiting when rank 0 gives up first and its listener resets rank 2's connection (a CI run
  // saw rank 2 call that a refusal, "a different RAILSHARD_TOKEN?", a second before its own
  // deadline): its error is rank 1's absence.
  test::expectError<TimeoutError>(errors[0], "job/boot/1", "rank 0");
  test::expectError<TimeoutError>(
      errors[2], "rank 1 (its predecessor in the start-up ring) did not connect", "rank 2");
}

// A successor that goes away with this rank's connection still in its backlog (its listener
// closed: it gave up on a wait of its own, or exited) resets the connection. That is not a
// refusal (no "a different RAILSHARD_TOKEN?"): the rank goes on waiting for its predecessor and
// reports its absence at its deadline — also after the reset, when the socket reads as closed.
TEST(RingExchange, ASuccessorThatWentAwayIsNotARefusal) {
  Server store;
  launcher::TcpStore client(store.address(), kToken, 30s);
  // Rank 1 of 2, whose successor and predecessor are rank 0: here a listener that takes
  // nothing and closes 200 ms after rank 1 has connected.
  transport::links::tcp::Fd listener = transport::links::tcp::listenOn(
      transport::links::tcp::resolve("127.0.0.1:0", "the successor's listener"));
  client.setString("job/boot/0", transport::links::tcp::localAddress(listener.get()).toString(),
                   5s);
  std::thread closer([&] {
    std::this_thread::sleep_for(200ms);
    listener.reset();
  });
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error;
  try {
    RingExchange ring(client, ringOptions(1, 2, 1s));
  } catch (...) {
    error = std::current_exception();
  }
  closer.join();
  test::expectError<TimeoutError>(
      error, "rank 0 (its predecessor in the start-up ring) did not connect", "rank 1");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms);
}

TEST(RingExchange, ARankGoneMidExchangeIsPeerLostOnItsNeighbours) {
  Server store;
  constexpr int kSize = 4;
  const auto errors = test::runRanks(kSize, [&](int rank) {
    launcher::TcpStore client(store.address(), kToken, 30s);
    RingExchange ring(client, ringOptions(rank, kSize, 20s));
    ring.allGather("first", "first");
    if (rank == 2) return;  // its sockets close here
    ring.allGather("second", "second");
  });
  EXPECT_FALSE(errors[2]);
  // Rank 3 receives from rank 2; rank 1 sends to it (and may get its value in first).
  test::expectError<PeerLostError>(errors[3], "rank 2 (previous in the ring) closed its connection",
                                   "rank 3");
  for (const int r : {0, 1}) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r << " finished without an error";
  }
}

}  // namespace
}  // namespace railshard
