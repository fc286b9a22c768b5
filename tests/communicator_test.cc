// Multi-rank tests: N ranks as threads of this process, each with its own Communicator and
// progress thread, talking over real loopback TCP sockets; rendezvous via MemoryStore.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "tests/collective_check.h"
#include "tests/reference.h"
#include "tests/tcp_mesh_util.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

using test::expectedValue;
using test::inputValue;
using test::loadValue;
using test::storeValue;

const std::vector<DataType>& kDataTypes = test::allDataTypes();
const std::vector<ReduceOp>& kOps = test::allOps();

Config testConfig() {
  Config config;
  config.timeout = std::chrono::seconds(60);
  config.connect_timeout = std::chrono::seconds(30);
  config.chunk_bytes = 64 * 1024;  // several chunks and slices even at moderate counts
  return config;
}

// Runs body(comm) on `size` ranks; returns each rank's exception (null when it succeeded).
std::vector<std::exception_ptr> withRanks(int size, const std::function<void(Communicator&)>& body,
                                          const std::function<void(int, Config&)>& tweak = {}) {
  MemoryStore store;
  return test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config = testConfig();
    if (tweak) tweak(rank, options.config);
    auto comm = Communicator::create(store, options);
    body(*comm);
  });
}

using test::fillInput;

// (world size, RAILSHARD_ALGO): every algorithm is checked on its own, whatever the tuner
// would pick.
class AllreduceWorld : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// Every dtype x op x count, alternating in-place and out-of-place.
TEST_P(AllreduceWorld, EveryDtypeOpAndCountMatchesScalarReference) {
  const int size = std::get<0>(GetParam());
  const std::string algorithm = std::get<1>(GetParam());
  const std::vector<size_t> counts = {0, 1, 7, 1000, size_t{1} << 20};
  auto errors = withRanks(
      size,
      [&](Communicator& comm) {
        test::checkEveryAllreduce(comm, counts, [&](const std::string& ran) {
          if (size > 1 && ran != algorithm && !(algorithm == "shm_direct" && ran == "shm_rsag")) {
            throw std::runtime_error("ran " + ran + ", not " + algorithm);
          }
        });
      },
      [&](int, Config& config) {
        config.algorithm = algorithm;
        config.transport =
            algorithm.rfind("shm", 0) == 0 ? TransportKind::kShm : TransportKind::kTcp;
        config.shm.slot_bytes = 256 * 1024;  // several pieces at the largest count
      });
  test::rethrowFirst(errors);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllreduceWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values("ring", "recursive_doubling",
                                                              "shm_direct", "shm_rsag")),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// (world size, RAILSHARD_TRANSPORT)
class CollectivesWorld : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  int worldSize() const { return std::get<0>(GetParam()); }
  std::function<void(int, Config&)> transport() const {
    const std::string name = std::get<1>(GetParam());
    return [name](int, Config& config) {
      config.transport = transportKindFrom(name);
      config.shm.slot_bytes = 128 * 1024;
    };
  }
};

TEST_P(CollectivesWorld, ReduceScatterMatchesReference) {
  auto errors = withRanks(
      worldSize(),
      [&](Communicator& comm) {
        test::checkEveryReduceScatter(comm, {0, 1, 7, 100000});
      },
      transport());
  test::rethrowFirst(errors);
}

TEST_P(CollectivesWorld, AllgatherPlacesEveryRanksBlock) {
  auto errors = withRanks(
      worldSize(),
      [&](Communicator& comm) {
        test::checkEveryAllgather(comm, {0, 1, 7, 300000});
      },
      transport());
  test::rethrowFirst(errors);
}

TEST_P(CollectivesWorld, BroadcastFromEveryRoot) {
  const int size = worldSize();
  auto errors = withRanks(
      size,
      [&](Communicator& comm) {
        for (int root = 0; root < size; ++root) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{200000}}) {
            const DataType dtype = root % 2 == 0 ? DataType::kFloat32 : DataType::kInt64;
            std::vector<uint8_t> buffer(std::max<size_t>(1, count * sizeOf(dtype)), 0);
            if (comm.rank() == root) {
              for (size_t i = 0; i < count; ++i)
                storeValue(buffer.data(), i, dtype, inputValue(root, i, dtype, ReduceOp::kMin));
            }
            std::vector<uint8_t> out(buffer.size(), 0xee);
            const bool in_place = count % 2 == 0;
            if (in_place) {
              comm.broadcast(buffer.data(), count, dtype, root);
            } else {
              comm.broadcast(comm.rank() == root ? buffer.data() : nullptr, out.data(), count,
                             dtype, root);
            }
            const void* result = in_place ? buffer.data() : out.data();
            for (size_t i = 0; i < count; ++i) {
              if (loadValue(result, i, dtype) != inputValue(root, i, dtype, ReduceOp::kMin)) {
                throw std::runtime_error("broadcast root " + std::to_string(root) + " count " +
                                         std::to_string(count) + " element " + std::to_string(i));
              }
            }
          }
        }
      },
      transport());
  test::rethrowFirst(errors);
}

