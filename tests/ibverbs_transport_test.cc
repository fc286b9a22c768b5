// The RDMA transport end to end, as far as this machine allows. There is no RDMA device here
// (and no kernel support for soft-RoCE), so:
//  - against the real libibverbs (present, no device): RAILSHARD_TRANSPORT=ibverbs fails on
//    every rank with a ConfigError that names what is missing; a missing library likewise;
//  - against tests/fakes/libfake_ibverbs.so, an in-process software emulation of the verbs
//    the transport uses (ranks are threads; an RDMA write is a checked memcpy): collectives
//    over RDMA lanes compared with a scalar reference, striping over two HCAs, credits
//    wrapping small rings, mismatches, a queue pair failing, a timeout, and teardown freeing
//    every verbs object. This runs our protocol, not hardware: docs/rdma.md.
#include <gtest/gtest.h>

#ifdef FAKE_IBVERBS_PATH

#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "base/trace.h"
#include "core/communicator.h"
#include "tests/over_emulation.h"
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard {
namespace {

TEST(IbverbsTransport, ForcedWithoutADeviceNamesWhatIsMissingOnEveryRank) {
  // The real libibverbs of this machine: it loads, and finds no device.
  ScopedEnv library("RAILSHARD_IBVERBS_LIBRARY", nullptr);
  const auto errors = withRanks(2, rdmaConfig(), [](Communicator&) {});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " started without an RDMA device";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("RAILSHARD_TRANSPORT=ibverbs, but rank 0 cannot use RDMA"),
                std::string::npos)
          << what;
      EXPECT_TRUE(what.find("no RDMA device") != std::string::npos ||
                  what.find("ibv_get_device_list failed") != std::string::npos ||
                  what.find("cannot load") != std::string::npos)
          << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not a ConfigError: " << e.what();
    }
  }
}

TEST(IbverbsTransport, MissingLibraryIsAConfigErrorAndAutoFallsBackToTcp) {
  ScopedEnv library("RAILSHARD_IBVERBS_LIBRARY", "/nonexistent/libibverbs.so.1");
  const auto errors = withRanks(2, rdmaConfig(), [](Communicator&) {});
  for (int r = 0; r < 2; ++r) {
    const std::string what = messageOf(errors[r]);
    EXPECT_NE(what.find("cannot load /nonexistent/libibverbs.so.1"), std::string::npos) << what;
  }
  Config automatic = rdmaConfig();
  automatic.transport = TransportKind::kAuto;
  std::vector<float> results(2);
  test::rethrowFirst(withRanks(2, automatic, [&](Communicator& comm) {
    float value = static_cast<float>(comm.rank() + 1);
    comm.allreduce(&value, 1, DataType::kFloat32, ReduceOp::kSum);
    results[static_cast<size_t>(comm.rank())] = value;
    EXPECT_NE(comm.transport().name(), "ibverbs");
  }));
  EXPECT_EQ(results, (std::vector<float>{3, 3}));
}

TEST(IbverbsTransport, TopoToolSaysWhatRdmaSeesHere) {
  // This machine's libibverbs: no device, said plainly.
  const auto here = test::runProcess({RAILSHARD_TOPO_BIN, "--rdma"});
  ASSERT_EQ(here.exit_code, 0) << here.err;
  EXPECT_NE(here.out.find("RDMA: unavailable: "), std::string::npos) << here.out;
  // The emulation's two ports, one left out by RAILSHARD_IB_HCA.
  const auto fake = test::runProcess(
      {RAILSHARD_TOPO_BIN, "--rdma"},
      {{"RAILSHARD_IBVERBS_LIBRARY", FAKE_IBVERBS_PATH}, {"RAILSHARD_IB_HCA", "fake1"}});
  ASSERT_EQ(fake.exit_code, 0) << fake.err;
  EXPECT_NE(fake.out.find("fake1:1  InfiniBand  100 Gbit/s  mtu 4096  lid 2"), std::string::npos)
      << fake.out;
  EXPECT_NE(fake.out.find("skipped fake0:1: not in RAILSHARD_IB_HCA"), std::string::npos)
      << fake.out;
  EXPECT_NE(fake.out.find("RDMA: usable, 1 rail(s)"), std::string::npos) << fake.out;
}

