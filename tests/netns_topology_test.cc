// Two "hosts" on this machine: network namespaces joined by two rails shaped to 400 and
// 100 Mbit/s (benchmarks/testbed/testbed.sh), each rank in its own network and UTS namespace.
// Discovery must find both rails, the probe must measure what the shaping allows, and the
// ranks must talk over TCP between the "hosts". Needs root and iproute2; skips otherwise.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <sstream>

#include "core/topology/topology.h"
#include "netns_testbed.h"
#include "test_util.h"

namespace {

using railshard::test::NetnsTestbed;
using railshard::test::ProcessResult;
using railshard::test::runProcess;
using railshard::topology::Topology;
using ::testing::HasSubstr;

const std::string kTopo = RAILSHARD_TOPO_BIN;
const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

TEST_F(NetnsTestbed, DiscoveryFindsBothRailsAndTheProbeMeasuresTheirShaping) {
  const std::string dump = railshard::test::tempPath("netns_topology.json");
  ::unlink(dump.c_str());
  const std::map<std::string, std::string> env = {
      {"RAILSHARD_PROBE", "1"}, {"RAILSHARD_PROBE_MS", "400"}, {"RAILSHARD_TOPO_DUMP", dump}};
  auto rank0 = startRank(0, {kTopo}, env);
  auto rank1 = startRank(1, {kTopo}, env);
  const ProcessResult r0 = rank0.get();
  const ProcessResult r1 = rank1.get();
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  std::ifstream in(dump);
  std::stringstream text;
  text << in.rdbuf();
  const Topology graph = Topology::fromJson(text.str(), dump);
  const std::string a = name_ + "-h0";
  const std::string b = name_ + "-h1";
  ASSERT_EQ(graph.hosts(), (std::vector<std::string>{a, b}));
  EXPECT_EQ(graph.rank(0).host, a);
  EXPECT_EQ(graph.rank(1).host, b);
  const auto rails = graph.rails(a, b);
  ASSERT_EQ(rails.size(), 2u) << r0.out;
  // htb delivers ~95.5% of the shaped rate as TCP payload (FIELD-NOTES); allow +-30%.
  EXPECT_EQ(rails[0].nic_a, a + "/rail0");
  EXPECT_EQ(rails[0].address_a, "10.200.0.1");
  EXPECT_EQ(rails[0].address_b, "10.200.0.2");
  EXPECT_NEAR(rails[0].measured_gbps, 0.4 * 0.955, 0.4 * 0.3) << r0.out;
  EXPECT_EQ(rails[1].nic_b, b + "/rail1");
  EXPECT_EQ(rails[1].address_b, "10.201.0.2");
  EXPECT_NEAR(rails[1].measured_gbps, 0.1 * 0.955, 0.1 * 0.3) << r0.out;
  EXPECT_GT(rails[0].latency_us, 0);
  EXPECT_LT(rails[0].latency_us, 20000);
  // The loopback interfaces are there but never rails.
  EXPECT_EQ(graph.vertex(a + "/lo").excluded, "loopback");
  EXPECT_EQ(graph.path(0, 1).transport, railshard::topology::PathTransport::kTcp);
}

TEST_F(NetnsTestbed, RanksInTwoNamespacesRunCollectivesOverTcp) {
  auto rank0 = startRank(0, {kCheck, "--iterations", "5", "--count", "100000"}, {});
  auto rank1 = startRank(1, {kCheck, "--iterations", "5", "--count", "100000"}, {});
  const ProcessResult r0 = rank0.get();
  const ProcessResult r1 = rank1.get();
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_THAT(r0.out, HasSubstr("rank 0 of 2 ok after 5 allreduces over tcp"));
  EXPECT_THAT(r0.out, HasSubstr("with 2 host(s)"));
  EXPECT_THAT(r1.out, HasSubstr("rank 1 of 2 ok after 5 allreduces over tcp"));
}

}  // namespace
