// Point-to-point messages and all-to-all (docs/point_to_point.md): ranks as threads of this
// process, each with its own Communicator, over real loopback TCP (and shared memory where the
// layout has it); rendezvous via MemoryStore. The reference is a byte pattern that is a
// function of (sender, receiver, message), regenerated on the receiving side.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "tests/multi_host.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

std::vector<std::exception_ptr> withRanks(
    int size, const std::function<void(Communicator&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    TransportKind transport = TransportKind::kAuto, size_t shm_slot_bytes = 0,
    bool p2p_shm = true) {
  MemoryStore store;
  return test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config.timeout = timeout;
    options.config.connect_timeout = std::chrono::seconds(30);
    options.config.transport = transport;
    options.config.shm.slot_bytes = shm_slot_bytes;
    options.config.shm.p2p = p2p_shm;
    auto comm = Communicator::create(store, options);
    body(*comm);
  });
}

// The bytes rank `from` sends to rank `to` as message `k`.
std::vector<uint8_t> pattern(int from, int to, int k, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(from) * 101 +
                                  static_cast<size_t>(to) * 7 + static_cast<size_t>(k) * 13);
  }
  return out;
}

template <typename E>
std::string messageOf(const std::exception_ptr& error) {
  if (!error) return "(no error)";
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong type: ") + e.what();
  }
}

// Every pair in both directions, every dtype, empty to 1 MiB, several messages in flight per
// pair, receives posted before the sends; waited in reverse order.
TEST(PointToPoint, EveryPairDtypeAndSizeArrivesExactly) {
  const std::vector<size_t> counts = {0, 1, 7, 1000, size_t{1} << 18};
  const std::vector<DataType> dtypes = {DataType::kFloat32, DataType::kFloat64,
                                        DataType::kUInt8,   DataType::kBFloat16,
                                        DataType::kInt64,   DataType::kFloat16};
  for (int size : {2, 3, 4}) {
    auto errors = withRanks(size, [&](Communicator& comm) {
      const int me = comm.rank();
      int k = 0;
      for (DataType dtype : dtypes) {
        for (size_t count : counts) {
          const size_t bytes = count * sizeOf(dtype);
          std::vector<std::vector<uint8_t>> in(static_cast<size_t>(size));
          std::vector<std::vector<uint8_t>> out(static_cast<size_t>(size));
          std::vector<Communicator::P2PRequest> requests;
          for (int peer = 0; peer < size; ++peer) {
            if (peer == me) continue;
            in[static_cast<size_t>(peer)].assign(bytes, 0xEE);
            requests.push_back(comm.irecv(in[static_cast<size_t>(peer)].data(), count, dtype, peer,
                                          static_cast<uint32_t>(k)));
          }
          for (int peer = 0; peer < size; ++peer) {
            if (peer == me) continue;
            out[static_cast<size_t>(peer)] = pattern(me, peer, k, bytes);
            requests.push_back(comm.isend(out[static_cast<size_t>(peer)].data(), count, dtype, peer,
                                          static_cast<uint32_t>(k)));
          }
          for (auto it = requests.rbegin(); it != requests.rend(); ++it) comm.wait(*it);
          for (int peer = 0; peer < size; ++peer) {
            if (peer == me) continue;
            if (in[static_cast<size_t>(peer)] != pattern(peer, me, k, bytes)) {
              throw std::runtime_error("rank " + std::to_string(me) + ": message " +
                                       std::to_string(k) + " from " + std::to_string(peer) +
                                       " differs");
            }
          }
          ++k;
        }
      }
    });
    test::rethrowFirst(errors);
  }
}

// Sends and receives posted on one thread, waited on another (as the PyTorch backend does),
// interleaved with collectives in the same order on both ranks of each pair.
TEST(PointToPoint, WaitedOnAnotherThreadAndInterleavedWithCollectives) {
  auto errors = withRanks(3, [&](Communicator& comm) {
    const int me = comm.rank();
    const int next = (me + 1) % 3;
    const int prev = (me + 2) % 3;
    for (int k = 0; k < 20; ++k) {
      std::vector<uint8_t> out = pattern(me, next, k, 4096 + static_cast<size_t>(k));
      std::vector<uint8_t> in(out.size());
      auto r = comm.irecv(in.data(), in.size(), DataType::kUInt8, prev, 1);
      auto s = comm.isend(out.data(), out.size(), DataType::kUInt8, next, 1);
      std::thread waiter([&] {
        comm.wait(s);
        comm.wait(r);
      });
      waiter.join();
      if (in != pattern(prev, me, k, in.size())) throw std::runtime_error("ring message differs");
      double x = me + k;
      comm.allreduce(&x, 1, DataType::kFloat64, ReduceOp::kSum);
      if (x != 3.0 + 3 * k) throw std::runtime_error("all-reduce between messages is wrong");
    }
  });
  test::rethrowFirst(errors);
}

