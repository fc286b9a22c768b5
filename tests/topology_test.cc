// The cluster graph: canonical JSON, DOT, and the path / rail / affinity queries checked
// against answers worked out by hand from the fixtures (tests/fixtures/README.md).
#include "core/topology/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "base/error.h"
#include "launcher/link_probe.h"
#include "test_util.h"

namespace railshard::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string readFixture(const std::string& name) {
  std::ifstream in(std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Topology fixture(const std::string& name) {
  return Topology::fromJson(readFixture(name), name);
}

template <typename F>
void expectConfigError(F&& body, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "no ConfigError; expected one containing: " << needle;
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, JsonRoundTripIsByteIdentical) {
  const std::string text = readFixture(GetParam());
  const Topology graph = Topology::fromJson(text, GetParam());
  EXPECT_EQ(graph.toJson(), text);
  const Topology again = Topology::fromJson(graph.toJson(), "again");
  EXPECT_EQ(again, graph);
  EXPECT_EQ(again.hash(), graph.hash());
  EXPECT_EQ(graph.hash().size(), 16u);
}

TEST_P(FixtureTest, DotHasEveryVertexAndLinkAndOneClusterPerHost) {
  const Topology graph = fixture(GetParam());
  const std::string dot = graph.toDot();
  for (const Vertex* v : graph.vertices()) {
    if (v->kind == VertexKind::kHost) continue;
    EXPECT_THAT(dot, HasSubstr("\"" + v->id + "\" [")) << v->id;
  }
  size_t edges = 0;
  for (size_t at = dot.find("\" -- \""); at != std::string::npos;
       at = dot.find("\" -- \"", at + 1)) {
    ++edges;
  }
  // Every link, plus one dotted edge from each placed rank to its GPU or NUMA node.
  EXPECT_EQ(edges, graph.links().size() + graph.ranks().size());
  for (size_t i = 0; i < graph.hosts().size(); ++i) {
    EXPECT_THAT(dot, HasSubstr("subgraph cluster_" + std::to_string(i) + " {"));
  }
  EXPECT_THAT(dot, ::testing::Not(HasSubstr("subgraph cluster_" +
                                            std::to_string(graph.hosts().size()) + " ")));
}

TEST_P(FixtureTest, GraphvizAcceptsTheDot) {
  if (test::runProcess({"/bin/sh", "-c", "command -v dot"}).exit_code != 0) {
    GTEST_SKIP() << "Graphviz 'dot' is not installed (apt-get install graphviz)";
  }
  const std::string path = test::tempPath("topo.dot");
  std::ofstream(path) << fixture(GetParam()).toDot();
  const auto result = test::runProcess({"dot", "-Tsvg", "-o", "/dev/null", path});
  EXPECT_EQ(result.exit_code, 0) << result.err;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         ::testing::Values("dgx_host.json", "two_rail_pair.json",
                                           "mixed_cluster.json"),
                         [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.find('.'));
                           for (char& c : name) c = c == '_' ? 'X' : c;
                           return name;
                         });

// ---- DGX-like host ----

TEST(DgxTopology, Shape) {
  const Topology g = fixture("dgx_host.json");
  EXPECT_THAT(g.hosts(), ElementsAre("dgx1"));
  EXPECT_EQ(g.vertices(VertexKind::kGpu).size(), 8u);
  EXPECT_EQ(g.vertices(VertexKind::kPciSwitch).size(), 2u);
  EXPECT_EQ(g.vertices(VertexKind::kNic).size(), 6u);
  EXPECT_EQ(g.vertices().size(), 25u);
  EXPECT_EQ(g.numaOf("dgx1/gpu5"), "dgx1/numa1");
  EXPECT_EQ(g.numaOf("dgx1/ib1"), "dgx1/numa0");
  EXPECT_EQ(g.numaOf("dgx1/eno1"), "dgx1/numa0");
  // Canonical order: natural, so gpu2 comes before gpu10-like ids and GPUs by ordinal.
  const auto gpus = g.vertices(VertexKind::kGpu);
  for (size_t i = 0; i < gpus.size(); ++i) EXPECT_EQ(gpus[i]->index, static_cast<int>(i));
}

TEST(DgxTopology, NvLinkPathsUseTheDirectLinkWithItsLanes) {
  const Topology g = fixture("dgx_host.json");
  const Path doubled = g.path(0, 3);
  EXPECT_EQ(doubled.transport, PathTransport::kNvLink);
  EXPECT_THAT(doubled.vertices, ElementsAre("dgx1/gpu0", "dgx1/gpu3"));
  EXPECT_THAT(doubled.links, ElementsAre(LinkKind::kNvLink));
  EXPECT_DOUBLE_EQ(doubled.bandwidth_gbps, 400);
  EXPECT_DOUBLE_EQ(g.path(0, 1).bandwidth_gbps, 200);
  EXPECT_DOUBLE_EQ(g.path(4, 0).bandwidth_gbps, 400);
  EXPECT_FALSE(g.path(0, 3).rail.has_value());
}

TEST(DgxTopology, GpusWithoutNvLinkGoThroughBothSwitchesAndTheInterconnect) {
  const Topology g = fixture("dgx_host.json");
  const Path p = g.path(0, 5);  // gpu0 and gpu5 share no NVLink in the cube-mesh
  EXPECT_EQ(p.transport, PathTransport::kShm);
  EXPECT_THAT(p.vertices, ElementsAre("dgx1/gpu0", "dgx1/pcisw0", "dgx1/numa0", "dgx1/numa1",
                                      "dgx1/pcisw1", "dgx1/gpu5"));
  EXPECT_THAT(p.links, ElementsAre(LinkKind::kPcie, LinkKind::kPcie, LinkKind::kCpuInterconnect,
                                   LinkKind::kPcie, LinkKind::kPcie));
  EXPECT_DOUBLE_EQ(p.bandwidth_gbps, 126);  // PCIe gen3 x16; the interconnect speed is unknown
  const Path self = g.path(2, 2);
  EXPECT_EQ(self.transport, PathTransport::kSelf);
  EXPECT_THAT(self.vertices, ElementsAre("dgx1/gpu2"));
}

TEST(DgxTopology, AffinityPutsTheSwitchNicsFirstThenTheNumaNodeThenTheRest) {
  const Topology g = fixture("dgx_host.json");
  const Affinity a0 = g.affinity(0);
  EXPECT_EQ(a0.numa, "dgx1/numa0");
  EXPECT_EQ(a0.gpu, "dgx1/gpu0");
  EXPECT_THAT(a0.nics, ElementsAre("dgx1/ib0", "dgx1/ib1", "dgx1/eno1", "dgx1/ib2", "dgx1/ib3"));
  EXPECT_THAT(g.affinity(6).nics,
              ElementsAre("dgx1/ib2", "dgx1/ib3", "dgx1/ib0", "dgx1/ib1", "dgx1/eno1"));
}

// ---- two hosts, two rails ----

TEST(TwoRailTopology, RailsPairTheSubnetsFastestFirstAndSkipTheDockerBridge) {
  const Topology g = fixture("two_rail_pair.json");
  const auto rails = g.rails("alpha", "beta");
  ASSERT_EQ(rails.size(), 2u);
  EXPECT_EQ(rails[0].nic_a, "alpha/eth0");
  EXPECT_EQ(rails[0].nic_b, "beta/eth0");
  EXPECT_EQ(rails[0].address_a, "10.1.0.1");
  EXPECT_EQ(rails[0].address_b, "10.1.0.2");
  EXPECT_EQ(rails[0].network, "net:10.1.0.0/24");
  EXPECT_EQ(rails[0].kind, LinkKind::kEthernet);
  EXPECT_FALSE(rails[0].rdma);
  EXPECT_DOUBLE_EQ(rails[0].nominal_gbps, 25);
  EXPECT_DOUBLE_EQ(rails[0].measured_gbps, 0);
  EXPECT_DOUBLE_EQ(rails[0].gbps(), 25);
  EXPECT_EQ(rails[1].nic_a, "alpha/eth1");
  EXPECT_EQ(rails[1].address_b, "10.2.0.2");
  EXPECT_DOUBLE_EQ(rails[1].nominal_gbps, 10);
  EXPECT_DOUBLE_EQ(rails[1].measured_gbps, 9.41);  // from the fixture's probe link
  EXPECT_DOUBLE_EQ(rails[1].latency_us, 12.5);
  EXPECT_DOUBLE_EQ(rails[1].gbps(), 9.41);
  const auto back = g.rails("beta", "alpha");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].nic_a, "beta/eth0");
  EXPECT_EQ(back[0].address_a, "10.1.0.2");
  EXPECT_DOUBLE_EQ(back[1].measured_gbps, 9.41);
}

