// Two-level collectives: ranks placed on several "hosts" by a cluster graph (threads of this
// process, so they can all map memory; the graph is what makes them hosts), each host's ranks
// sharing one segment, the hosts joined by real loopback TCP. Results are checked against the
// scalar reference of tests/reference.h. The plan's pure logic: host_layout_test.cc.
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

#include "core/base/error.h"
#include "core/base/memory_store.h"
#include "core/collectives/host_layout.h"
#include "core/collectives/two_level.h"
#include "core/communicator.h"
#include "core/topology/topology.h"
#include "tests/collective_check.h"
#include "tests/reference.h"
#include "tests/test_util.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace railshard {
namespace {

// ---- collectives on several hosts ----

// "h<index>", built by appending: GCC 12 warns (-Wrestrict, a false positive) about
// "h" + std::to_string(...).
std::string hostName(size_t index) {
  std::string name = "h";
  name += std::to_string(index);
  return name;
}

// A cluster graph of hosts h0, h1, ... with rank r on host host_of[r].
std::shared_ptr<topology::Topology> graphPlacing(const std::vector<int>& host_of) {
  auto graph = std::make_shared<topology::Topology>();
  const int hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
  for (int h = 0; h < hosts; ++h) {
    topology::Vertex host;
    host.id = host.host = host.name = hostName(static_cast<size_t>(h));
    host.kind = topology::VertexKind::kHost;
    graph->addVertex(host);
  }
  std::vector<topology::RankPlacement> ranks;
  std::vector<int> locals(static_cast<size_t>(hosts), 0);
  for (size_t r = 0; r < host_of.size(); ++r) {
    topology::RankPlacement placement;
    placement.rank = static_cast<int>(r);
    placement.host = hostName(static_cast<size_t>(host_of[r]));
    placement.local_rank = locals[static_cast<size_t>(host_of[r])]++;
    ranks.push_back(placement);
  }
  graph->setRanks(std::move(ranks));
  return graph;
}

// per_host[h] ranks on host h, numbered host by host.
std::vector<int> hostByHost(const std::vector<int>& per_host) {
  std::vector<int> host_of;
  for (size_t h = 0; h < per_host.size(); ++h) host_of.insert(host_of.end(), per_host[h], h);
  return host_of;
}

std::vector<std::exception_ptr> onPlacement(const std::vector<int>& host_of,
                                            const std::function<void(Communicator&)>& body,
                                            const std::function<void(int, Config&)>& tweak = {}) {
  const int size = static_cast<int>(host_of.size());
  MemoryStore store;
  auto graph = graphPlacing(host_of);
  return test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config.timeout = std::chrono::seconds(60);
    options.config.connect_timeout = std::chrono::seconds(30);
    options.config.chunk_bytes = 16 * 1024;     // several ring slices at moderate counts
    options.config.shm_slot_bytes = 64 * 1024;  // several shared-memory pieces too
    options.topology = graph;
    if (tweak) tweak(rank, options.config);
    auto comm = Communicator::create(store, options);
    body(*comm);
  });
}

std::vector<std::exception_ptr> onHosts(const std::vector<int>& per_host,
                                        const std::function<void(Communicator&)>& body,
                                        const std::function<void(int, Config&)>& tweak = {}) {
  return onPlacement(hostByHost(per_host), body, tweak);
}

// Payload bytes this rank handed to TCP so far, to ranks of its own host and to the others
// (per-connection counters).
struct TcpPayload {
  uint64_t to_host = 0;
  uint64_t to_others = 0;
};
TcpPayload tcpPayload(Communicator& comm) {
  const auto* layout = comm.hostLayout();
  TcpPayload payload;
  for (const auto& rail : comm.transport().rails()) {
    if (layout->host_of[static_cast<size_t>(rail.peer)] ==
        layout->host_of[static_cast<size_t>(comm.rank())]) {
      payload.to_host += rail.bytes_sent;
    } else {
      payload.to_others += rail.bytes_sent;
    }
  }
  return payload;
}

