// The cluster graph of a grown generation (launcher/cluster_growth.h): the members' graph
// extended by the joiners' hosts, agreed by hash on every rank. Ranks are threads over one
// MemoryStore that pretend to run on hosts by name (every "host" is this machine, so they
// share its networks and rails pair up its NICs); the last test grows real communicators,
// connected over TCP, and checks their sums.
#include "launcher/cluster_growth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/collectives/host_layout.h"
#include "test_util.h"
#include "tests/expect_error.h"

namespace railshard::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using topology::Topology;

// Counts the host descriptions published, by the round's prefix ("gen0", "gen1").
class CountingStore : public MemoryStore {
 public:
  void set(const std::string& key, const Bytes& value, Duration timeout) override {
    if (key.find("/topo/host/") != std::string::npos) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++host_descriptions_[key.substr(0, key.find('/'))];
    }
    MemoryStore::set(key, value, timeout);
  }
  int hostDescriptions(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mutex_);
    return host_descriptions_[prefix];
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> host_descriptions_;
};

Config testConfig() {
  Config config;
  config.connect_timeout = std::chrono::seconds(20);
  return config;
}

// The start-up graph of ranks on `hosts` (by name), as every rank gets it.
Topology startGraph(Store& store, const std::vector<std::string>& hosts,
                    const Config& config = testConfig()) {
  std::vector<Topology> graphs(hosts.size());
  const int size = static_cast<int>(hosts.size());
  test::rethrowFirst(test::runRanks(size, [&](int rank) {
    ClusterTopologyOptions options;
    options.rank = rank;
    options.size = size;
    options.config = config;
    options.key_prefix = "gen0";
    options.hostname = hosts[static_cast<size_t>(rank)];
    graphs[static_cast<size_t>(rank)] = buildClusterTopology(store, options);
  }));
  return graphs[0];
}

// The members' graph as Communicator::grow() hands it: `keep` (old ranks, in order)
// renumbered 0..n-1.
std::shared_ptr<const Topology> membersGraph(const Topology& graph, const std::vector<int>& keep) {
  auto members = std::make_shared<Topology>(graph);
  std::vector<topology::RankPlacement> placements;
  for (size_t r = 0; r < keep.size(); ++r) {
    topology::RankPlacement placement = graph.rank(keep[r]);
    placement.rank = static_cast<int>(r);
    placements.push_back(placement);
  }
  members->setRanks(std::move(placements));
  return members;
}

struct Grown {
  std::vector<Topology> graphs;
  std::vector<std::exception_ptr> errors;
};

// extendClusterTopology on hosts.size() thread-ranks: the first `members` hold `known`.
Grown grow(Store& store, const std::shared_ptr<const Topology>& known, int members,
           const std::vector<std::string>& hosts, const std::string& prefix = "gen1",
           const std::function<void(int, Config&)>& configure = {}) {
  Grown grown;
  const int size = static_cast<int>(hosts.size());
  grown.graphs.resize(hosts.size());
  grown.errors = test::runRanks(size, [&](int rank) {
    Communicator::GraphRound round;
    round.key_prefix = prefix;
    round.rank = rank;
    round.size = size;
    round.members = members;
    if (rank < members) round.known = known;
    ClusterTopologyOptions options;
    options.config = testConfig();
    if (configure) configure(rank, options.config);
    options.hostname = hosts[static_cast<size_t>(rank)];
    grown.graphs[static_cast<size_t>(rank)] = extendClusterTopology(store, round, options);
  });
  return grown;
}

template <typename E>
void expectOnEveryRank(const Grown& grown, const std::string& needle) {
  for (size_t r = 0; r < grown.errors.size(); ++r) {
    test::expectError<E>(grown.errors[r], needle, "rank " + std::to_string(r));
  }
}

// Members on ha, ha, hb; one joiner from ha (placed beside its members, next local rank) and
// one from hc, a machine new to the cluster (discovered, merged, with the same rails to the
// others as hb has).
TEST(ClusterGrowth, JoinersArePlacedOnTheirMembersHostOrOnTheirNewHost) {
  CountingStore store;
  const Topology start = startGraph(store, {"ha", "ha", "hb"});
  const Grown grown =
      grow(store, membersGraph(start, {0, 1, 2}), 3, {"ha", "ha", "hb", "ha", "hc"});
  test::rethrowFirst(grown.errors);
  const Topology& g = grown.graphs[0];
  for (const auto& other : grown.graphs) EXPECT_EQ(other.toJson(), g.toJson());
  EXPECT_THAT(g.hosts(), ElementsAre("ha", "hb", "hc"));
  ASSERT_EQ(g.worldSize(), 5);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(g.rank(r), start.rank(r)) << "member " << r << " moved";
  EXPECT_THAT(g.ranksOn("ha"), ElementsAre(0, 1, 3));
  EXPECT_EQ(g.rank(3).local_rank, 2);
  EXPECT_THAT(g.ranksOn("hc"), ElementsAre(4));
  EXPECT_EQ(g.rank(4).local_rank, 0);
  EXPECT_EQ(g.path(0, 3).transport, topology::PathTransport::kShm);
  EXPECT_EQ(g.path(0, 4).transport, g.path(0, 2).transport);
  EXPECT_EQ(g.rails("ha", "hc").size(), g.rails("ha", "hb").size());
  // Every vertex of the members' graph is still there, unchanged.
  for (const auto* vertex : start.vertices()) EXPECT_EQ(g.vertex(vertex->id), *vertex);
  // One discovery at start-up per host, then one per joiners' host (hc's was needed).
  EXPECT_EQ(store.hostDescriptions("gen0"), 2);
  EXPECT_EQ(store.hostDescriptions("gen1"), 2);
}

