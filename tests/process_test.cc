// Process-level tests: real processes started by railshard-launch, mpirun, or by hand with
// the environment of Slurm/torchrun, talking over loopback TCP.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kPerf = RAILSHARD_ALLREDUCE_PERF_BIN;
const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

// Every data row of allreduce_perf's table (with or without the efficiency column): both
// #wrong columns must be 0; returns the rows.
int checkPerfTable(const std::string& out) {
  std::istringstream lines(out);
  std::string line;
  int rows = 0;
  const std::regex row(
      R"(^(\[0\] )?\s+(\d+)\s+(\d+)\s+float\s+sum\s+-1\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)(\s+\S+)?\s*$)");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_match(line, m, row)) {
      ++rows;
      EXPECT_EQ(m[7].str(), "0") << line;
      EXPECT_EQ(m[11].str(), "0") << line;
    }
  }
  EXPECT_NE(out.find("# Out of bounds values : 0 OK"), std::string::npos) << out;
  EXPECT_NE(out.find("# Avg bus bandwidth"), std::string::npos) << out;
  return rows;
}

TEST(Launch, AllreducePerfUnderRailshardLaunchHasNoWrongValues) {
  auto r = test::runProcess(
      {kLaunch, "-n", "4", kPerf, "-b", "8", "-e", "4M", "-f", "8", "-n", "3", "-w", "1"}, {},
      std::chrono::seconds(120));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(checkPerfTable(r.out), 7);  // 8 B .. 2 MiB in steps of 8x
}

TEST(Launch, OddWorldSizeAndOtherDtypesValidate) {
  for (const char* dtype : {"half", "bfloat16", "int32", "double", "uint8"}) {
    auto r = test::runProcess({kLaunch, "-n", "3", kPerf, "-b", "1K", "-e", "1M", "-f", "32", "-n",
                               "2", "-w", "0", "-d", dtype, "-o", "max"},
                              {}, std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 0) << dtype << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
  }
}

#ifdef RAILSHARD_HAVE_MPI
TEST(Mpirun, AllreducePerfUnderMpirunHasNoWrongValues) {
  auto r = test::runProcess(
      {RAILSHARD_MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4",
       kPerf, "-b", "8", "-e", "4M", "-f", "8", "-n", "3", "-w", "1"},
      {}, std::chrono::seconds(120));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(checkPerfTable(r.out), 7);
}
#endif

TEST(Launch, RankThatDiesIsNamedAndSurvivorsGetPeerLostError) {
  const auto start = std::chrono::steady_clock::now();
  auto r = test::runProcess({kLaunch, "-n", "4", "--grace", "40", kCheck, "--iterations", "1000000",
                             "--die-rank", "2", "--die-after", "5", "--count", "1000"},
                            {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(90));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("rank 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("status 3"), std::string::npos) << r.err;
  // Stopped at once, not after the 60 s timeout or the 40 s grace period (the slack covers
  // starting four ranks on a loaded 2-core CI machine).
  EXPECT_LT(seconds, 20.0) << r.err;
}

// Ranks started by hand (or by a foreign launcher) with only environment variables.
test::ProcessResult runWorld(int size,
                             const std::function<std::map<std::string, std::string>(int)>& env_of) {
  std::vector<test::ProcessResult> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      results[static_cast<size_t>(rank)] =
          test::runProcess({kCheck, "--iterations", "5"}, env_of(rank), std::chrono::seconds(60));
    });
  }
  for (auto& t : threads) t.join();
  test::ProcessResult merged;
  merged.exit_code = 0;
  for (auto& res : results) {
    merged.out += res.out;
    merged.err += res.err;
    if (res.exit_code != 0) merged.exit_code = res.exit_code;
  }
  return merged;
}

TEST(Bootstrap, RanksStartedByHandWithRailshardVariables) {
  const std::string addr = "127.0.0.1:" + std::to_string(test::freePort());
  auto r = runWorld(3, [&](int rank) {
    return std::map<std::string, std::string>{{"RAILSHARD_RANK", std::to_string(rank)},
                                              {"RAILSHARD_WORLD_SIZE", "3"},
                                              {"RAILSHARD_STORE_ADDR", addr},
                                              {"RAILSHARD_TOKEN", "hand-made-token"}};
  });
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " of 3 ok"), std::string::npos) << r.out;
  }
}

