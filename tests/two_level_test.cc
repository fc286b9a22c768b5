// Two-level collectives on several "hosts" (tests/multi_host.h), results checked against the
// scalar reference of tests/reference.h. Failures, mismatches and rails that break:
// two_level_failure_test.cc. The plan's pure logic: host_layout_test.cc.
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
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard {
namespace {

using test::graphPlacing;
using test::hostName;
using test::onHosts;
using test::onPlacement;
using test::tcpPayload;

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
          // two_level_direct and _leader take messages up to one slot; larger ones fall back.
          const bool one_slot = algorithm == "two_level_direct" || algorithm == "two_level_leader";
          if (algorithm != "auto" && ran != algorithm && !(one_slot && ran == "two_level")) {
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
                       ::testing::Values("two_level", "two_level_direct", "two_level_leader",
                                         "auto")),
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
      [](int, Config& config) { config.transport = TransportKind::kTcp; });
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

}  // namespace
}  // namespace railshard
