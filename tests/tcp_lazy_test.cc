// TCP connections made on first use (RAILSHARD_TCP_CONNECT=lazy): a rank holds sockets only to
// the peers its collectives and messages use, each pair one connection even when both ranks
// dial at once, and a peer that can never be connected is an error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/collectives/two_level.h"
#include "core/communicator.h"
#include "tests/collective_check.h"
#include "tests/expect_error.h"
#include "tests/multi_host.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

using Pairs = std::set<std::pair<int, int>>;

// The TCP connections up from `comm` (to ranks of other hosts), and how many links it has to
// each peer (one, connected or not, for a pair connected on first use).
struct TcpView {
  std::set<int> up;
  std::map<int, int> links;
};

TcpView tcpViewOf(Communicator& comm) {
  TcpView view;
  for (const auto& rail : comm.transport().rails()) {
    if (rail.name != "tcp") continue;
    ++view.links[rail.peer];
    if (rail.up) view.up.insert(rail.peer);
  }
  return view;
}

void lazy(int, Config& config) {
  config.links.tcp_connect = LaneConnect::kLazy;
}

// Runs one all-reduce of `algorithm` on 3 hosts x 2 ranks, checks its sum against a scalar loop,
// and returns the pairs whose TCP connection is up afterwards (each as seen by both ranks).
Pairs pairsAfter(const std::string& algorithm, std::vector<int>& connected_before) {
  constexpr int kSize = 6;
  std::mutex mutex;
  Pairs pairs;
  connected_before.assign(kSize, -1);
  auto errors = test::onHosts(
      {2, 2, 2},
      [&](Communicator& comm) {
        const int before = static_cast<int>(tcpViewOf(comm).up.size());
        std::vector<int32_t> data(1000);
        for (size_t i = 0; i < data.size(); ++i) {
          data[i] = static_cast<int32_t>(i) * (comm.rank() + 1) - comm.rank();
        }
        comm.allreduce(data.data(), data.size(), DataType::kInt32, ReduceOp::kSum);
        for (size_t i = 0; i < data.size(); ++i) {
          int32_t expected = 0;
          for (int r = 0; r < kSize; ++r) expected += static_cast<int32_t>(i) * (r + 1) - r;
          if (data[i] != expected) {
            throw std::runtime_error(algorithm + ": element " + std::to_string(i) + " is " +
                                     std::to_string(data[i]) + ", not " + std::to_string(expected));
          }
        }
        comm.barrier();  // every pair the all-reduce used is connected on both ends
        const TcpView view = tcpViewOf(comm);
        std::lock_guard<std::mutex> lock(mutex);
        connected_before[static_cast<size_t>(comm.rank())] = before;
        for (int peer : view.up) {
          pairs.emplace(std::min(comm.rank(), peer), std::max(comm.rank(), peer));
        }
        for (const auto& [peer, count] : view.links) {
          if (count != 1) {
            throw std::runtime_error("rank " + std::to_string(comm.rank()) + " has " +
                                     std::to_string(count) + " TCP links to rank " +
                                     std::to_string(peer));
          }
        }
      },
      [&](int rank, Config& config) {
        lazy(rank, config);
        config.algorithm = algorithm;
      });
  test::rethrowFirst(errors);
  return pairs;
}

TEST(TcpLazy, OnlyThePairsAnAllreduceUsesAreConnected) {
  std::vector<int> before;
  // The leaders (local rank 0: ranks 0, 2, 4) alone cross hosts; the barrier after it is
  // two-level too.
  const Pairs leaders = pairsAfter("two_level_leader", before);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(before[static_cast<size_t>(r)], 0) << "rank " << r;
  for (const auto& [a, b] : leaders) {
    EXPECT_TRUE(a % 2 == 0 && b % 2 == 0)
        << "two_level_leader connected ranks " << a << " and " << b << ", not both leaders";
  }
  EXPECT_FALSE(leaders.empty());
  // A flat ring over ranks 0..5: the pairs that cross hosts are its neighbours 1-2, 3-4, 5-0
  // (and the barrier's).
  const Pairs ring = pairsAfter("ring", before);
  for (const auto& pair : Pairs{{1, 2}, {3, 4}, {0, 5}}) {
    EXPECT_EQ(ring.count(pair), 1u) << "ring: ranks " << pair.first << " and " << pair.second
                                    << " are neighbours on different hosts, not connected";
  }
}