std::string layoutName(const std::vector<int>& per_host) {
  std::string text;
  for (int n : per_host) {
    if (!text.empty()) text += '_';
    text += std::to_string(n);
  }
  return text;
}

using test::firstDifferences;

// (ranks per host, RAILSHARD_ALGO)
class TwoLevelAllreduce
    : public ::testing::TestWithParam<std::tuple<std::vector<int>, std::string>> {};

TEST_P(TwoLevelAllreduce, EveryDtypeOpAndCountMatchesScalarReference) {
  const auto& per_host = std::get<0>(GetParam());
  const std::string algorithm = std::get<1>(GetParam());
  const std::vector<size_t> counts = {0, 1, 5, 7, 1000, 40001};
  auto errors = onHosts(
      per_host,
      [&](Communicator& comm) {
        if (!comm.usesHostSharedMemory() || comm.usesSharedMemory()) {
          throw std::runtime_error("rank " + std::to_string(comm.rank()) +
                                   ": no per-host shared memory");
        }
        test::checkEveryAllreduce(comm, counts, [&](const std::string& ran) {
          // two_level_direct takes messages up to one slot; larger ones fall back.
          if (algorithm != "auto" && ran != algorithm &&
              !(algorithm == "two_level_direct" && ran == "two_level")) {
            throw std::runtime_error("ran " + ran + ", not " + algorithm);
          }
        });
      },
      [&](int, Config& config) { config.algorithm = algorithm; });
  test::rethrowFirst(errors);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TwoLevelAllreduce,
    ::testing::Combine(::testing::Values(std::vector<int>{2, 2}, std::vector<int>{2, 2, 2},
                                         std::vector<int>{1, 2, 3}, std::vector<int>{3, 1}),
                       ::testing::Values("two_level", "two_level_direct", "auto")),
    [](const auto& info) {
      return "hosts_" + layoutName(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
    });

// Large enough for several pieces of every phase; exact small integers in float.
TEST(TwoLevel, LargeMessageIsExactAndRanksOfOneHostSendNothingToEachOtherOverTcp) {
  const std::vector<int> per_host = {2, 2};
  const size_t count = (size_t{1} << 20) + 3;
  auto errors = onHosts(
      per_host,
      [&](Communicator& comm) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) {
          data[i] = static_cast<float>(
              test::inputValue(comm.rank(), i, DataType::kFloat32, ReduceOp::kSum));
        }
        comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
        if (comm.lastAlgorithm() != "two_level") {
          throw std::runtime_error("ran " + std::string(comm.lastAlgorithm()));
        }
        const std::string failures =
            firstDifferences(data.data(), count, 4, DataType::kFloat32, ReduceOp::kSum);
        if (!failures.empty()) throw std::runtime_error(failures);
        // Bytes counted per connection: none to the rank of the same host, and to the other
        // host's rank of the same local index exactly this rank's share of the ring: half of its
        // block (the reduce-scatter step) and half again (the all-gather step).
        const auto* layout = comm.hostLayout();
        const auto [to_host, to_others] = tcpPayload(comm);
        if (to_host != 0) throw std::runtime_error(std::to_string(to_host) + " bytes to the host");
        const auto blocks = collectives::hostBlocks(count, 2);
        const size_t local =
            static_cast<size_t>(layout->local_rank_of[static_cast<size_t>(comm.rank())]);
        const size_t block = blocks[local + 1] - blocks[local];
        // The 2-rank ring sends the peer's segment, then its own: the whole block once.
        if (to_others != block * sizeof(float)) {
          throw std::runtime_error(std::to_string(to_others) + " bytes across hosts, expected " +
                                   std::to_string(block * sizeof(float)));
        }
      },
      [](int, Config& config) {
        // Loopback between the "hosts" is as fast as TCP gets, and the model rightly prefers the
        // flat ring there; the byte counts are the two-level's.
        config.algorithm = "two_level";
      });
  test::rethrowFirst(errors);
}