// Count, dtype and tag disagreements: MismatchError on the receiver before any byte lands
// (its buffer keeps its old contents), naming both sides; the sender learns at its next call.
TEST(PointToPoint, DisagreementsAreMismatchErrorsOnBothRanks) {
  struct Case {
    size_t recv_count;
    DataType recv_dtype;
    uint32_t recv_tag;
    const char* words;
  };
  for (const Case& c :
       {Case{12, DataType::kFloat32, 3, "count 12"}, Case{10, DataType::kInt32, 3, "int32"},
        Case{10, DataType::kFloat32, 4, "tag 4"}}) {
    std::vector<uint8_t> received(64, 0xAB);
    auto errors = withRanks(2, [&](Communicator& comm) {
      if (comm.rank() == 0) {
        std::vector<float> data(10, 2.0f);
        comm.send(data.data(), 10, DataType::kFloat32, 1, 3);
      } else {
        comm.recv(received.data(), c.recv_count, c.recv_dtype, 0, c.recv_tag);
      }
      comm.barrier();
    });
    const std::string receiver = messageOf<MismatchError>(errors[1]);
    EXPECT_NE(receiver.find("send/recv: rank 1 expects message #0 of this pair (tag " +
                            std::to_string(c.recv_tag)),
              std::string::npos)
        << receiver;
    EXPECT_NE(receiver.find(c.words), std::string::npos) << receiver;
    EXPECT_NE(receiver.find("rank 0 sent message #0 of this pair (tag 3, float, count 10)"),
              std::string::npos)
        << receiver;
    EXPECT_EQ(messageOf<MismatchError>(errors[0]).rfind("wrong type", 0), std::string::npos)
        << messageOf<MismatchError>(errors[0]);
    EXPECT_TRUE(errors[0]) << "the sender did not learn of the mismatch";
    EXPECT_EQ(received, std::vector<uint8_t>(64, 0xAB)) << "bytes landed despite the mismatch";
  }
}

// A receive that no send ever matches: TimeoutError at the deadline naming the peer and the
// message; a message and a collective posted in opposite orders: MismatchError, not mixed data.
TEST(PointToPoint, UnmatchedReceiveTimesOutAndCrossedOrderIsAMismatch) {
  auto errors = withRanks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) {
          float x = 0;
          comm.recv(&x, 1, DataType::kFloat32, 0, 9);
        } else {
          std::this_thread::sleep_for(std::chrono::seconds(2));
        }
      },
      std::chrono::milliseconds(700));
  const std::string timeout = messageOf<TimeoutError>(errors[1]);
  EXPECT_NE(timeout.find("rank 1: recv from rank 0 (send/recv message #0 of this pair (tag 9, "
                         "float, count 1)) timed out after"),
            std::string::npos)
      << timeout;
  EXPECT_NE(timeout.find("has not posted the matching send or recv"), std::string::npos) << timeout;

  // Over TCP the pair's messages and the collective share one order. (In a one-host job the
  // collectives run in shared memory, and the two orders do not meet.)
  errors = withRanks(
      2,
      [&](Communicator& comm) {
        float x = 1;
        if (comm.rank() == 0) {
          comm.send(&x, 1, DataType::kFloat32, 1);
          comm.allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
        } else {
          comm.allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
          comm.recv(&x, 1, DataType::kFloat32, 0);
        }
        comm.barrier();  // rank 0 may finish its part first: it learns at its next call
      },
      std::chrono::seconds(60), TransportKind::kTcp);
  for (const auto& error : errors) {
    const std::string text = messageOf<MismatchError>(error);
    EXPECT_NE(text.find("collective"), std::string::npos) << text;
    EXPECT_EQ(text.rfind("wrong type", 0), std::string::npos) << text;
  }
}