// Without a launcher to stop them, every survivor must itself raise PeerLostError naming the
// dead rank, quickly (RAILSHARD_TIMEOUT is 60 s here, so only loss detection can explain it).
class PeerLoss : public ::testing::TestWithParam<std::string> {};

// The microsecond stamp collective_check prints as "... <what> ... at <N> us", or 0.
long long stampAfter(const std::string& text, const std::string& what) {
  const size_t line = text.find(what);
  if (line == std::string::npos) return 0;
  const size_t us = text.find(" us", line);
  if (us == std::string::npos) return 0;
  const size_t at = text.rfind(" at ", us);
  if (at == std::string::npos || at < line) return 0;
  return std::atoll(text.c_str() + at + 4);
}

TEST_P(PeerLoss, EverySurvivorRaisesPeerLostErrorNamingTheDeadRank) {
  const std::string addr = "127.0.0.1:" + std::to_string(test::freePort());
  const int size = 4;
  std::vector<test::ProcessResult> results(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      results[static_cast<size_t>(rank)] =
          test::runProcess({kCheck, "--iterations", "100000", "--die-rank", "1", "--die-after",
                            "10", "--count", "1000"},
                           {{"RAILSHARD_RANK", std::to_string(rank)},
                            {"RAILSHARD_WORLD_SIZE", std::to_string(size)},
                            {"RAILSHARD_STORE_ADDR", addr},
                            {"RAILSHARD_TIMEOUT", "60"},
                            {"RAILSHARD_TRANSPORT", GetParam()}},
                           std::chrono::seconds(60));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[1].exit_code, 3);
  // Detection latency from the programs' own wall-clock stamps (one host, one clock), not the
  // test's wall time: on a loaded CI machine starting four processes alone can take seconds.
  const long long died_at = stampAfter(results[1].err, "failing on purpose");
  ASSERT_GT(died_at, 0) << results[1].err;
  for (int rank : {0, 2, 3}) {
    const auto& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("PeerLostError"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
    const long long caught_at = stampAfter(r.err, "caught PeerLostError");
    ASSERT_GT(caught_at, 0) << r.err;
    // Well under both the 60 s timeout and the 10 s heartbeat: the closed socket (TCP) or the
    // dead pid (shm) must explain it.
    EXPECT_LT(static_cast<double>(caught_at - died_at) / 1e6, 5.0) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerLoss, ::testing::Values("tcp", "shm"));

TEST(Bootstrap, TorchrunEnvironment) {
  // railshard's store listens on MASTER_PORT + 1, so that is the port that must be free.
  const int port = test::freePort() - 1;
  auto r = runWorld(2, [&](int rank) {
    return std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                              {"WORLD_SIZE", "2"},
                                              {"LOCAL_RANK", std::to_string(rank)},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(port)}};
  });
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 1 of 2 ok"), std::string::npos) << r.out;
}

TEST(Bootstrap, SlurmEnvironment) {
  const std::string addr = "127.0.0.1:" + std::to_string(test::freePort());
  auto r = runWorld(2, [&](int rank) {
    return std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(rank)},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_LOCALID", std::to_string(rank)},
                                              {"RAILSHARD_STORE_ADDR", addr}};
  });
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 0 of 2 ok"), std::string::npos) << r.out;
}

TEST(Bootstrap, ContradictoryEnvironmentIsAConfigError) {
  auto r = test::runProcess({kCheck}, {{"RAILSHARD_RANK", "1"},
                                       {"RAILSHARD_WORLD_SIZE", "4"},
                                       {"RAILSHARD_STORE_ADDR", "127.0.0.1:1"},
                                       {"RANK", "2"},
                                       {"WORLD_SIZE", "4"}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("ConfigError: contradictory environment"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("RANK=2"), std::string::npos) << r.err;
}

TEST(Bootstrap, StoreAddressMissingIsAConfigError) {
  auto r = test::runProcess({kCheck}, {{"RAILSHARD_RANK", "0"}, {"RAILSHARD_WORLD_SIZE", "2"}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("RAILSHARD_STORE_ADDR"), std::string::npos) << r.err;
}

TEST(Bootstrap, NoLauncherMeansOneRank) {
  auto r = test::runProcess({kCheck, "--iterations", "2"}, {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 0 of 1 ok"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace railshard