TEST_F(OverEmulation, CollectivesMatchAScalarReferenceAndStripeOverBothHcas) {
  constexpr int kSize = 3;
  const uint64_t before0 = hooks_.bytes_written("fake0");
  const uint64_t before1 = hooks_.bytes_written("fake1");
  const std::vector<size_t> counts = {0, 1, 100, 2049, 65536, 1 << 20};
  // Static weights: both emulated HCAs say 100 Gbit/s, so a striped message is split evenly
  // (adaptive weights would follow the emulation's memcpy timings).
  Config config = rdmaConfig();
  config.links.weights = RailWeights::kStatic;
  config.chunk_bytes = 1 << 20;  // pieces above the scheduler's 64 KiB small-message limit
  test::rethrowFirst(withRanks(kSize, config, [&](Communicator& comm) {
    ASSERT_EQ(comm.transport().name(), "ibverbs");
    const int rank = comm.rank();
    checkAllreducesAndBroadcast(comm, counts, 1);
    if (::testing::Test::HasFatalFailure()) return;
    const size_t per_rank = 40000;
    std::vector<int32_t> mine(per_rank), all(per_rank * kSize);
    for (size_t i = 0; i < per_rank; ++i) mine[i] = rank * 1000000 + static_cast<int32_t>(i);
    comm.allgather(mine.data(), all.data(), per_rank, DataType::kInt32);
    for (int r = 0; r < kSize; ++r) {
      for (size_t i = 0; i < per_rank; ++i) {
        ASSERT_EQ(all[r * per_rank + i], r * 1000000 + static_cast<int32_t>(i));
      }
    }
    comm.barrier();
    // Every lane's bytes are counted, and the striped 4 MB all-reduce used both rails.
    uint64_t lanes = 0;
    for (const auto& rail : comm.transport().rails()) {
      EXPECT_TRUE(rail.up) << rail.name;
      EXPECT_TRUE(rail.name == "fake0:1" || rail.name == "fake1:1") << rail.name;
      ++lanes;
    }
    EXPECT_EQ(lanes, 2u * (kSize - 1));
    // No rank closes (its queue pairs gone: a last credit write to it fails, the lane goes
    // down) before every rank has looked.
    comm.barrier();
  }));
  EXPECT_GT(hooks_.bytes_written("fake0") - before0, 1u << 20);
  EXPECT_GT(hooks_.bytes_written("fake1") - before1, 1u << 20);
}

TEST_F(OverEmulation, RandomSizesOverTheSmallestRingsStayExact) {
  // Two slots of 4 KiB: every piece waits for a credit, the rings wrap thousands of times.
  constexpr int kSize = 4;
  Config config = rdmaConfig();
  config.rdma.slots = 2;
  config.rdma.slot_bytes = 4096;
  config.links.weights = RailWeights::kEqual;
  test::rethrowFirst(withRanks(kSize, config, [&](Communicator& comm) {
    std::mt19937 sizes(1234);  // the same sequence on every rank
    for (int iteration = 0; iteration < 60; ++iteration) {
      const size_t count = sizes() % 70000;
      std::vector<int64_t> data(count);
      for (size_t i = 0; i < count; ++i) {
        data[i] = static_cast<int64_t>(i) * (comm.rank() + 1) + iteration;
      }
      comm.allreduce(data.data(), count, DataType::kInt64, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        // sum over r of i*(r+1) + iteration = i*n(n+1)/2 + n*iteration
        const int64_t expected =
            static_cast<int64_t>(i) * kSize * (kSize + 1) / 2 + int64_t{kSize} * iteration;
        ASSERT_EQ(data[i], expected) << "iteration " << iteration << " count " << count;
      }
    }
  }));
}

TEST_F(OverEmulation, MismatchedOpsRaiseMismatchErrorOnEveryRank) {
  const auto errors = withRanks(2, rdmaConfig(), [](Communicator& comm) {
    std::vector<float> data(10000, 1.0f);
    comm.allreduce(data.data(), data.size(), DataType::kFloat32,
                   comm.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax);
  });
  expectMismatchOnEveryRank(errors);
}