TEST_P(CollectivesWorld, BarrierHoldsEveryoneUntilTheLastArrives) {
  const int size = worldSize();
  std::atomic<int> arrived{0};
  std::atomic<int> early_leavers{0};
  auto errors = withRanks(
      size,
      [&](Communicator& comm) {
        for (int round = 0; round < 5; ++round) {
          if (comm.rank() == round % size)
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
          arrived.fetch_add(1);
          comm.barrier();
          if (arrived.load() < (round + 1) * size) early_leavers.fetch_add(1);
          comm.barrier();  // nobody starts the next round before all checked this one
        }
      },
      transport());
  test::rethrowFirst(errors);
  EXPECT_EQ(early_leavers.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values("tcp", "shm")),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::function<void(int, Config&)> transport(
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const {
    const std::string name = GetParam();
    return [name, timeout](int, Config& config) {
      config.transport = transportKindFrom(name);
      config.timeout = timeout;
    };
  }
};
INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ::testing::Values("tcp", "shm"));

// Ranks disagree on the count: every rank raises MismatchError naming both sides and values.
TEST_P(TransportTest, DifferentCountsRaiseMismatchErrorOnEveryRank) {
  const int size = 4;
  auto errors = withRanks(
      size,
      [&](Communicator& comm) {
        const size_t count = comm.rank() == 2 ? 7 : 1000;
        std::vector<float> data(count, 1.0f);
        comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
      },
      transport());
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const MismatchError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("count"), std::string::npos) << message;
      EXPECT_NE(message.find("1000"), std::string::npos) << message;
      EXPECT_NE(message.find("7"), std::string::npos) << message;
      EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " raised the wrong type: " << e.what();
    }
  }
}

TEST_P(TransportTest, DifferentOpsAndCollectivesAreCaught) {
  auto errors = withRanks(
      3,
      [&](Communicator& comm) {
        std::vector<int32_t> data(10, 1);
        comm.allreduce(data.data(), 10, DataType::kInt32,
                       comm.rank() == 0 ? ReduceOp::kMax : ReduceOp::kSum);
      },
      transport());
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), MismatchError);
  }
  errors = withRanks(
      2,
      [&](Communicator& comm) {
        std::vector<int32_t> data(10, 1);
        if (comm.rank() == 0) {
          comm.barrier();
        } else {
          comm.broadcast(data.data(), 10, DataType::kInt32, 0);
        }
      },
      transport());
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const MismatchError& m) {
      EXPECT_NE(std::string(m.what()).find("collective"), std::string::npos) << m.what();
    }
  }
}

TEST_P(TransportTest, BroadcastRootsThatDisagreeAreCaught) {
  auto errors = withRanks(
      2,
      [&](Communicator& comm) {
        std::vector<int32_t> data(10, comm.rank());
        comm.broadcast(data.data(), 10, DataType::kInt32, comm.rank());  // each thinks it is root
      },
      transport());
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), MismatchError);
  }
}

TEST_P(TransportTest, MissingRankIsATimeoutNamingThePeerAndCollective) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = withRanks(
      3,
      [&](Communicator& comm) {
        std::vector<float> data(100, 1.0f);
        if (comm.rank() != 1) comm.allreduce(data.data(), 100, DataType::kFloat32, ReduceOp::kSum);
        // rank 1 skips the collective and then closes its communicator, long after the others'
        // 0.5 s deadline: on a loaded 2-core runner a rank can be starved for a second, and a
        // close that came first would (rightly) be a PeerLostError instead.
        if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(4000));
      },
      transport(std::chrono::milliseconds(500)));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  EXPECT_FALSE(errors[1]);
  for (int r : {0, 2}) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << r;
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce #0"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