TEST(PointToPoint, BadPeersAndBuffersAreInvalidArguments) {
  auto errors = withRanks(2, [&](Communicator& comm) {
    float x = 0;
    auto expect = [&](const std::function<void()>& call, const std::string& words) {
      try {
        call();
        ADD_FAILURE() << "no error for " << words;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    const int me = comm.rank();
    expect([&] { comm.isend(&x, 1, DataType::kFloat32, me); },
           "send: peer " + std::to_string(me) + " is this rank itself");
    expect([&] { comm.irecv(&x, 1, DataType::kFloat32, 2); },
           "recv: peer 2 is not a rank of this communicator (size 2)");
    expect([&] { comm.irecv(&x, 1, DataType::kFloat32, -1); }, "peer -1 is not a rank");
    expect([&] { comm.isend(nullptr, 3, DataType::kFloat32, 1 - me); },
           "send: buffer is null for 3 element(s)");
    expect([&] { comm.wait(nullptr); }, "wait: the request is null");
    comm.barrier();  // still usable: nothing was posted
  });
  test::rethrowFirst(errors);
}

// A receive from any source takes the rank whose message with the tag came first, skips a
// peer whose next message has another tag, and times out (no poisoning: nothing was posted)
// when none comes; every message still arrives exactly once.
TEST(PointToPoint, ReceiveFromAnySourceTakesTheFirstArrivalWithTheTag) {
  auto errors = withRanks(3, [&](Communicator& comm) {
    const int me = comm.rank();
    if (me == 0) {
      std::vector<int> order;
      for (int k = 0; k < 2; ++k) {
        std::vector<uint8_t> in(100);
        auto [peer, request] = comm.irecvAny(in.data(), in.size(), DataType::kUInt8, 5);
        comm.wait(request);
        if (in != pattern(peer, 0, 5, 100)) throw std::runtime_error("any-source message differs");
        order.push_back(peer);
      }
      if (order != std::vector<int>{2, 1}) {
        throw std::runtime_error("any-source order " + std::to_string(order[0]) + "," +
                                 std::to_string(order[1]) + ", sent 2 then 1");
      }
      // Rank 1's next message carries tag 6: not taken for tag 7; then a plain receive of it.
      std::vector<uint8_t> in(100);
      try {
        comm.irecvAny(in.data(), in.size(), DataType::kUInt8, 7, std::chrono::milliseconds(300));
        throw std::runtime_error("no timeout");
      } catch (const TimeoutError& e) {
        if (std::string(e.what()).find("recv from any rank (tag 7, uint8, count 100) timed out") ==
            std::string::npos) {
          throw std::runtime_error(std::string("wrong text: ") + e.what());
        }
      }
      comm.recv(in.data(), in.size(), DataType::kUInt8, 1, 6);
      if (in != pattern(1, 0, 6, 100)) throw std::runtime_error("tag-6 message differs");
    } else {
      if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const auto out = pattern(me, 0, 5, 100);
      comm.send(out.data(), out.size(), DataType::kUInt8, 0, 5);
      if (me == 1) {
        const auto other = pattern(1, 0, 6, 100);
        comm.send(other.data(), other.size(), DataType::kUInt8, 0, 6);
      }
    }
    comm.barrier();
  });
  test::rethrowFirst(errors);
}

// Rank r sends (r + 2 d) % 5 elements to rank d (empty blocks included); every block checked
// against the sender's pattern. Flat over TCP, and on hosts with several ranks each.
// Blocks of (from * 3 + to * 2) % 5 * unit elements: uneven, some empty.
void checkAllToAll(Communicator& comm, int k, size_t unit = 37) {
  const int n = comm.size();
  const int me = comm.rank();
  auto block = [unit](int from, int to) {
    return static_cast<size_t>((from * 3 + to * 2) % 5) * unit;
  };
  std::vector<size_t> send_counts(static_cast<size_t>(n));
  std::vector<size_t> recv_counts(static_cast<size_t>(n));
  std::vector<uint8_t> send;
  for (int d = 0; d < n; ++d) {
    send_counts[static_cast<size_t>(d)] = block(me, d);
    recv_counts[static_cast<size_t>(d)] = block(d, me);
    const auto bytes = pattern(me, d, k, block(me, d) * 4);
    send.insert(send.end(), bytes.begin(), bytes.end());
  }
  std::vector<uint8_t> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}) * 4,
                            0xCD);
  comm.allToAll(send.data(), send_counts, recv.data(), recv_counts, DataType::kFloat32);
  size_t offset = 0;
  for (int s = 0; s < n; ++s) {
    const auto want = pattern(s, me, k, block(s, me) * 4);
    if (!std::equal(want.begin(), want.end(), recv.begin() + static_cast<ptrdiff_t>(offset))) {
      throw std::runtime_error("rank " + std::to_string(me) + ": all-to-all block from " +
                               std::to_string(s) + " differs");
    }
    offset += want.size();
  }
}

TEST(AllToAll, UnevenBlocksArriveExactlyFlatAndOnHosts) {
  for (int size : {1, 2, 3, 5}) {
    test::rethrowFirst(withRanks(size, [&](Communicator& comm) {
      for (int k = 0; k < 3; ++k) checkAllToAll(comm, k);
    }));
  }
  for (const std::vector<int>& per_host : {std::vector<int>{2, 2}, std::vector<int>{1, 2, 3}}) {
    test::rethrowFirst(test::onHosts(per_host, [&](Communicator& comm) {
      for (int k = 0; k < 3; ++k) checkAllToAll(comm, k);
    }));
  }
}

