// Two-level collectives when something goes wrong (tests/multi_host.h for the layouts): ranks
// that disagree, ranks that leave (in shared memory and across hosts, also mid-pipeline), and
// a rail that breaks in the middle of an all-reduce. Healthy runs: two_level_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/collectives/host_layout.h"
#include "core/collectives/two_level.h"
#include "core/communicator.h"
#include "core/topology/topology.h"
#include "tests/collective_check.h"
#include "tests/multi_host.h"
#include "tests/reference.h"
#include "tests/tcp_mesh_util.h"
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard {
namespace {

using test::firstDifferences;
using test::graphPlacing;
using test::hostName;
using test::onHosts;
using test::onPlacement;
using test::tcpPayload;

// Each host names a root of its own: the carriers' chains carry both roots in their headers
// and every rank raises MismatchError. (As with the flat chain, a rank that agrees with the
// root it received from and needs nothing from the others can return before the disagreement
// reaches it; the communicator is poisoned all the same, so its next call raises.)
TEST(TwoLevel, HostsThatNameDifferentRootsAreCaughtOnEveryRank) {
  auto errors = onHosts(
      {2, 2},
      [&](Communicator& comm) {
        std::vector<int32_t> data(100, comm.rank());
        comm.broadcast(data.data(), data.size(), DataType::kInt32, comm.rank() < 2 ? 0 : 2);
      },
      [](int, Config& config) { config.timeout = std::chrono::seconds(20); });
  for (size_t r = 0; r < errors.size(); ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("root"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " raised the wrong type: " << e.what();
    }
  }
}

TEST(TwoLevel, CountMismatchIsCaughtOnEveryRank) {
  auto errors = onHosts(
      {2, 2},
      [&](Communicator& comm) {
        const size_t count = comm.rank() == 3 ? 7 : 1000;
        std::vector<float> data(count, 1.0f);
        comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
      },
      [](int, Config& config) { config.timeout = std::chrono::seconds(20); });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("count"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " raised the wrong type: " << e.what();
    }
  }
}

// Every rank but `leaver` raised PeerLostError naming it; the leaver raised nothing.
void expectPeerLostNaming(const std::vector<std::exception_ptr>& errors, int leaver) {
  EXPECT_FALSE(errors[static_cast<size_t>(leaver)]);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (static_cast<int>(r) == leaver) continue;
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const PeerLostError& e) {
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(leaver)), std::string::npos)
          << "rank " << r << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " raised the wrong type: " << e.what();
    }
  }
}