TEST_P(TransportTest, PeerThatClosesMidCollectiveIsNamed) {
  auto errors = withRanks(
      2,
      [&](Communicator& comm) {
        std::vector<float> data(100, 1.0f);
        if (comm.rank() == 0) comm.allreduce(data.data(), 100, DataType::kFloat32, ReduceOp::kSum);
        // rank 1 returns at once: its communicator says goodbye while rank 0 waits
      },
      transport());
  EXPECT_FALSE(errors[1]);
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

// Two ranks of a bare TCP mesh in this process (threads), through `store`.
void connectTcpPair(MemoryStore& store, std::unique_ptr<test::Mesh> (&t)[2]) {
  test::rethrowFirst(test::runRanks(2, [&](int rank) {
    t[rank] =
        transport::links::tcp::connectMesh(store, test::tcpMeshOptions(rank, 2, "tcp-pair-test"));
  }));
}

// A wait whose own deadline passes while another thread (here the progress thread, reading a
// peer's abort) is half-way through failing the transport must raise that failure, not return
// as if the receive had completed: recursive doubling then reduced the unfilled workspace into
// the result and returned it without an error ("nothing is silently corrupted").
TEST(TcpFailure, WaitThatTimesOutWhileAnotherThreadFailsRaises) {
  MemoryStore store;
  std::unique_ptr<test::Mesh> t[2];
  connectTcpPair(store, t);
  // Hold rank 0's failure window open (claimed, not yet published) until this test's wait has
  // run into its deadline, or half a second at most.
  std::promise<void> failing;
  std::atomic<bool> waited{false};
  t[0]->failure().setFailHookForTesting([&] {
    failing.set_value();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (!waited.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<uint8_t> buffer(64, 0);
  transport::MessageTag tag;
  tag.sequence = 7;
  auto request = t[0]->irecv(1, buffer.data(), buffer.size(), tag);  // rank 1 never sends it
  t[1]->abort(makeError(ErrorKind::kTimeout, "rank 1: gave up (test)"), true);
  ASSERT_EQ(failing.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  bool raised = false;
  try {
    t[0]->wait(request, deadlineAfter(std::chrono::milliseconds(20)));
  } catch (const TimeoutError& e) {
    raised = true;
    EXPECT_NE(std::string(e.what()).find("gave up (test) [reported by rank 1]"), std::string::npos)
        << e.what();
  }
  waited.store(true);
  EXPECT_TRUE(raised) << "wait() returned normally on a receive that never arrived";
  EXPECT_FALSE(request->done());
  std::thread other([&] { t[1].reset(); });
  t[0].reset();
  other.join();
}

// A peer that fails (here with a MismatchError) tells this rank in an abort frame, lingers,
// closes, and answers this rank's next data with a reset. If a send then fails before this
// rank's progress thread has read the abort, the abort must still win: MismatchError, not
// PeerLostError (the rare flake of the mismatch tests). Rank 0's progress thread is paused so
// that the abort and the reset are both in its kernel before it looks.
TEST(TcpFailure, AbortFrameWinsOverTheResetThatFollowsIt) {
  MemoryStore store;
  std::unique_ptr<test::Mesh> t[2];
  connectTcpPair(store, t);
  test::tcpDriverOf(*t[0]).pauseForTesting(true);
  t[1]->abort(makeError(ErrorKind::kMismatch, "rank 1: op differs (test)"), true);
  t[1].reset();  // lingers for rank 0's close (which cannot come: paused), then closes

  // The first send reaches a closed socket and draws a reset; a later one fails.
  std::vector<uint8_t> payload(1 << 16, 1);
  transport::MessageTag tag;
  tag.sequence = 3;
  std::vector<transport::RequestPtr> sends;
  for (int i = 0; i < 10; ++i) {
    sends.push_back(t[0]->isend(1, payload.data(), payload.size(), tag));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  test::tcpDriverOf(*t[0]).pauseForTesting(false);

  const Deadline until = deadlineAfter(std::chrono::seconds(10));
  std::string kind = "none";
  std::string what;
  while (kind == "none" && Clock::now() < until) {
    try {
      t[0]->checkHealthy();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const MismatchError& e) {
      kind = "MismatchError";
      what = e.what();
    } catch (const Error& e) {
      kind = "other";
      what = e.what();
    }
  }
  EXPECT_EQ(kind, "MismatchError") << what;
  EXPECT_NE(what.find("op differs (test) [reported by rank 1]"), std::string::npos) << what;
  t[0].reset();
}

TEST(Arguments, BadArgumentsRaiseInvalidArgument) {
  auto errors = withRanks(2, [&](Communicator& comm) {
    std::vector<float> data(4);
    EXPECT_THROW(comm.allreduce(nullptr, 4, DataType::kFloat32, ReduceOp::kSum), InvalidArgument);
    EXPECT_THROW(comm.allreduce(data.data(), 4, static_cast<DataType>(42), ReduceOp::kSum),
                 InvalidArgument);
    EXPECT_THROW(comm.allreduce(data.data(), 4, DataType::kFloat32, static_cast<ReduceOp>(9)),
                 InvalidArgument);
    EXPECT_THROW(comm.broadcast(data.data(), 4, DataType::kFloat32, 2), InvalidArgument);
    EXPECT_THROW(comm.allreduce(data.data(), ~size_t{0} / 2, DataType::kFloat32, ReduceOp::kSum),
                 InvalidArgument);
    // After argument errors (raised before anything was sent) the communicator still works.
    comm.allreduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    comm.allreduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum);
  });
  test::rethrowFirst(errors);
}

// Misuse after abort() or shrink(), and bad per-call timeouts, are InvalidArgument naming
// the problem; the peers of an aborting rank fail with its reason instead of waiting.
TEST(Arguments, CallsAfterAbortAndBadTimeoutsAreInvalidArgument) {
  auto errors = withRanks(2, [&](Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    try {
      comm.allreduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum,
                     std::chrono::milliseconds(0));
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("timeout must be positive, got 0 ms"), std::string::npos)
          << e.what();
    }
    comm.allreduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum,
                   std::chrono::milliseconds(5000));
    EXPECT_EQ(data[0], 2.0f);
    if (comm.rank() == 0) {
      comm.abort("loss went NaN");
    } else {
      try {
        comm.allreduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
        ADD_FAILURE() << "expected the peer's abort";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("loss went NaN"), std::string::npos) << e.what();
      }
      return;
    }
    try {
      comm.barrier();
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("barrier: this communicator was aborted by the "
                                           "application: loss went NaN"),
                std::string::npos)
          << e.what();
    }
    // Created without a store (Options::store): shrink() cannot re-form.
    EXPECT_THROW(comm.abort("again"), InvalidArgument);
  });
  test::rethrowFirst(errors);
}