TEST(TwoRailTopology, PathsBetweenHostsTakeTheFastRail) {
  const Topology g = fixture("two_rail_pair.json");
  const Path p = g.path(0, 2);
  EXPECT_EQ(p.transport, PathTransport::kTcp);
  EXPECT_THAT(p.vertices, ElementsAre("alpha/numa0", "alpha/eth0", "net:10.1.0.0/24", "beta/eth0",
                                      "beta/numa0"));
  EXPECT_THAT(p.links, ElementsAre(LinkKind::kPcie, LinkKind::kEthernet, LinkKind::kEthernet,
                                   LinkKind::kPcie));
  EXPECT_DOUBLE_EQ(p.bandwidth_gbps, 25);
  ASSERT_TRUE(p.rail.has_value());
  EXPECT_EQ(p.rail->nic_a, "alpha/eth0");
  const Path local = g.path(0, 1);
  EXPECT_EQ(local.transport, PathTransport::kShm);
  EXPECT_THAT(local.vertices, ElementsAre("alpha/numa0"));
  EXPECT_THAT(local.links, ElementsAre(LinkKind::kShm));
}

TEST(TwoRailTopology, AMeasurementCanReorderTheRails) {
  Topology g = fixture("two_rail_pair.json");
  g.addLink({"alpha/eth0", "beta/eth0", LinkKind::kEthernet, 25, 0, 3.5, 20});
  const auto rails = g.rails("alpha", "beta");
  ASSERT_EQ(rails.size(), 2u);
  EXPECT_EQ(rails[0].nic_a, "alpha/eth1");  // 9.41 measured beats 3.5 measured
  EXPECT_DOUBLE_EQ(rails[1].gbps(), 3.5);
  EXPECT_NE(g.hash(), fixture("two_rail_pair.json").hash());
}