// One host's all-to-all runs in its shared-memory segment: each rank reads its blocks straight
// out of the others' send buffers (cross-memory reads, one copy), or -- where set-up found
// them refused, as RAILSHARD_P2P_SHM=0 makes it -- through the slots, blocks of up to 160 KB
// in 64 KiB slots taking several piece steps (a region of slot/3 per destination). Both, and
// the pairwise exchange over TCP (RAILSHARD_TRANSPORT=tcp), deliver every block exactly.
TEST(AllToAll, BlocksArriveExactlyByCrossMemoryReadThroughSlotsAndOverTcp) {
  struct Path {
    const char* name;
    TransportKind transport;
    bool cross_memory;
  };
  for (const Path& path :
       {Path{"cross-memory", TransportKind::kShm, true}, Path{"slots", TransportKind::kShm, false},
        Path{"tcp", TransportKind::kTcp, true}}) {
    SCOPED_TRACE(path.name);
    test::rethrowFirst(withRanks(
        3,
        [&](Communicator& comm) {
          for (int k = 0; k < 2; ++k) checkAllToAll(comm, k, 10007);
          // Bytes counted: none of the blocks crossed a socket in shared memory; over TCP at
          // least this rank's blocks to the others did.
          uint64_t sent = 0;
          for (const auto& rail : comm.transport().rails()) sent += rail.bytes_sent;
          uint64_t blocks = 0;
          for (int d = 0; d < comm.size(); ++d) {
            if (d != comm.rank()) blocks += 2 * ((comm.rank() * 3 + d * 2) % 5) * 10007 * 4;
          }
          if (path.transport == TransportKind::kShm) {
            EXPECT_EQ(sent, 0u);
          } else {
            EXPECT_GE(sent, blocks);
          }
        },
        std::chrono::seconds(60), path.transport, size_t{64} << 10, path.cross_memory));
  }
}

TEST(AllToAll, SplitDisagreementIsAMismatchAndBadArgumentsAreRefused) {
  for (TransportKind transport : {TransportKind::kShm, TransportKind::kTcp}) {
    SCOPED_TRACE(transport == TransportKind::kShm ? "shm" : "tcp");
    auto errors = withRanks(
        2,
        [&](Communicator& comm) {
          // Rank 0 expects 2 elements from rank 1, which sends 3.
          std::vector<float> send(4, 1.0f);
          std::vector<float> recv(4, 0.0f);
          if (comm.rank() == 0) {
            comm.allToAll(send.data(), {1, 1}, recv.data(), {1, 2}, DataType::kFloat32);
          } else {
            comm.allToAll(send.data(), {3, 1}, recv.data(), {1, 1}, DataType::kFloat32);
          }
          comm.barrier();
        },
        std::chrono::seconds(60), transport);
    const std::string text = messageOf<MismatchError>(errors[0]);
    EXPECT_NE(text.find("all_to_all #0 (float, block of 2): split sizes disagree: rank 0 "
                        "expects 2 element(s) from rank 1, which sends 3"),
              std::string::npos)
        << text;
    ASSERT_TRUE(errors[1]);
    // In shared memory every rank sees every rank's split sizes and names the same pair.
    if (transport == TransportKind::kShm) {
      EXPECT_EQ(messageOf<MismatchError>(errors[1]), text);
    }
  }

  test::rethrowFirst(withRanks(2, [&](Communicator& comm) {
    std::vector<float> buffer(8, 0.0f);
    auto expect = [&](const std::function<void()>& call, const std::string& words) {
      try {
        call();
        ADD_FAILURE() << "no error for " << words;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    expect(
        [&] {
          comm.allToAll(buffer.data(), {1}, buffer.data() + 4, {1, 1}, DataType::kFloat32);
        },
        "all_to_all: send_counts has 1 entries, the communicator has 2 ranks");
    const std::vector<size_t> mine =
        comm.rank() == 0 ? std::vector<size_t>{2, 1} : std::vector<size_t>{1, 2};
    expect(
        [&] {
          comm.allToAll(buffer.data(), mine, buffer.data() + 4, {1, 1}, DataType::kFloat32);
        },
        "sends 2 element(s) to itself but expects to receive 1");
    expect(
        [&] {
          comm.allToAll(buffer.data(), {2, 2}, buffer.data() + 2, {2, 2}, DataType::kFloat32);
        },
        "the send and recv buffers overlap");
    comm.barrier();
  }));
}

}  // namespace
}  // namespace railshard