// The other collectives still run on a two-level layout (over the transport), and the
// segment does not disturb them.
TEST(TwoLevel, OtherCollectivesInterleavedWithTwoLevelAllreduces) {
  const std::vector<int> per_host = {1, 2, 3};
  const int size = 6;
  auto errors = onHosts(per_host, [&](Communicator& comm) {
    for (int round = 0; round < 3; ++round) {
      std::vector<int32_t> data(300, comm.rank() + round);
      comm.allreduce(data.data(), data.size(), DataType::kInt32, ReduceOp::kSum);
      for (int32_t v : data) {
        if (v != 15 + size * round) throw std::runtime_error("allreduce " + std::to_string(v));
      }
      std::vector<int32_t> gathered(size * 4);
      std::vector<int32_t> mine(4, comm.rank());
      comm.allgather(mine.data(), gathered.data(), 4, DataType::kInt32);
      for (int r = 0; r < size; ++r) {
        if (gathered[static_cast<size_t>(r) * 4] != r) throw std::runtime_error("allgather");
      }
      std::vector<int32_t> root(8, comm.rank() == round ? 42 + round : -1);
      comm.broadcast(root.data(), root.size(), DataType::kInt32, round);
      if (root[7] != 42 + round) throw std::runtime_error("broadcast");
      comm.barrier();
    }
  });
  test::rethrowFirst(errors);
}

// Broadcast from every root and barriers on unequal hosts: the data arrives everywhere, and
// the ranks of a host send each other nothing over TCP (each connection's payload counted).
TEST(TwoLevel, BroadcastAndBarrierFromEveryRootStayInsideTheHosts) {
  const std::vector<int> per_host = {1, 2, 3};
  auto errors = onHosts(per_host, [&](Communicator& comm) {
    for (int root = 0; root < comm.size(); ++root) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{300001}}) {
        const bool in_place = (root + static_cast<int>(count)) % 2 == 0;
        std::vector<int32_t> send(count, -1);
        std::vector<int32_t> recv(count, -2);
        if (comm.rank() == root) {
          for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(root * 7 + i);
        }
        int32_t* out = in_place ? send.data() : recv.data();
        comm.broadcast(send.data(), out, count, DataType::kInt32, root);
        for (size_t i = 0; i < count; ++i) {
          if (out[i] != static_cast<int32_t>(root * 7 + i)) {
            throw std::runtime_error("rank " + std::to_string(comm.rank()) + " root " +
                                     std::to_string(root) + " count " + std::to_string(count) +
                                     " [" + std::to_string(i) + "] = " + std::to_string(out[i]));
          }
        }
        comm.barrier();
      }
    }
    const uint64_t to_host = tcpPayload(comm).to_host;
    if (to_host != 0) {
      throw std::runtime_error("rank " + std::to_string(comm.rank()) + " sent " +
                               std::to_string(to_host) + " bytes to ranks of its host");
    }
  });
  test::rethrowFirst(errors);
}

// Reduce-scatter and all-gather, every dtype x op, on equal, unequal and interleaved hosts
// (rank r on host host_of[r]): exact against the reference, and the ranks of a host send each
// other nothing over TCP.
class TwoLevelBlocks : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(TwoLevelBlocks, ReduceScatterAndAllgatherMatchReferenceAndStayInsideTheHosts) {
  auto errors = onPlacement(GetParam(), [&](Communicator& comm) {
    if (!comm.usesHostSharedMemory() || comm.usesSharedMemory()) {
      throw std::runtime_error("rank " + std::to_string(comm.rank()) +
                               ": no per-host shared memory");
    }
    test::checkEveryReduceScatter(comm, {0, 1, 7, 20001});
    test::checkEveryAllgather(comm, {0, 1, 7, 20001});
    const uint64_t to_host = tcpPayload(comm).to_host;
    if (to_host != 0) {
      throw std::runtime_error("rank " + std::to_string(comm.rank()) + " sent " +
                               std::to_string(to_host) + " bytes to ranks of its host");
    }
  });
  test::rethrowFirst(errors);
}