// After a shrink (rank 1 of ha lost) the rank restarted on ha gets the free local rank 1 --
// the GPU its slot had -- and a rank coming back to hb, whose ranks were all lost, is placed
// on the hb the cluster knew, without merging it again.
TEST(ClusterGrowth, ARestartedRankGetsTheFreeLocalRankAndAnEmptiedHostIsReused) {
  MemoryStore store;
  const Topology start = startGraph(store, {"ha", "ha", "ha", "hb"});
  const Grown grown = grow(store, membersGraph(start, {0, 2}), 2, {"ha", "ha", "ha", "hb"});
  test::rethrowFirst(grown.errors);
  const Topology& g = grown.graphs[3];
  EXPECT_EQ(g.hash(), grown.graphs[0].hash());
  EXPECT_THAT(g.ranksOn("ha"), ElementsAre(0, 1, 2));
  EXPECT_EQ(g.rank(0).local_rank, 0);
  EXPECT_EQ(g.rank(1).local_rank, 2);
  EXPECT_EQ(g.rank(2).local_rank, 1);  // the lost rank's
  EXPECT_THAT(g.ranksOn("hb"), ElementsAre(3));
  EXPECT_THAT(g.hosts(), ElementsAre("ha", "hb"));
  EXPECT_EQ(g.vertices().size(), start.vertices().size());
}

// RAILSHARD_PROBE=1: a host of joiners alone has never been measured, so the grown generation
// probes the rails again (every host pair; the members' earlier measurements are replaced);
// a joiner beside its host's members needs no probe.
TEST(ClusterGrowth, WithTheProbeOnANewHostsRailsAreMeasured) {
  MemoryStore store;
  Config config = testConfig();
  config.probe = true;
  config.probe_time = std::chrono::milliseconds(50);
  const Topology start = startGraph(store, {"ha", "hb"}, config);
  const auto rails_ab = start.rails("ha", "hb");
  if (rails_ab.empty()) GTEST_SKIP() << "this machine has no interface that forms a rail";
  for (const auto& rail : rails_ab) EXPECT_GT(rail.measured_gbps, 0) << rail.nic_a;
  const auto probed = [&](int, Config& c) { c = config; };
  const Grown same_host =
      grow(store, membersGraph(start, {0, 1}), 2, {"ha", "hb", "hb"}, "g1", probed);
  test::rethrowFirst(same_host.errors);
  EXPECT_EQ(same_host.graphs[0].rails("ha", "hb"), rails_ab);  // not measured again
  const Grown new_host =
      grow(store, membersGraph(start, {0, 1}), 2, {"ha", "hb", "hc"}, "g2", probed);
  test::rethrowFirst(new_host.errors);
  const Topology& g = new_host.graphs[2];
  EXPECT_EQ(g.hash(), new_host.graphs[0].hash());
  for (const auto& [a, b] : {std::pair{"ha", "hc"}, std::pair{"hb", "hc"}, std::pair{"ha", "hb"}}) {
    const auto rails = g.rails(a, b);
    ASSERT_EQ(rails.size(), rails_ab.size()) << a << "-" << b;
    for (const auto& rail : rails) EXPECT_GT(rail.measured_gbps, 0) << a << "-" << b;
  }
}

