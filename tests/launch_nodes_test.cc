// railshard-launch over several hosts (--nnodes, --node-rank, --master): one launcher per
// "node", here two on this machine, form one job — each rank's environment places it
// (RAILSHARD_RANK / WORLD_SIZE / LOCAL_RANK and torch's RANK, LOCAL_RANK, MASTER_ADDR/PORT),
// verified all-reduces of collective_check pass on every rank of both nodes, a rank failing
// on one node fails the other node's ranks and both launchers, and bad combinations are
// usage errors naming the problem. Across real (emulated) hosts and RDMA: the Soft-RoCE guest
// (docs/rdma.md, "railshard-launch across the guest's hosts").
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace {

using railshard::test::ProcessResult;
using railshard::test::runProcess;
using namespace std::chrono_literals;

const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

// Both nodes' launchers at once, each with `program` (node K gets --node-rank K); node 1's
// environment is `env` with `node1_env` over it.
std::vector<ProcessResult> runTwoNodes(int ranks_per_node, const std::vector<std::string>& program,
                                       std::map<std::string, std::string> env = {},
                                       const std::map<std::string, std::string>& node1_env = {}) {
  const std::string master = "127.0.0.1:" + std::to_string(railshard::test::freePort());
  env["RAILSHARD_TOKEN"] = "launch-nodes-test-" + std::to_string(::getpid());
  std::vector<ProcessResult> results(2);
  auto node = [&](int k) {
    std::vector<std::string> argv = {kLaunch,           "-n",       std::to_string(ranks_per_node),
                                     "--nnodes",        "2",        "--node-rank",
                                     std::to_string(k), "--master", master};
    argv.insert(argv.end(), program.begin(), program.end());
    std::map<std::string, std::string> node_env = env;
    if (k == 1) {
      for (const auto& [name, value] : node1_env) node_env[name] = value;
    }
    results[static_cast<size_t>(k)] = runProcess(argv, node_env, 90s);
  };
  std::thread other(node, 1);
  node(0);
  other.join();
  return results;
}

TEST(LaunchNodes, EveryRankIsPlacedInTheWholeJob) {
  const auto results = runTwoNodes(
      2, {"/bin/sh", "-c",
          "echo place $RAILSHARD_RANK/$RAILSHARD_WORLD_SIZE local $RAILSHARD_LOCAL_RANK torch "
          "$RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $MASTER_ADDR store "
          "$RAILSHARD_STORE_ADDR external ${RAILSHARD_STORE_EXTERNAL:-0}"});
  for (int k = 0; k < 2; ++k) {
    const auto& result = results[static_cast<size_t>(k)];
    ASSERT_EQ(result.exit_code, 0) << "node " << k << ": " << result.out << result.err;
    for (int local = 0; local < 2; ++local) {
      const int rank = 2 * k + local;
      // Appended, not "[" + ...: GCC 12 warns falsely about that (-Wrestrict).
      std::string line = "[";
      line += std::to_string(rank) + "] place " + std::to_string(rank) + "/4 local " +
              std::to_string(local) + " torch " + std::to_string(rank) + "/4 " +
              std::to_string(local) + "/2 127.0.0.1 store 127.0.0.1:";
      EXPECT_NE(result.out.find(line), std::string::npos) << "node " << k << ":\n" << result.out;
    }
    EXPECT_EQ(result.out.find("external 0"), std::string::npos)
        << "a rank was not told the launcher hosts the store:\n"
        << result.out;
  }
}

TEST(LaunchNodes, AllreducesAreExactOnEveryRankOfBothNodes) {
  const auto results = runTwoNodes(2, {kCheck, "--iterations", "20", "--count", "50000"},
                                   {{"RAILSHARD_TRANSPORT", "tcp"}});
  for (int k = 0; k < 2; ++k) {
    const auto& result = results[static_cast<size_t>(k)];
    ASSERT_EQ(result.exit_code, 0) << "node " << k << ": " << result.out << result.err;
    for (int local = 0; local < 2; ++local) {
      const int rank = 2 * k + local;
      EXPECT_NE(result.out.find("rank " + std::to_string(rank) + " of 4 ok after 20 allreduces"),
                std::string::npos)
          << "node " << k << ":\n"
          << result.out;
    }
  }
}

TEST(LaunchNodes, ARankFailingOnOneNodeFailsBothLaunchers) {
  const auto start = std::chrono::steady_clock::now();
  const auto results = runTwoNodes(
      2, {kCheck, "--iterations", "1000", "--count", "1000", "--die-rank", "3", "--die-after", "5"},
      {{"RAILSHARD_TRANSPORT", "tcp"}, {"RAILSHARD_TIMEOUT", "20"}});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  // Node 1 reports its own rank 3 first; node 0's ranks lost a peer.
  EXPECT_EQ(results[1].exit_code, 3) << results[1].err;
  EXPECT_NE(results[1].err.find("rank 3 on host"), std::string::npos) << results[1].err;
  EXPECT_NE(results[1].err.find("failing on purpose"), std::string::npos) << results[1].err;
  EXPECT_NE(results[0].exit_code, 0) << results[0].out << results[0].err;
  EXPECT_NE(results[0].err.find("PeerLostError"), std::string::npos) << results[0].err;
}

// Node 1 started with another token: it is refused at once, and node 0 -- whose ranks would
// otherwise wait out their timeout for node 1's, and its launcher the nodes' wait after that --
// stops its ranks and exits at once, naming the token as the cause.
TEST(LaunchNodes, ANodeWithAnotherTokenEndsBothLaunchersAtOnceNamingTheToken) {
  const auto start = std::chrono::steady_clock::now();
  const auto results = runTwoNodes(2, {kCheck, "--iterations", "5", "--count", "1000"},
                                   {{"RAILSHARD_TRANSPORT", "tcp"}, {"RAILSHARD_TIMEOUT", "60"}},
                                   {{"RAILSHARD_TOKEN", "another-token"}});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0) << "a launcher waited for the node with the other token";
  EXPECT_NE(results[1].exit_code, 0) << results[1].out << results[1].err;
  EXPECT_EQ(results[0].exit_code, 1) << results[0].out << results[0].err;
  EXPECT_NE(results[0].err.find("presented another job token than this node's"), std::string::npos)
      << results[0].err;
  EXPECT_NE(results[0].err.find("same RAILSHARD_TOKEN"), std::string::npos) << results[0].err;
  EXPECT_EQ(results[0].err.find("stopped waiting for the other nodes"), std::string::npos)
      << results[0].err;
}