INSTANTIATE_TEST_SUITE_P(Placements, TwoLevelBlocks,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},
                                           std::vector<int>{0, 0, 1, 1, 2, 2},
                                           std::vector<int>{0, 1, 1, 2, 2, 2},
                                           std::vector<int>{0, 0, 0, 1},
                                           std::vector<int>{0, 1, 0, 1, 2, 1}),
                         [](const auto& info) {
                           std::string name = "ranks_on";
                           for (int h : info.param) {
                             name += '_';  // appended: "_" + to_string trips -Wrestrict
                             name += std::to_string(h);
                           }
                           return name;
                         });

// Each rank moves one block per other host across, the ring's (H-1)/H of the buffer per host:
// reduce-scatter sends its host's partial sum of each other host's block of its local index,
// all-gather its own block to one rank per other host.
TEST(TwoLevel, ReduceScatterAndAllgatherSendOneBlockPerOtherHost) {
  const size_t block = (size_t{1} << 18) + 5;  // 1 MiB of floats: several pieces in the host
  auto errors = onHosts({2, 2, 2}, [&](Communicator& comm) {
    const size_t n = static_cast<size_t>(comm.size());
    std::vector<float> input(block * n);
    for (size_t i = 0; i < input.size(); ++i) {
      input[i] =
          static_cast<float>(test::inputValue(comm.rank(), i, DataType::kFloat32, ReduceOp::kSum));
    }
    std::vector<float> mine(block);
    const uint64_t before = tcpPayload(comm).to_others;
    comm.reduceScatter(input.data(), mine.data(), block, DataType::kFloat32, ReduceOp::kSum);
    const uint64_t after_rs = tcpPayload(comm).to_others;
    for (size_t i = 0; i < block; ++i) {
      const double expected = test::expectedValue(comm.size(), comm.rank() * block + i,
                                                  DataType::kFloat32, ReduceOp::kSum);
      if (mine[i] != static_cast<float>(expected)) {
        throw std::runtime_error("reduce_scatter [" + std::to_string(i) +
                                 "] = " + std::to_string(mine[i]));
      }
    }
    std::vector<float> all(block * n);
    comm.allgather(mine.data(), all.data(), block, DataType::kFloat32);
    const uint64_t after_ag = tcpPayload(comm).to_others;
    const std::string failures =
        firstDifferences(all.data(), all.size(), comm.size(), DataType::kFloat32, ReduceOp::kSum);
    if (!failures.empty()) throw std::runtime_error("allgather:" + failures);
    const uint64_t expected_bytes = 2 * block * sizeof(float);  // 3 hosts: 2 others
    if (after_rs - before != expected_bytes || after_ag - after_rs != expected_bytes) {
      throw std::runtime_error("rank " + std::to_string(comm.rank()) + " sent " +
                               std::to_string(after_rs - before) + " and " +
                               std::to_string(after_ag - after_rs) + " bytes across, expected " +
                               std::to_string(expected_bytes) + " each");
    }
    if (tcpPayload(comm).to_host != 0) throw std::runtime_error("bytes to the host");
  });
  test::rethrowFirst(errors);
}