// ---- mixed cluster ----

TEST(MixedTopology, RoceRailsComeFirstAndSpeedsAreTheSlowerEnd) {
  const Topology g = fixture("mixed_cluster.json");
  const auto big_small = g.rails("big", "small");
  ASSERT_EQ(big_small.size(), 2u);
  EXPECT_TRUE(big_small[0].rdma);
  EXPECT_EQ(big_small[0].kind, LinkKind::kRoce);
  EXPECT_EQ(big_small[0].nic_a, "big/eth2");
  EXPECT_EQ(big_small[0].address_a, "10.10.0.1");
  EXPECT_EQ(big_small[0].address_b, "10.10.0.2");
  EXPECT_DOUBLE_EQ(big_small[0].nominal_gbps, 100);
  EXPECT_FALSE(big_small[1].rdma);
  EXPECT_EQ(big_small[1].kind, LinkKind::kEthernet);
  EXPECT_DOUBLE_EQ(big_small[1].nominal_gbps, 25);
  const auto big_old = g.rails("big", "old");
  ASSERT_EQ(big_old.size(), 1u);
  EXPECT_EQ(big_old[0].nic_a, "big/eth0");
  EXPECT_DOUBLE_EQ(big_old[0].nominal_gbps, 10);
}

TEST(MixedTopology, CrossHostPathsCrossTheChosenRailBetweenTheGpus) {
  const Topology g = fixture("mixed_cluster.json");
  const Path rdma = g.path(0, 4);  // big/gpu0 (numa0) -> small/gpu0; RoCE NIC is on numa1
  EXPECT_EQ(rdma.transport, PathTransport::kRdma);
  EXPECT_THAT(rdma.vertices,
              ElementsAre("big/gpu0", "big/numa0", "big/numa1", "big/eth2", "net:10.10.0.0/16",
                          "small/eth2", "small/numa0", "small/gpu0"));
  EXPECT_THAT(rdma.links,
              ElementsAre(LinkKind::kPcie, LinkKind::kCpuInterconnect, LinkKind::kPcie,
                          LinkKind::kRoce, LinkKind::kRoce, LinkKind::kPcie, LinkKind::kPcie));
  EXPECT_DOUBLE_EQ(rdma.bandwidth_gbps, 100);
  const Path tcp = g.path(1, 6);  // big/gpu1 -> old/gpu1 over the only shared subnet
  EXPECT_EQ(tcp.transport, PathTransport::kTcp);
  EXPECT_EQ(tcp.vertices.front(), "big/gpu1");
  EXPECT_EQ(tcp.vertices.back(), "old/gpu1");
  EXPECT_DOUBLE_EQ(tcp.bandwidth_gbps, 10);
  EXPECT_EQ(g.path(5, 6).transport, PathTransport::kShm);
}