// Node 0's launcher keeps the store for the other nodes after its own ranks ended (here node 1
// never comes), at most kNodesDoneWait (60 s); a SIGTERM ends that wait at once.
TEST(LaunchNodes, NodeZeroWaitingForTheOthersStopsOnSigterm) {
  const std::string master = "127.0.0.1:" + std::to_string(railshard::test::freePort());
  const auto start = std::chrono::steady_clock::now();
  // The rank ends at once; a child it leaves behind tells the launcher to stop a second later.
  const auto result = runProcess(
      {kLaunch, "-n", "1", "--nnodes", "2", "--node-rank", "0", "--master", master, "/bin/sh", "-c",
       "launcher=$PPID; (sleep 1; kill -TERM $launcher) >/dev/null 2>&1 & exit 0"},
      {{"RAILSHARD_TOKEN", "launch-nodes-sigterm"}}, 90s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_LT(seconds, 20.0) << "node 0 waited out the other node after SIGTERM: " << result.err;
  EXPECT_GT(seconds, 0.9) << "node 0 did not wait for the other node at all";
}

TEST(LaunchNodes, BadCombinationsAreUsageErrorsNamingTheProblem) {
  const auto usage = [](const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& env) {
    std::vector<std::string> argv = {kLaunch};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"/bin/true"});
    return runProcess(argv, env, 20s);
  };
  const std::map<std::string, std::string> token = {{"RAILSHARD_TOKEN", "t"}};
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"-n", "2", "--nnodes", "2", "--node-rank", "0"}, token, "--nnodes > 1 needs --master"},
      {{"-n", "2", "--nnodes", "2", "--node-rank", "2", "--master", "127.0.0.1:1"},
       token,
       "--node-rank must be below --nnodes (2), got 2"},
      {{"-n", "2", "--master", "127.0.0.1:1"}, token, "--master and --node-rank need --nnodes > 1"},
      {{"-n", "2", "--nnodes", "2", "--master", "127.0.0.1:1", "--elastic"},
       token,
       "--nnodes > 1 runs without --elastic"},
      {{"-n", "2", "--nnodes", "2", "--master", "127.0.0.1:1"},
       {{"RAILSHARD_TOKEN", ""}},
       "set RAILSHARD_TOKEN to the same value on every node"},
  };
  for (const auto& c : cases) {
    const auto result = usage(c.args, c.env);
    EXPECT_EQ(result.exit_code, 2) << c.says << ": " << result.err;
    EXPECT_NE(result.err.find(c.says), std::string::npos) << result.err;
  }
}

}  // namespace