// The start-up measurements: every rank, on one host or several (also a rank alone on its
// host), ends up with the same figures, or the ranks' tuners could choose different algorithms
// for one size. One host: the efficiency limit is the measured copy rate.
TEST(TwoLevel, MeasuredLinksAreTheSameOnEveryRank) {
  for (const std::vector<int>& per_host :
       {std::vector<int>{1, 2, 3}, std::vector<int>{2, 2}, std::vector<int>{3}}) {
    std::mutex mutex;
    std::vector<collectives::MeasuredLinks> seen;
    std::vector<std::string> limits;
    auto errors = onHosts(per_host, [&](Communicator& comm) {
      const auto measured = comm.measuredLinks();
      const auto limit = comm.linkLimit();
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(measured);
      if (per_host.size() == 1) {
        if (std::fabs(limit.gbps - measured.shm.beta_gbps * 8) > 1e-9 ||
            limit.description.find("shared memory") == std::string::npos) {
          limits.push_back(std::to_string(limit.gbps) + " " + limit.description);
        }
      }
    });
    test::rethrowFirst(errors);
    ASSERT_EQ(seen.size(),
              static_cast<size_t>(std::accumulate(per_host.begin(), per_host.end(), 0)));
    EXPECT_GT(seen[0].shm.alpha_us, 0);
    EXPECT_GT(seen[0].shm.beta_gbps, 0);
    EXPECT_GT(seen[0].reduce_gbps, 0);
    for (const auto& each : seen) {
      EXPECT_EQ(each.shm.alpha_us, seen[0].shm.alpha_us);
      EXPECT_EQ(each.shm.beta_gbps, seen[0].shm.beta_gbps);
      EXPECT_EQ(each.reduce_gbps, seen[0].reduce_gbps);
    }
    EXPECT_TRUE(limits.empty()) << limits.front();
  }
}

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

TEST(TwoLevel, ForcedWithoutSeveralRanksPerHostIsAConfigError) {
  auto errors = onHosts(
      {1, 1},
      [&](Communicator& comm) {
        std::vector<float> data(10, 1.0f);
        comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      },
      [](int, Config& config) { config.algorithm = "two_level"; });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const ConfigError& c) {
      EXPECT_NE(std::string(c.what()).find("two_level"), std::string::npos) << c.what();
    }
  }
  // RAILSHARD_TRANSPORT=tcp keeps same-host ranks on TCP (the flat algorithms).
  auto flat = onHosts(
      {2, 2},
      [&](Communicator& comm) {
        if (comm.usesHostSharedMemory()) throw std::runtime_error("shared memory despite tcp");
        std::vector<float> data(10, 1.0f);
        comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
        if (data[0] != 4.0f) throw std::runtime_error("wrong sum");
      },
      [](int, Config& config) { config.transport = "tcp"; });
  test::rethrowFirst(flat);
}

// Large enough to be pipelined in several chunks (twoLevelChunks), on unequal hosts.
TEST(TwoLevel, PipelinedChunksOnUnequalHostsAreExact) {
  const std::vector<int> per_host = {1, 2, 3};
  const size_t count = (size_t{3} << 19) + 7;  // 6 MiB of floats: 3 chunks
  ASSERT_GE(collectives::twoLevelChunks(count, 4), 3u);
  auto errors = onHosts(
      per_host,
      [&](Communicator& comm) {
        for (const auto& [dtype, op] :
             std::vector<std::pair<DataType, ReduceOp>>{{DataType::kFloat32, ReduceOp::kSum},
                                                        {DataType::kInt32, ReduceOp::kAvg},
                                                        {DataType::kBFloat16, ReduceOp::kMax}}) {
          for (const bool in_place : {true, false}) {
            std::vector<uint8_t> input(count * sizeOf(dtype));
            for (size_t i = 0; i < count; ++i) {
              test::storeValue(input.data(), i, dtype, test::inputValue(comm.rank(), i, dtype, op));
            }
            std::vector<uint8_t> output(in_place ? 0 : input.size(), 0xee);
            void* result = in_place ? input.data() : output.data();
            comm.allreduce(input.data(), result, count, dtype, op);
            const std::string failures = firstDifferences(result, count, 6, dtype, op);
            if (!failures.empty()) {
              throw std::runtime_error(std::string(name(dtype)) + " " + std::string(name(op)) +
                                       (in_place ? " in place" : "") + ":" + failures);
            }
          }
        }
      },
      [](int, Config& config) { config.algorithm = "two_level"; });
  test::rethrowFirst(errors);
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
          auto& tcp = dynamic_cast<transport::tcp::TcpTransport&>(comm->transport());
          tcp.breakConnectionForTesting(2, 1);  // rank 2: the other host's local rank 0
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
