// railshard-topo and railshard-launch --dump-topology as users run them: real processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/topology/topology.h"
#include "test_util.h"

namespace {

using railshard::test::runProcess;
using railshard::topology::Topology;
using ::testing::HasSubstr;

const std::string kTopo = RAILSHARD_TOPO_BIN;
const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";
const std::string kFixtures = std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/";
const std::map<std::string, std::string> kNoToken = {{"RAILSHARD_TOKEN", ""}};

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(RailshardTopo, PrintsThisHostAsJsonDotAndSummary) {
  const auto json = runProcess({kTopo, "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const Topology graph = Topology::fromJson(json.out, "railshard-topo --json");
  ASSERT_EQ(graph.hosts().size(), 1u);
  EXPECT_EQ(graph.worldSize(), 0);
  EXPECT_EQ(graph.toJson(), json.out);  // what it prints is canonical
  const auto dot = runProcess({kTopo, "--dot"});
  ASSERT_EQ(dot.exit_code, 0) << dot.err;
  EXPECT_THAT(dot.out, HasSubstr("graph railshard {"));
  EXPECT_THAT(dot.out, HasSubstr("\"" + graph.hosts()[0] + "/numa0\""));
  const auto summary = runProcess({kTopo});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_THAT(summary.out, HasSubstr("topology " + graph.hash() + ": 1 host(s)"));
  EXPECT_THAT(summary.out, HasSubstr("lo: loopback"));
  EXPECT_THAT(summary.out, HasSubstr("[not used: loopback]"));
}

TEST(RailshardTopo, RendersPngThroughGraphviz) {
  if (runProcess({"/bin/sh", "-c", "command -v dot"}).exit_code != 0) {
    GTEST_SKIP() << "Graphviz 'dot' is not installed (apt-get install graphviz)";
  }
  const std::string out = railshard::test::tempPath("topo.png");
  ::unlink(out.c_str());
  const auto result = runProcess({kTopo, "--file", kFixtures + "dgx_host.json", "--png", out});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string png = readFile(out);
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(RailshardTopo, FileQueriesAndErrors) {
  const auto rails =
      runProcess({kTopo, "--file", kFixtures + "two_rail_pair.json", "--rails", "alpha", "beta"});
  ASSERT_EQ(rails.exit_code, 0) << rails.err;
  EXPECT_THAT(rails.out, HasSubstr("rails alpha <-> beta: 2"));
  EXPECT_THAT(rails.out, HasSubstr("eth0 10.1.0.1 <-> eth0 10.1.0.2  ethernet  nominal 25 Gb/s"));
  EXPECT_THAT(rails.out, HasSubstr("measured 9.410 Gb/s, 12.5 us"));
  const auto path = runProcess({kTopo, "--file", kFixtures + "dgx_host.json", "--path", "0", "3"});
  ASSERT_EQ(path.exit_code, 0) << path.err;
  EXPECT_THAT(path.out, HasSubstr("path rank 0 -> rank 3: nvlink, 400 Gb/s"));

  const std::string bad = railshard::test::tempPath("bad_topo.json");
  std::ofstream(bad) << "{\"format\": \"railshard-topology\", \"version\": 1, \"vertices\": "
                        "[{\"id\": \"h\", \"kind\": \"hots\", \"host\": \"h\"}]}";
  const auto broken = runProcess({kTopo, "--file", bad});
  EXPECT_EQ(broken.exit_code, 1);
  EXPECT_THAT(broken.err, HasSubstr("vertices[0]: field 'kind' = 'hots' is not one of"));
  const auto usage = runProcess({kTopo, "--frobnicate"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("unknown argument '--frobnicate'"));
  const auto unknown_host =
      runProcess({kTopo, "--file", kFixtures + "two_rail_pair.json", "--rails", "alpha", "gamma"});
  EXPECT_EQ(unknown_host.exit_code, 1);
  EXPECT_THAT(unknown_host.err, HasSubstr("'gamma' is not a host"));
}

TEST(RailshardTopo, UnderTheLauncherRankZeroPrintsTheJobsGraph) {
  const auto result = runProcess({kLaunch, "-n", "3", "--no-prefix", kTopo, "--json"}, kNoToken);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const Topology graph = Topology::fromJson(result.out, "launched railshard-topo");
  EXPECT_EQ(graph.worldSize(), 3);
  EXPECT_EQ(graph.hosts().size(), 1u);
}

TEST(RailshardTopo, UnderMpirunRankZeroPrintsTheJobsGraph) {
#ifndef RAILSHARD_HAVE_MPI
  GTEST_SKIP() << "built without MPI";
#else
  const auto result = runProcess({RAILSHARD_MPIRUN, "--allow-run-as-root", "--oversubscribe",
                                  "--bind-to", "none", "-np", "3", kTopo, "--json"},
                                 kNoToken);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const Topology graph = Topology::fromJson(result.out, "mpirun railshard-topo");
  EXPECT_EQ(graph.worldSize(), 3);
  EXPECT_EQ(graph.hosts().size(), 1u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(graph.rank(r).local_rank, r);
#endif
}

TEST(RailshardLaunch, DumpTopologyWritesTheGraphTheRanksAgreedOn) {
  const std::string out = railshard::test::tempPath("job_topology.json");
  const auto result = runProcess(
      {kLaunch, "-n", "2", "--dump-topology", out, kCheck, "--iterations", "3"}, kNoToken);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const Topology graph = Topology::fromJson(readFile(out), out);
  EXPECT_EQ(graph.worldSize(), 2);
  // Both ranks report the same hash as the file's, and shared memory (one host).
  EXPECT_THAT(result.out, HasSubstr("rank 0 of 2 ok after 3 allreduces over shm, topology " +
                                    graph.hash() + " with 1 host(s)"));
  EXPECT_THAT(result.out,
              HasSubstr("rank 1 of 2 ok after 3 allreduces over shm, topology " + graph.hash()));
  // A program that never calls init() writes nothing, and the launcher says so.
  const auto silent = runProcess({kLaunch, "-n", "1", "--dump-topology", out, "true"}, kNoToken);
  EXPECT_EQ(silent.exit_code, 0);
  EXPECT_THAT(silent.err, HasSubstr("--dump-topology: no rank wrote"));
}

TEST(RailshardLaunch, TopologyFileSaysTwoHostsSoRanksShareMemoryPerHostOnly) {
  // The fixture's alpha/beta placement: 4 ranks, two per "host". The ranks all run here, but
  // the graph is the authority on what counts as a host: one segment per host (not one for
  // the job), TCP between the hosts.
  const auto result = runProcess(
      {kLaunch, "-n", "4", kCheck, "--iterations", "2"},
      {{"RAILSHARD_TOKEN", ""}, {"RAILSHARD_TOPO_FILE", kFixtures + "two_rail_pair.json"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("allreduces over shm per host and tcp, topology "));
  EXPECT_THAT(result.out, HasSubstr("with 2 host(s)"));
}

}  // namespace