// A rank that leaves mid-job: its host's peer (shared memory) and the other host's ranks
// (TCP) all raise PeerLostError naming it, well inside their deadline.
TEST(TwoLevel, RankThatLeavesIsNamedOnEveryHost) {
  for (const int leaver : {1, 2}) {
    const auto start = std::chrono::steady_clock::now();
    auto errors = onHosts(
        {2, 2},
        [&](Communicator& comm) {
          std::vector<float> data(50000, 1.0f);
          comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
          if (comm.rank() == leaver) return;  // closes its communicator
          comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
        },
        [](int, Config& config) { config.timeout = std::chrono::seconds(30); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 15.0) << "leaver " << leaver;
    expectPeerLostNaming(errors, leaver);
  }
}

// A rank that leaves while the others are in a pipelined all-reduce (the worker thread waiting
// on the rails, this thread in shared memory): every survivor raises PeerLostError naming it,
// and no thread is left behind.
TEST(TwoLevel, RankThatLeavesMidPipelineIsNamedOnEveryHost) {
  for (const int leaver : {1, 3}) {
    auto errors = onHosts(
        {2, 2},
        [&](Communicator& comm) {
          std::vector<float> data(size_t{1} << 21, 1.0f);  // 8 MiB: 4 chunks
          if (comm.rank() == leaver) return;
          comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
        },
        [](int, Config& config) {
          config.algorithm = "two_level";
          config.timeout = std::chrono::seconds(30);
        });
    expectPeerLostNaming(errors, leaver);
  }
}

// Two hosts joined by two "rails" on loopback addresses (127.0.0.x and 127.0.1.x are all this
// machine's): the cross-host rings stripe over both, and a rail broken in the middle of a
// two-level all-reduce fails over without losing or corrupting a byte.
std::shared_ptr<topology::Topology> twoRailGraph() {
  auto graph = std::make_shared<topology::Topology>();
  std::vector<topology::RankPlacement> ranks;
  for (int h = 0; h < 2; ++h) {
    const std::string host = hostName(static_cast<size_t>(h));
    topology::Vertex vertex;
    vertex.id = vertex.host = vertex.name = host;
    vertex.kind = topology::VertexKind::kHost;
    graph->addVertex(vertex);
    for (int rail = 0; rail < 2; ++rail) {
      const std::string cidr =
          std::string("127.0.") + std::to_string(rail) + "." + std::to_string(h + 1) + "/24";
      topology::Vertex nic;
      nic.id = host + "/rail" + std::to_string(rail);
      nic.kind = topology::VertexKind::kNic;
      nic.host = host;
      nic.name = "rail" + std::to_string(rail);
      nic.up = true;
      nic.speed_gbps = rail == 0 ? 10 : 2.5;
      nic.addresses = {cidr};
      graph->addVertex(nic);
      const std::string network = topology::networkIdOf(cidr);
      if (graph->find(network) == nullptr) {
        topology::Vertex net;
        net.id = network;
        net.kind = topology::VertexKind::kNetwork;
        graph->addVertex(net);
      }
      graph->addLink({nic.id, network, topology::LinkKind::kEthernet});
    }
    for (int l = 0; l < 2; ++l) {
      topology::RankPlacement placement;
      placement.rank = static_cast<int>(ranks.size());
      placement.host = host;
      placement.local_rank = l;
      ranks.push_back(placement);
    }
  }
  graph->setRanks(std::move(ranks));
  return graph;
}

TEST(TwoLevel, RailBrokenMidAllreduceFailsOverAndResultsStayExact) {
  auto graph = twoRailGraph();
  ASSERT_EQ(graph->rails("h0", "h1").size(), 2u);
  MemoryStore store;
  const size_t count = size_t{1} << 24;  // 64 MiB of floats: long enough to break a rail in
  std::atomic<bool> broke_inside{false};
  auto errors = test::runRanks(4, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = 4;
    options.config.timeout = std::chrono::seconds(60);
    options.config.connect_timeout = std::chrono::seconds(30);
    options.config.algorithm = "two_level";
    options.topology = graph;
    auto comm = Communicator::create(store, options);
    if (comm->transport().rails().size() < 4) {  // 2 rails to each of the other host's ranks
      throw std::runtime_error("rank " + std::to_string(rank) + ": " +
                               std::to_string(comm->transport().rails().size()) + " rails");
    }
    std::vector<float> data(count);
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < count; ++i) {
        data[i] = static_cast<float>(test::inputValue(rank, i, DataType::kFloat32, ReduceOp::kSum));
      }
      std::atomic<bool> inside{true};
      std::thread breaker;
      if (rank == 0 && round == 1) {
        breaker = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          test::tcpDriverOf(comm->transport())
              .breakForTesting(2, 1);  // rank 2: the other host's local rank 0
          broke_inside = inside.load();
        });
      }
      comm->allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
      inside = false;
      if (breaker.joinable()) breaker.join();
      const std::string failures =
          firstDifferences(data.data(), count, 4, DataType::kFloat32, ReduceOp::kSum);
      if (!failures.empty()) {
        throw std::runtime_error("rank " + std::to_string(rank) + " round " +
                                 std::to_string(round) + ":" + failures);
      }
    }
    if (rank == 0) {
      bool both_carried = true;
      for (const auto& rail : comm->transport().rails()) {
        if (rail.peer == 2 && rail.bytes_sent == 0) both_carried = false;
      }
      if (!both_carried) throw std::runtime_error("a rail to rank 2 carried nothing");
    }
  });
  test::rethrowFirst(errors);
  // Timing, not correctness: on a badly loaded machine the break may land after the call.
  if (!broke_inside) GTEST_SKIP() << "the rail broke after the all-reduce had finished";
}

}  // namespace
}  // namespace railshard
