// The cluster graph every rank builds at start-up: gathered once per host, merged by rank 0,
// hash-checked everywhere; errors on one rank raised on all. Ranks are threads sharing a
// MemoryStore here, processes under railshard-launch in the process tests at the end.
#include "launcher/cluster_topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/memory_store.h"
#include "test_util.h"
#include "tests/expect_error.h"

namespace railshard::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using topology::Topology;
using topology::VertexKind;

std::string fixturePath(const std::string& name) {
  return std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/" + name;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The rank the calling thread plays (stores below use it to act per rank).
thread_local int tl_rank = -1;

// Counts the host descriptions published: one per host, however many ranks it has.
class CountingStore : public MemoryStore {
 public:
  void set(const std::string& key, const Bytes& value, Duration timeout) override {
    if (key.find("/topo/host/") != std::string::npos) ++host_descriptions;
    MemoryStore::set(key, value, timeout);
  }
  std::atomic<int> host_descriptions{0};
};

struct Job {
  std::vector<Topology> graphs;
  std::vector<std::exception_ptr> errors;
};

// Runs buildClusterTopology on `size` thread-ranks; hostnames[r] (when given) pretends rank r
// runs on that host.
Job runJob(Store& store, int size, Config config, const std::vector<std::string>& hostnames = {},
           const std::string& prefix = "railshard") {
  Job job;
  job.graphs.resize(static_cast<size_t>(size));
  config.connect_timeout = std::chrono::seconds(20);
  job.errors = test::runRanks(size, [&](int rank) {
    ClusterTopologyOptions options;
    options.rank = rank;
    options.size = size;
    options.config = config;
    options.key_prefix = prefix;
    if (!hostnames.empty()) options.hostname = hostnames[static_cast<size_t>(rank)];
    tl_rank = rank;
    job.graphs[static_cast<size_t>(rank)] = buildClusterTopology(store, options);
  });
  return job;
}

template <typename E>
void expectOnEveryRank(const Job& job, const std::string& needle) {
  for (size_t r = 0; r < job.errors.size(); ++r) {
    test::expectError<E>(job.errors[r], needle, "rank " + std::to_string(r));
  }
}

TEST(ClusterTopology, OneHostEveryRankGetsTheSameGraphWithPlacements) {
  CountingStore store;
  Config config;
  config.topo_dump = railshard::test::tempPath("cluster_dump.json");
  ::unlink(config.topo_dump.c_str());
  const Job job = runJob(store, 3, config);
  test::rethrowFirst(job.errors);
  const Topology& g = job.graphs[0];
  for (const auto& other : job.graphs) EXPECT_EQ(other.toJson(), g.toJson());
  ASSERT_EQ(g.hosts().size(), 1u);
  ASSERT_EQ(g.worldSize(), 3);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(g.hosts()[0], host);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.rank(r).local_rank, r);
    EXPECT_EQ(g.vertex(g.rank(r).numa).kind, VertexKind::kNuma);
    EXPECT_EQ(g.path(0, r).transport,
              r == 0 ? topology::PathTransport::kSelf : topology::PathTransport::kShm);
  }
  EXPECT_EQ(store.host_descriptions.load(), 1);  // discovered once, not once per rank
  EXPECT_EQ(readFile(config.topo_dump), g.toJson());
}

TEST(ClusterTopology, EachHostIsDiscoveredOnceAndRanksAreNumberedPerHost) {
  CountingStore store;
  const Job job = runJob(store, 4, Config{}, {"hx", "hy", "hx", "hy"});
  test::rethrowFirst(job.errors);
  const Topology& g = job.graphs[3];
  EXPECT_EQ(g.hash(), job.graphs[0].hash());
  EXPECT_THAT(g.hosts(), ElementsAre("hx", "hy"));
  EXPECT_THAT(g.ranksOn("hx"), ElementsAre(0, 2));
  EXPECT_THAT(g.ranksOn("hy"), ElementsAre(1, 3));
  EXPECT_EQ(g.rank(2).local_rank, 1);
  EXPECT_EQ(g.rank(3).local_rank, 1);
  EXPECT_EQ(store.host_descriptions.load(), 2);
  // Both "hosts" are this machine, so they share every network: rails pair up the NICs.
  EXPECT_EQ(g.path(0, 1).transport, topology::PathTransport::kTcp);
  EXPECT_EQ(g.path(0, 2).transport, topology::PathTransport::kShm);
}