TEST(TcpLazy, PairsDialingEachOtherAtOnceShareOneConnectionAndLoseNothing) {
  // Four hosts of one rank: every pair sends both ways at the same moment, so both ranks of
  // every pair dial each other; the higher rank's connection is the one both keep.
  constexpr int kSize = 4;
  constexpr int kRounds = 12;
  auto errors = test::onHosts(
      {1, 1, 1, 1},
      [&](Communicator& comm) {
        const int rank = comm.rank();
        for (int round = 0; round < kRounds; ++round) {
          // Small, then a message of several frames every third round.
          const size_t count = round % 3 == 2 ? (size_t{1} << 18) + 7 : 33 + round;
          std::vector<std::vector<int32_t>> out(kSize), in(kSize);
          std::vector<Communicator::P2PRequest> requests;
          for (int peer = 0; peer < kSize; ++peer) {
            if (peer == rank) continue;
            auto& o = out[static_cast<size_t>(peer)];
            o.resize(count);
            for (size_t i = 0; i < count; ++i) {
              o[i] = static_cast<int32_t>(i * 31 + rank * 1000 + peer * 100 + round);
            }
            in[static_cast<size_t>(peer)].assign(count, -1);
            requests.push_back(comm.irecv(in[static_cast<size_t>(peer)].data(), count,
                                          DataType::kInt32, peer, round));
            requests.push_back(comm.isend(o.data(), count, DataType::kInt32, peer, round));
          }
          for (auto& request : requests) comm.wait(request);
          for (int peer = 0; peer < kSize; ++peer) {
            if (peer == rank) continue;
            const auto& got = in[static_cast<size_t>(peer)];
            for (size_t i = 0; i < count; ++i) {
              const auto want = static_cast<int32_t>(i * 31 + peer * 1000 + rank * 100 + round);
              if (got[i] != want) {
                throw std::runtime_error("rank " + std::to_string(rank) + " round " +
                                         std::to_string(round) + ": element " + std::to_string(i) +
                                         " from rank " + std::to_string(peer) + " is " +
                                         std::to_string(got[i]) + ", not " + std::to_string(want));
              }
            }
          }
        }
        const TcpView view = tcpViewOf(comm);
        EXPECT_EQ(view.up.size(), static_cast<size_t>(kSize - 1)) << "rank " << rank;
        for (const auto& [peer, count] : view.links) {
          EXPECT_EQ(count, 1) << "rank " << rank << " to rank " << peer;
        }
      },
      lazy);
  test::rethrowFirst(errors);
}

TEST(TcpLazy, APeerThatCanNeverBeConnectedIsAnErrorNamingIt) {
  // Rank 1 closes without a message; rank 0 then sends to it: its dials find no listener, and
  // within the heartbeat timeout the send fails naming rank 1 and why.
  std::vector<std::exception_ptr> errors(2);
  auto outer = test::onHosts(
      {1, 1},
      [&](Communicator& comm) {
        if (comm.rank() == 1) return;  // closes its communicator: the listener goes
        // Far less than the heartbeat timeout: rank 1 is gone by the first dial.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        int32_t value = 7;
        try {
          comm.send(&value, 1, DataType::kInt32, 1, 5);
        } catch (...) {
          errors[0] = std::current_exception();
        }
      },
      [](int rank, Config& config) {
        lazy(rank, config);
        config.links.heartbeat_timeout = std::chrono::milliseconds(1000);
      });
  test::rethrowFirst(outer);
  test::expectError<PeerLostError>(errors[0], "rank 1", "rank 0");
  test::expectError<PeerLostError>(errors[0], "could not be connected", "rank 0");
}

TEST(TcpLazy, SmallAllgathersAcrossManyHostsGoThroughTheLeadersAndMeetFewPeers) {
  // 17 hosts (over kLeaderAllgatherHosts), three with several ranks numbered out of host order:
  // small all-gathers take the leaders' path (bruckAllgatherv across), a large one the direct
  // path; both against the reference. After the small ones only leaders are connected across,
  // each to its Bruck partners at distances 1, 2, 4, 8, 16 both ways (the dissemination
  // barrier's too): at most 2 ceil(log2 17) = 10 other leaders.
  std::vector<int> host_of;
  for (int h = 0; h < 17; ++h) host_of.push_back(h);
  for (int h : {0, 5, 5}) host_of.push_back(h);
  ASSERT_GT(17, collectives::kLeaderAllgatherHosts);
  auto errors = test::onPlacement(
      host_of,
      [&](Communicator& comm) {
        test::checkEveryAllgather(comm, {0, 1, 7});
        comm.barrier();  // over the leaders too: their partners are the all-gather's
        const TcpView view = tcpViewOf(comm);
        comm.barrier();  // nobody dials this rank for the large all-gather before it looked
        const auto& layout = *comm.hostLayout();
        std::set<int> leaders;
        for (const auto& ranks : layout.hosts) leaders.insert(ranks.front());
        const bool leader = leaders.count(comm.rank()) > 0;
        for (int peer : view.up) {
          if (!leader || leaders.count(peer) == 0) {
            throw std::runtime_error("rank " + std::to_string(comm.rank()) +
                                     " is connected to rank " + std::to_string(peer) +
                                     ": only leaders cross for small all-gathers");
          }
        }
        if (view.up.size() > 10) {
          throw std::runtime_error("rank " + std::to_string(comm.rank()) + " has " +
                                   std::to_string(view.up.size()) + " peers across, over 10");
        }
        // 20 ranks x 20001 elements is over kLeaderAllgatherBytes: the direct path.
        test::checkEveryAllgather(comm, {20001});
      },
      lazy);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace railshard