TEST_F(OverEmulation, TraceRecordsEveryRdmaPieceOnItsLaneTrack) {
  constexpr int kSize = 2;
  const std::string dir = test::tempPath("ibverbs_trace");
  std::filesystem::remove_all(dir);
  Config config = rdmaConfig();
  config.links.weights = RailWeights::kStatic;
  config.chunk_bytes = 1 << 20;
  config.trace_dir = dir;
  std::vector<uint64_t> sent(kSize);
  test::rethrowFirst(withRanks(kSize, config, [&](Communicator& comm) {
    std::vector<float> data(1 << 20, 1.0f);
    comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    ASSERT_EQ(data[12345], 2.0f);
    for (const auto& rail : comm.transport().rails()) {
      sent[static_cast<size_t>(comm.rank())] += rail.bytes_sent;
    }
  }));
  trace::flush();
  for (int rank = 0; rank < kSize; ++rank) {
    std::ifstream in(trace::rankFile(dir, rank));
    std::stringstream text;
    text << in.rdbuf();
    const auto file = nlohmann::json::parse(text.str());
    std::map<std::string, uint64_t> by_rail;
    uint64_t total = 0;
    for (const auto& e : file["traceEvents"]) {
      if (e.value("cat", "") != "rail") continue;
      // Messages of chunk_bytes (1 MiB) are above RAILSHARD_IB_RENDEZVOUS (512K): read in place.
      EXPECT_EQ(e["name"], "rdma_read");
      by_rail[e["args"]["rail"].get<std::string>()] += e["args"]["bytes"].get<uint64_t>();
      total += e["args"]["bytes"].get<uint64_t>();
    }
    // Bytes of the pieces in the trace = the transport's own count; both HCAs carried some.
    EXPECT_EQ(total, sent[static_cast<size_t>(rank)]) << "rank " << rank;
    // Two ranks, 4 MiB: ring (2 MiB reduce-scatter + 2 MiB all-gather) or recursive doubling
    // (one 4 MiB exchange) both move exactly 4 MiB of payload per rank (read, here).
    EXPECT_EQ(total, 4u << 20) << "rank " << rank;
    EXPECT_GT(by_rail["fake0:1"], 0u) << "rank " << rank;
    EXPECT_GT(by_rail["fake1:1"], 0u) << "rank " << rank;
  }
  trace::disableAndClear();
  std::filesystem::remove_all(dir);
}

TEST_F(OverEmulation, AFailedRailMovesItsTrafficToTheOtherAndResultsStayExact) {
  constexpr int kSize = 2;
  Config config = rdmaConfig();
  config.links.weights = RailWeights::kStatic;
  config.chunk_bytes = 1 << 20;  // striped over both rails
  std::vector<std::string> down(kSize);
  test::rethrowFirst(withRanks(kSize, config, [&](Communicator& comm) {
    const int rank = comm.rank();
    for (int iteration = 0; iteration < 40; ++iteration) {
      checkTwoRankAllreduce(comm, iteration);
      if (::testing::Test::HasFatalFailure()) return;
      if (rank == 1 && iteration == 5) breakFirstQueuePair(hooks_);
    }
    for (const auto& rail : comm.transport().rails()) {
      if (!rail.up) down[static_cast<size_t>(rank)] = rail.name + ": " + rail.down_reason;
    }
  }));
  for (int r = 0; r < kSize; ++r) {
    // Whichever the rank saw first: a completion in error (with its verbs status) or the
    // queue pair's asynchronous error event.
    const std::string& reason = down[static_cast<size_t>(r)];
    EXPECT_NE(reason.find("RDMA rail fake"), std::string::npos) << "rank " << r << ": " << reason;
    EXPECT_TRUE(reason.find("completed with") != std::string::npos ||
                reason.find("asynchronous event") != std::string::npos)
        << "rank " << r << " should report the failed rail and why: '" << reason << "'";
  }
}