TEST(Arguments, ShrinkWithoutAStoreIsInvalidArgument) {
  auto errors = withRanks(2, [&](Communicator& comm) {
    try {
      comm.shrink();
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("no store"), std::string::npos) << e.what();
    }
  });
  test::rethrowFirst(errors);
}

// In-process shrink through a shared store: every rank calls it with nobody lost (a
// voluntary re-form); the new communicator works and the old one refuses further use.
TEST(Shrink, VoluntaryShrinkOfAllRanksKeepsEveryoneAndRenumbersNothing) {
  auto store = std::make_shared<MemoryStore>();
  auto errors = test::runRanks(3, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = 3;
    options.config = testConfig();
    options.store = store;
    auto comm = Communicator::create(*store, options);
    auto next = comm->shrink(std::chrono::milliseconds(20000));
    EXPECT_EQ(next->size(), 3);
    EXPECT_EQ(next->rank(), rank);
    EXPECT_EQ(next->generation(), 1);
    EXPECT_EQ(next->worldRanks(), (std::vector<int>{0, 1, 2}));
    int64_t value = rank + 1;
    next->allreduce(&value, 1, DataType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(value, 6);
    try {
      comm->allreduce(&value, 1, DataType::kInt64, ReduceOp::kSum);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("was shrunk; use the communicator shrink() returned"),
                std::string::npos)
          << e.what();
    }
  });
  test::rethrowFirst(errors);
}

TEST(Token, PeerWithWrongTokenIsRefused) {
  auto errors = withRanks(
      2, [&](Communicator&) {},
      [](int rank, Config& config) {
        config.token = rank == 0 ? "right-token" : "wrong-token";
        config.connect_timeout = std::chrono::seconds(2);
      });
  // Each refuses the other's connection to the start-up ring (and logs why): both are told,
  // well before the 2 s deadline.
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const PeerLostError& e) {
      EXPECT_NE(std::string(e.what()).find("refused the connection (a different RAILSHARD_TOKEN"),
                std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not a PeerLostError: " << e.what();
    }
  }
}

TEST_P(TransportTest, ManySmallCollectivesInARowStayInStep) {
  auto errors = withRanks(
      4,
      [&](Communicator& comm) {
        for (int i = 0; i < 500; ++i) {
          int64_t value = comm.rank() + i;
          comm.allreduce(&value, 1, DataType::kInt64, ReduceOp::kSum);
          const int64_t expected = 0 + 1 + 2 + 3 + 4 * i;
          if (value != expected) throw std::runtime_error("iteration " + std::to_string(i));
        }
        EXPECT_EQ(comm.sequence(), 500u);
      },
      transport());
  test::rethrowFirst(errors);
}

}  // namespace
}  // namespace railshard