TEST(MixedTopology, AffinityFollowsTheRanksNumaNode) {
  const Topology g = fixture("mixed_cluster.json");
  EXPECT_THAT(g.affinity(0).nics, ElementsAre("big/eth0", "big/eth2"));
  EXPECT_THAT(g.affinity(2).nics, ElementsAre("big/eth2", "big/eth0"));
  EXPECT_EQ(g.affinity(2).numa, "big/numa1");
  EXPECT_THAT(g.ranksOn("old"), ElementsAre(5, 6));
}

// ---- building, merging, errors ----

Vertex makeVertex(const std::string& id, VertexKind kind, const std::string& host,
                  const std::string& name = "") {
  Vertex v;
  v.id = id;
  v.kind = kind;
  v.host = host;
  v.name = name;
  return v;
}

Topology smallHost(const std::string& name, const std::string& address) {
  Topology t;
  t.addVertex(makeVertex(name, VertexKind::kHost, name, name));
  Vertex numa = makeVertex(name + "/numa0", VertexKind::kNuma, name);
  numa.index = 0;
  t.addVertex(numa);
  Vertex nic = makeVertex(name + "/eth0", VertexKind::kNic, name, "eth0");
  nic.up = true;
  nic.addresses = {address};
  t.addVertex(nic);
  t.addVertex(makeVertex(networkIdOf(address), VertexKind::kNetwork, ""));
  t.addLink({name + "/eth0", name + "/numa0", LinkKind::kVirtual});
  t.addLink({name + "/eth0", networkIdOf(address), LinkKind::kEthernet});
  return t;
}

TEST(TopologyBuild, MergeSharesNetworksAndRejectsConflicts) {
  Topology cluster = smallHost("a", "10.0.0.1/24");
  cluster.merge(smallHost("b", "10.0.0.2/24"));
  EXPECT_THAT(cluster.hosts(), ElementsAre("a", "b"));
  EXPECT_EQ(cluster.vertices(VertexKind::kNetwork).size(), 1u);
  ASSERT_EQ(cluster.rails("a", "b").size(), 1u);
  EXPECT_EQ(cluster.rails("a", "b")[0].address_b, "10.0.0.2");
  Topology other = smallHost("a", "10.0.0.9/24");  // same host name, different machine
  EXPECT_THROW(cluster.merge(other), InvalidArgument);
  other.renameHost("a", "a~2");
  cluster.merge(other);
  EXPECT_THAT(cluster.hosts(), ElementsAre("a", "a~2", "b"));
  EXPECT_NE(cluster.find("a~2/eth0"), nullptr);
}

TEST(TopologyBuild, BadGraphsAreRejectedWithTheReason) {
  Topology t = smallHost("a", "10.0.0.1/24");
  EXPECT_THROW(t.addVertex(makeVertex("a/numa0", VertexKind::kNuma, "a")), InvalidArgument);
  EXPECT_THROW(t.addVertex(makeVertex("x", VertexKind::kGpu, "")), InvalidArgument);
  EXPECT_THROW(t.addLink({"a/eth0", "a/nowhere", LinkKind::kPcie}), InvalidArgument);
  EXPECT_THROW(t.addLink({"a/numa0", "a/eth0", LinkKind::kVirtual}), InvalidArgument);
  EXPECT_THROW(t.setRanks({RankPlacement{1, "a", 0, "", ""}}), InvalidArgument);
  EXPECT_THROW(t.setRanks({RankPlacement{0, "a", 0, "", "a/numa0"}}), InvalidArgument);
  EXPECT_THROW(t.rank(0), InvalidArgument);
  EXPECT_THROW(t.rails("a", "zz"), InvalidArgument);
  t.setRanks({RankPlacement{0, "a", 0, "a/numa0", ""}});
  EXPECT_EQ(t.worldSize(), 1);
}