// One end of a lane fails on its own while both ranks are idle (the other end stays up, and
// with nothing in flight there it would find out only when it next sends on it, or never if
// it waits for credits): the failing end tells the other on the second rail at once; both
// move to it and every all-reduce stays exact.
TEST_F(OverEmulation, ALaneFailingAtOneEndIsToldToTheOtherEnd) {
  constexpr int kSize = 2;
  Config config = rdmaConfig();
  config.links.weights = RailWeights::kStatic;
  config.chunk_bytes = 1 << 20;
  config.timeout = std::chrono::seconds(20);
  std::vector<std::string> down(kSize);
  test::rethrowFirst(withRanks(kSize, config, [&](Communicator& comm) {
    for (int iteration = 0; iteration < 20; ++iteration) {
      checkTwoRankAllreduce(comm, iteration);
      if (::testing::Test::HasFatalFailure()) return;
      if (iteration != 3) continue;
      // Idle first: a rendezvous end (kFin) still in flight on the lane when it breaks would
      // let its sender find the failure itself, not be told (seen under ASan).
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (comm.rank() == 1) {
        bool broken = false;
        for (uint32_t qpn = 1; qpn < 100000 && !broken; ++qpn) {
          broken = hooks_.break_qp_one_side(qpn, IBV_WC_LOC_QP_OP_ERR) == 0;
        }
        ASSERT_TRUE(broken) << "no queue pair to break";
      }
      // Idle: nothing is sent until both ranks have looked at their rails.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      for (const auto& rail : comm.transport().rails()) {
        if (!rail.up) down[static_cast<size_t>(comm.rank())] = rail.down_reason;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }));
  int told = 0;
  for (int r = 0; r < kSize; ++r) {
    const std::string& reason = down[static_cast<size_t>(r)];
    EXPECT_NE(reason, "") << "rank " << r << " still had both rails up";
    if (reason.find("side failed (it said so on RDMA rail") != std::string::npos) ++told;
  }
  EXPECT_EQ(told, 1) << "the end that did not fail should have been told: '" << down[0] << "' / '"
                     << down[1] << "'";
}

TEST_F(OverEmulation, AFailedQueuePairIsPeerLostErrorWithTheVerbsStatusOnEveryRank) {
  constexpr int kSize = 3;
  ScopedEnv one_rail("FAKE_IBVERBS_DEVICES", "1");  // no other rail to fail over to
  std::mutex mutex;
  std::vector<std::string> lost_over_rdma;  // "rank R lost P: why", from lostPeers()
  const auto errors = withRanks(kSize, rdmaConfig(), [&](Communicator& comm) {
    std::vector<float> data(200000, 1.0f);
    try {
      for (int i = 0; i < 200; ++i) {
        comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
        if (comm.rank() == 1 && i == 3) breakFirstQueuePair(hooks_);
      }
    } catch (const PeerLostError&) {
      for (const transport::LostPeer& lost : comm.transport().lostPeers()) {
        std::lock_guard<std::mutex> lock(mutex);
        if (lost.reason.find("RDMA rail") == std::string::npos) continue;
        lost_over_rdma.push_back("rank " + std::to_string(comm.rank()) + " lost " +
                                 std::to_string(lost.rank) + ": " + lost.reason);
      }
      throw;
    }
  });
  // The end that saw the failed queue pair lists the other as lost, with the rail (shrink()
  // leaves such a peer out even while its TCP connection is up). The other end often hears
  // of it first through the control plane's abort and stops before its own lane reports.
  EXPECT_GE(lost_over_rdma.size(), 1u) << "no rank lists a peer lost over RDMA";
  int with_status = 0;
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not notice the failed queue pair";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const PeerLostError& e) {
      const std::string what = e.what();
      // The first sign of the failure names it: the sender's "retry counter exceeded", a
      // receive flushed when the peer's side of the queue pair failed first, or the queue
      // pair's asynchronous error event, whichever the progress thread saw first.
      if (what.find("RDMA rail") != std::string::npos &&
          (what.find("completed with transport retry counter exceeded") != std::string::npos ||
           what.find("completed with Work Request Flushed Error") != std::string::npos ||
           what.find("asynchronous event local work queue catastrophic error") !=
               std::string::npos)) {
        ++with_status;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not PeerLostError: " << e.what();
    }
  }
  EXPECT_EQ(with_status, kSize) << "every rank's error names the rail and the verbs status";
}

TEST_F(OverEmulation, AMissingRankIsATimeoutNamingIt) {
  Config config = rdmaConfig();
  config.timeout = std::chrono::seconds(2);
  const auto errors = withRanks(3, config, [](Communicator& comm) {
    // Rank 1 never enters the all-reduce, and closes its communicator only well after the
    // others' deadline (a close that came first is rightly a PeerLostError, as over TCP:
    // communicator_test.cc, MissingRankIsATimeoutNamingThePeerAndCollective).
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5000));
      return;
    }
    std::vector<float> data(1000, 1.0f);
    comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
  });
  EXPECT_FALSE(errors[1]);
  for (int r : {0, 2}) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished without rank 1";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const TimeoutError& e) {
      // Rank 0 waits for rank 1; rank 2 for rank 0, which never sends: whoever times out first
      // tells the other, so each message names the collective and a waited-for rank.
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce #0"), std::string::npos) << what;
      EXPECT_NE(what.find("timed out waiting to receive from rank"), std::string::npos) << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not TimeoutError: " << e.what();
    }
  }
}

}  // namespace
}  // namespace railshard

#else
TEST(IbverbsTransport, NotBuilt) {
  GTEST_SKIP() << "built without infiniband/verbs.h: no RDMA transport and no emulation";
}
#endif