// Errors on one rank reach every rank with their type: a joiner's host discovery that fails
// (its RAILSHARD_SOCKET_IFNAME matches nothing), and a joiner from a host the topology file
// does not name.
TEST(ClusterGrowth, ErrorsAreRaisedOnEveryRank) {
  MemoryStore store;
  const Topology start = startGraph(store, {"ha", "hb"});
  expectOnEveryRank<ConfigError>(
      grow(store, membersGraph(start, {0, 1}), 2, {"ha", "hb", "hc"}, "bad-ifname",
           [](int rank, Config& config) {
             if (rank == 2) config.socket_ifname = "=nomatch0";
           }),
      "nomatch0");

  MemoryStore file_store;
  auto json = nlohmann::ordered_json::parse([] {
    std::ifstream in(std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/two_rail_pair.json");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }());
  json["ranks"] = nlohmann::ordered_json::array();
  Config file_config = testConfig();
  file_config.topo_file = test::tempPath("growth_no_ranks.json");
  std::ofstream(file_config.topo_file) << json.dump(2);
  const Topology from_file = startGraph(file_store, {"alpha", "beta"}, file_config);
  const auto configure = [&](int, Config& config) { config = file_config; };
  // A joiner on a host the file names is placed there...
  const Grown ok = grow(file_store, membersGraph(from_file, {0, 1}), 2, {"alpha", "beta", "beta"},
                        "f1", configure);
  test::rethrowFirst(ok.errors);
  EXPECT_THAT(ok.graphs[2].ranksOn("beta"), ElementsAre(1, 2));
  // ... one on a host it does not name is refused on every rank.
  expectOnEveryRank<ConfigError>(grow(file_store, membersGraph(from_file, {0, 1}), 2,
                                      {"alpha", "beta", "gamma"}, "f2", configure),
                                 "has no host 'gamma' (joining rank 2 runs there)");
}

// A joiner that never publishes (it died after it was admitted): every rank gets a
// TimeoutError within the connect timeout, so that grow() can fall back to the members.
TEST(ClusterGrowth, AJoinerThatNeverComesTimesOutOnEveryRank) {
  MemoryStore store;
  const Topology start = startGraph(store, {"ha", "hb"});
  const auto known = membersGraph(start, {0, 1});
  std::vector<std::exception_ptr> errors = test::runRanks(2, [&](int rank) {
    Communicator::GraphRound round;
    round.key_prefix = "gen1";
    round.rank = rank;
    round.size = 3;  // rank 2 never comes
    round.members = 2;
    round.known = known;
    ClusterTopologyOptions options;
    options.config = testConfig();
    options.config.connect_timeout = std::chrono::seconds(1);
    options.hostname = rank == 0 ? "ha" : "hb";
    extendClusterTopology(store, round, options);
  });
  for (const auto& error : errors) {
    ASSERT_NE(error, nullptr);
    try {
      std::rethrow_exception(error);
    } catch (const TimeoutError& e) {
      EXPECT_THAT(e.what(), HasSubstr("gen1/topo/rank/2"));
    }
  }
}

// Real communicators: three members on ha, ha, hb grow by a joiner from ha and one from hc.
// Every rank of the new generation holds the same extended graph, the host layout follows it
// (the ha joiner shares ha's segment), and sums over all five are exact.
TEST(ClusterGrowth, AGrownCommunicatorUsesTheExtendedGraph) {
  auto store = std::make_shared<MemoryStore>();
  const std::vector<std::string> hosts = {"ha", "ha", "hb", "ha", "hc"};
  Config config = testConfig();
  config.timeout = std::chrono::seconds(30);
  config.token = "job";
  const Topology start = startGraph(*store, {"ha", "ha", "hb"}, config);
  // The extender every rank carries, pretending to run on its host of the grown generation.
  const auto extender = [&](Store& s, const Communicator::GraphRound& round) {
    ClusterTopologyOptions options;
    options.config = config;
    options.hostname = hosts[static_cast<size_t>(round.rank)];
    return std::make_shared<const Topology>(extendClusterTopology(s, round, options));
  };
  std::vector<std::string> hashes(hosts.size());
  const auto check = [&](Communicator& comm) {
    ASSERT_NE(comm.topology(), nullptr);
    hashes[static_cast<size_t>(comm.rank())] = comm.topology()->hash();
    EXPECT_EQ(comm.topology()->worldSize(), 5);
    const auto* layout = comm.hostLayout();
    ASSERT_NE(layout, nullptr);
    EXPECT_EQ(layout->hosts, (std::vector<std::vector<int>>{{0, 1, 3}, {2}, {4}}));
    std::vector<double> data(257);
    for (size_t i = 0; i < data.size(); ++i) data[i] = comm.worldRank() * 1000.0 + double(i);
    comm.allreduce(data.data(), data.size(), DataType::kFloat64, ReduceOp::kSum);
    for (size_t i = 0; i < data.size(); ++i) {
      EXPECT_EQ(data[i], (0 + 1 + 2 + 3 + 4) * 1000.0 + 5.0 * double(i)) << i;
    }
  };
  std::vector<std::future<void>> joiners;
  for (int j = 0; j < 2; ++j) {
    joiners.push_back(std::async(std::launch::async, [&] {
      Communicator::Options options;
      options.config = config;
      options.store = store;
      options.extend_topology = extender;
      auto comm = Communicator::join(options, std::chrono::milliseconds(30000));
      check(*comm);
    }));
    // The second asks after the first, so that the ha joiner is rank 3.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (store->add("railshard/joiners", 0, std::chrono::seconds(1)) < j + 1) {
      ASSERT_LT(std::chrono::steady_clock::now(), end);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    store->wait({"railshard/joiner/" + std::to_string(j + 1)}, std::chrono::seconds(10));
  }
  test::rethrowFirst(test::runRanks(3, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = 3;
    options.config = config;
    options.store = store;
    options.topology = std::make_shared<const Topology>(start);
    options.extend_topology = extender;
    auto comm = Communicator::create(*store, options);
    auto grown = comm->grow(std::chrono::milliseconds(30000));
    check(*grown);
  }));
  for (auto& joiner : joiners) joiner.get();
  for (const auto& hash : hashes) EXPECT_EQ(hash, hashes[0]);
}

}  // namespace
}  // namespace railshard::launcher