TEST(TopologyJson, ErrorsNameTheFileTheEntryAndTheField) {
  const std::string good = readFixture("two_rail_pair.json");
  expectConfigError([] { Topology::fromJson("{", "f.json"); }, "f.json: not valid JSON");
  std::string typo = good;
  typo.replace(typo.find("\"speed_gbps\""), 12, "\"spede_gbps\"");
  expectConfigError([&] { Topology::fromJson(typo, "f.json"); },
                    "f.json: vertices[3]: unknown field 'spede_gbps'");
  std::string kind = good;
  kind.replace(kind.find("\"kind\": \"pcie\""), 14, "\"kind\": \"pcix\"");
  expectConfigError([&] { Topology::fromJson(kind, "f.json"); }, "'pcix' is not one of");
  std::string newer = good;
  newer.replace(newer.find("\"version\": 1"), 12, "\"version\": 7");
  expectConfigError([&] { Topology::fromJson(newer, "f.json"); }, "schema version 7 is newer");
  std::string dangling = good;
  dangling.replace(dangling.find("\"b\": \"alpha/numa0\""), 18, "\"b\": \"alpha/numa9\"");
  expectConfigError([&] { Topology::fromJson(dangling, "f.json"); },
                    "unknown vertex 'alpha/numa9'");
  std::string ranks = good;
  ranks.replace(ranks.find("\"rank\": 3"), 9, "\"rank\": 5");
  expectConfigError([&] { Topology::fromJson(ranks, "f.json"); }, "rank 3 has no placement");
}

TEST(TopologyIds, NaturalOrderAndNetworkIds) {
  EXPECT_TRUE(naturalLess("gpu2", "gpu10"));
  EXPECT_FALSE(naturalLess("gpu10", "gpu2"));
  EXPECT_TRUE(naturalLess("a/eth0", "a/eth1"));
  EXPECT_TRUE(naturalLess("a", "a/x"));
  EXPECT_FALSE(naturalLess("x", "x"));
  EXPECT_EQ(networkIdOf("10.1.0.7/24"), "net:10.1.0.0/24");
  EXPECT_EQ(networkIdOf("192.168.5.130/25"), "net:192.168.5.128/25");
  EXPECT_EQ(networkIdOf("fd00::5/64"), "net:fd00::/64");
  EXPECT_EQ(networkIdOf("10.1.200.77/17"), "net:10.1.128.0/17");
  EXPECT_EQ(networkIdOf("2001:db8:1:2:3::9/48"), "net:2001:db8:1::/48");
  EXPECT_THROW(networkIdOf("nonsense/8"), InvalidArgument);
  EXPECT_EQ(networkIdOf("10.9.8.7/32"), "net:10.9.8.7/32");
  EXPECT_THROW(networkIdOf("10.0.0.1/33"), InvalidArgument);
  EXPECT_THROW(networkIdOf("10.0.0/24"), InvalidArgument);
  EXPECT_THROW(networkIdOf("10.0.0.1/2x"), InvalidArgument);
}

TEST(LinkProbeSchedule, EveryPairOnceAndNoHostTwiceInARound) {
  for (int hosts = 1; hosts <= 9; ++hosts) {
    const auto rounds = launcher::probeSchedule(hosts);
    std::set<std::pair<int, int>> seen;
    for (const auto& round : rounds) {
      std::set<int> busy;
      for (const auto& [a, b] : round) {
        EXPECT_LT(a, b);
        EXPECT_TRUE(busy.insert(a).second) << hosts;
        EXPECT_TRUE(busy.insert(b).second) << hosts;
        EXPECT_TRUE(seen.insert({a, b}).second) << hosts;
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(hosts * (hosts - 1) / 2)) << hosts;
    if (hosts > 1) {
      EXPECT_EQ(rounds.size(), static_cast<size_t>(hosts % 2 ? hosts : hosts - 1));
    }
  }
}

}  // namespace
}  // namespace railshard::topology