TEST(ClusterTopology, TopologyFileReplacesDiscovery) {
  MemoryStore store;
  Config config;
  config.topo_file = fixturePath("two_rail_pair.json");
  const Job job = runJob(store, 4, config);
  test::rethrowFirst(job.errors);
  for (const auto& g : job.graphs) EXPECT_EQ(g.toJson(), readFile(config.topo_file));
}

TEST(ClusterTopology, TopologyFileWithoutRanksPlacesRanksByHostName) {
  MemoryStore store;
  auto json = nlohmann::ordered_json::parse(readFile(fixturePath("two_rail_pair.json")));
  json["ranks"] = nlohmann::ordered_json::array();
  Config config;
  config.topo_file = railshard::test::tempPath("no_ranks.json");
  std::ofstream(config.topo_file) << json.dump(2);
  const Job job = runJob(store, 3, config, {"beta", "alpha", "beta"});
  test::rethrowFirst(job.errors);
  const Topology& g = job.graphs[1];
  EXPECT_THAT(g.ranksOn("beta"), ElementsAre(0, 2));
  EXPECT_EQ(g.rank(2).local_rank, 1);
  EXPECT_EQ(g.path(0, 1).transport, topology::PathTransport::kTcp);
  EXPECT_EQ(g.path(0, 1).rail->nic_a, "beta/eth0");

  MemoryStore other;
  expectOnEveryRank<ConfigError>(runJob(other, 2, config, {"alpha", "gamma"}),
                                 "has no host 'gamma' (rank 1 runs there) and no 'ranks' list; "
                                 "hosts in the file: alpha, beta");
}

TEST(ClusterTopology, ErrorsOnOneRankAreRaisedOnEveryRank) {
  MemoryStore store;
  Config config;
  config.topo_file = fixturePath("two_rail_pair.json");
  expectOnEveryRank<ConfigError>(runJob(store, 3, config), "places 4 ranks, but the job has 3");

  MemoryStore missing;
  config.topo_file = "/nonexistent/topo.json";
  expectOnEveryRank<ConfigError>(runJob(missing, 2, config),
                                 "cannot read '/nonexistent/topo.json'");

  MemoryStore ifname;
  Config bad;
  bad.socket_ifname = "=nomatch0";
  expectOnEveryRank<ConfigError>(runJob(ifname, 2, bad), "nomatch0");
}

// A store that alters the graph rank 2 receives, as a rank with another railshard version
// (another parser or serialiser) would see it: its hash then disagrees with rank 0's.
class TamperingStore : public MemoryStore {
 public:
  Bytes get(const std::string& key, Duration timeout) override {
    Bytes value = MemoryStore::get(key, timeout);
    if (tl_rank == 2 && key.find("/graph") != std::string::npos) {
      std::string text(value.begin(), value.end());
      const size_t at = text.find("\"mtu\": ");
      if (at != std::string::npos) text.insert(at + 7, "1");
      value.assign(text.begin(), text.end());
    }
    return value;
  }
};

TEST(ClusterTopology, DisagreeingRanksAllRaiseMismatch) {
  TamperingStore store;
  expectOnEveryRank<MismatchError>(runJob(store, 3, Config{}),
                                   "ranks disagree on the cluster topology: rank 2 computes "
                                   "topology hash");
}

}  // namespace
}  // namespace railshard::launcher
