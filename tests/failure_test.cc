// Failure detection and elastic continuation with real processes and real signals: ranks of
// tests/programs/collective_check started by hand (so that every survivor's own error is seen)
// or by railshard-launch --elastic; SIGKILL, SIGSTOP/SIGCONT, a rank that never arrives.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

// Starts `size` ranks of collective_check with `args` (rank 0 hosts the store), plus `env`.
std::vector<test::ProcessResult> runRanksByHand(int size, const std::vector<std::string>& args,
                                                const std::map<std::string, std::string>& env,
                                                std::chrono::seconds limit) {
  return test::runRanksByHand(kCheck, size, args, env, limit, "failure-test");
}

// The "failed after waiting X s" / "timed out after X s" figure of an error message.
double secondsWaited(const std::string& text) {
  std::smatch m;
  static const std::regex waited(R"((?:failed after waiting|timed out after) ([0-9.]+) s)");
  if (!std::regex_search(text, m, waited)) return -1;
  return std::stod(m[1].str());
}

class Killed : public ::testing::TestWithParam<std::string> {
 protected:
  // The parameter's transport: "tcp_lazy" is TCP with every pair connected on first use (a
  // rank not connected to the killed one learns of it from those that were).
  static std::map<std::string, std::string> env() {
    std::map<std::string, std::string> env = {{"RAILSHARD_TIMEOUT", "60"}};
    if (GetParam() == "tcp_lazy") {
      env["RAILSHARD_TRANSPORT"] = "tcp";
      env["RAILSHARD_TCP_CONNECT"] = "lazy";
    } else {
      env["RAILSHARD_TRANSPORT"] = GetParam();
    }
    return env;
  }
};

// SIGKILL one rank of four in an all-reduce loop: each of the three others raises
// PeerLostError naming it (rank, host, the collective and its number, the time waited) within
// 2 s, with RAILSHARD_TIMEOUT at 60 s so only loss detection can explain it.
TEST_P(Killed, EverySurvivorNamesTheKilledRankWithinTwoSeconds) {
  auto results = runRanksByHand(4,
                                {"--iterations", "100000", "--die-rank", "2", "--die-after", "20",
                                 "--die-how", "kill", "--count", "1000"},
                                env(), std::chrono::seconds(60));
  EXPECT_EQ(results[2].signal, SIGKILL) << results[2].err;
  for (int rank : {0, 1, 3}) {
    const auto& r = results[static_cast<size_t>(rank)];
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("PeerLostError: rank " + std::to_string(rank) + ": allreduce #"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("lost rank 2 (host "), std::string::npos) << r.err;
    const double waited = secondsWaited(r.err);
    EXPECT_GE(waited, 0) << r.err;
    EXPECT_LT(waited, 2.0) << r.err;
  }
}

// The same with survivors that shrink(): they form a communicator of three, renumbered in
// order, and finish every iteration with verified results.
TEST_P(Killed, SurvivorsShrinkAndFinishWithVerifiedResults) {
  auto results = runRanksByHand(4,
                                {"--iterations", "60", "--die-rank", "2", "--die-after", "20",
                                 "--die-how", "kill", "--count", "1000", "--elastic", "1"},
                                env(), std::chrono::seconds(60));
  EXPECT_EQ(results[2].signal, SIGKILL);
  const int new_rank[] = {0, 1, -1, 2};
  for (int rank : {0, 1, 3}) {
    const auto& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("rank " + std::to_string(new_rank[rank]) + " of 3 ok after 60 allreduces"),
              std::string::npos)
        << r.out << r.err;
    EXPECT_NE(r.out.find("generation 1"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("launch rank " + std::to_string(rank) + " is rank " +
                         std::to_string(new_rank[rank]) + " of 3 in generation 1"),
              std::string::npos)
        << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Killed, ::testing::Values("tcp", "shm", "tcp_lazy"));

// Two hosts x two ranks by the cluster graph (the two-rail fixture's alpha and beta; the
// processes really share this machine, the graph makes them hosts), two-level all-reduces:
// SIGKILL a rank whose host peer waits for it in shared memory (1), or one on the other host
// (2). Every survivor, on either host, raises PeerLostError naming it within 2 s. A run
// without a kill first shows the layout is the two-level one. Large messages (two_level), and
// small ones with only host leaders across (two_level_leader: rank 1 dies while its leader
// waits for it in the host's sum, rank 2 while rank 3 sleeps in its host's broadcast and
// rank 0 waits for it across).
class KilledTwoLevel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(KilledTwoLevel, EverySurvivorOnEitherHostNamesTheKilledRankWithinTwoSeconds) {
  const std::string algorithm = std::get<0>(GetParam());
  const std::string count = std::to_string(std::get<1>(GetParam()));
  const std::map<std::string, std::string> env = {
      {"RAILSHARD_TIMEOUT", "60"},
      {"RAILSHARD_ALGO", algorithm},
      {"RAILSHARD_TOPO_FILE",
       std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/two_rail_pair.json"}};
  const auto healthy =
      runRanksByHand(4, {"--iterations", "3", "--count", count}, env, std::chrono::seconds(60));
  for (const auto& r : healthy) {
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("over shm per host and tcp, topology"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("with 2 host(s)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("last algorithm " + algorithm + "\n"), std::string::npos) << r.out;
  }
  for (const int killed : {1, 2}) {
    auto results = runRanksByHand(4,
                                  {"--iterations", "100000", "--die-rank", std::to_string(killed),
                                   "--die-after", "20", "--die-how", "kill", "--count", count},
                                  env, std::chrono::seconds(60));
    EXPECT_EQ(results[static_cast<size_t>(killed)].signal, SIGKILL)
        << results[static_cast<size_t>(killed)].err;
    for (int rank = 0; rank < 4; ++rank) {
      if (rank == killed) continue;
      const auto& r = results[static_cast<size_t>(rank)];
      ASSERT_FALSE(r.timed_out) << "killed " << killed << ": " << r.err;
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find("PeerLostError: rank " + std::to_string(rank) + ": allreduce #"),
                std::string::npos)
          << "killed " << killed << ", rank " << rank << ": " << r.err;
      EXPECT_NE(r.err.find("rank " + std::to_string(killed)), std::string::npos) << r.err;
      const double waited = secondsWaited(r.err);
      EXPECT_GE(waited, 0) << r.err;
      EXPECT_LT(waited, 2.0) << "killed " << killed << ", rank " << rank << ": " << r.err;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, KilledTwoLevel,
                         ::testing::Values(std::make_tuple("two_level", 100000),
                                           std::make_tuple("two_level_leader", 10)),
                         [](const auto& info) { return std::get<0>(info.param); });

// Under railshard-launch --elastic the launcher hosts the store, so even rank 0 (which hosts
// it otherwise) may die: the launcher marks it lost, the three others shrink and finish.
TEST(Elastic, LauncherKeepsTheJobGoingWhenRankZeroIsKilled) {
  auto r = test::runProcess({kLaunch, "-n", "4", "--elastic", "--max-failures", "1", kCheck,
                             "--iterations", "60", "--die-rank", "0", "--die-after", "20",
                             "--die-how", "kill", "--count", "1000", "--elastic", "1"},
                            {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(90));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 0 on host"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by SIGKILL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("continuing with 3 ranks"), std::string::npos) << r.err;
  for (int launch_rank = 1; launch_rank < 4; ++launch_rank) {
    EXPECT_NE(r.out.find("[" + std::to_string(launch_rank) + "] rank " +
                         std::to_string(launch_rank - 1) + " of 3 ok after 60 allreduces"),
              std::string::npos)
        << r.out;
  }
}

// railshard-launch --max-restarts 1: a rank SIGKILLed at iteration 20 (rank 2, or rank 0:
// the launcher hosts the store, so no rank is a single point of failure) is started again;
// the three others shrink, the restarted process joins through init() (RAILSHARD_JOIN=1) as
// launch rank 4, takes the iteration from rank 0, and all four finish every iteration with
// verified sums in generation 2.
TEST(Elastic, LauncherRestartsAKilledRankAndItRejoins) {
  for (const int killed : {2, 0}) {
    auto r = test::runProcess({kLaunch,
                               "-n",
                               "4",
                               "--max-restarts",
                               "1",
                               kCheck,
                               "--iterations",
                               "150",
                               "--die-rank",
                               std::to_string(killed),
                               "--die-after",
                               "20",
                               "--die-how",
                               "kill",
                               "--count",
                               "1000",
                               "--elastic",
                               "1",
                               "--grow",
                               "1",
                               "--pace-ms",
                               "20"},
                              {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(90));
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.err.find("rank " + std::to_string(killed) + " on host"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("restarting rank " + std::to_string(killed) +
                         " to join the 3 ranks left (elastic, failure 1 of 1, restart 1 of 1)"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("[" + std::to_string(killed) +
                         "] launch rank 4 is rank 3 of 4 in generation 2 (joined at iteration"),
              std::string::npos)
        << r.err;
    for (int slot = 0; slot < 4; ++slot) {
      // Survivors renumbered in their order, the joiner last.
      const int rank = slot == killed ? 3 : slot - (slot > killed ? 1 : 0);
      EXPECT_NE(r.out.find("[" + std::to_string(slot) + "] rank " + std::to_string(rank) +
                           " of 4 ok after 150 allreduces"),
                std::string::npos)
          << "killed " << killed << ": " << r.out << r.err;
    }
    EXPECT_EQ(r.out.find("generation 1,"), std::string::npos) << r.out;  // all end in gen 2
  }
}

#ifdef RAILSHARD_HAVE_MPI
// No rank is a single point of failure under mpirun either: railshard-store hosts the store
// outside the ranks (RAILSHARD_STORE_EXTERNAL=1), so when rank 0 is SIGKILLed the three others
// shrink through it and go on; a process started by hand afterwards (RAILSHARD_JOIN=1) joins
// and all four finish every verified all-reduce in generation 2 (the script:
// tests/programs/mpirun_external_store.sh).
TEST(Elastic, UnderMpirunTheStandaloneStoreOutlivesRankZeroAndAHandStartedRankJoins) {
  const std::string dir = test::tempPath("mpirun-store");
  std::filesystem::create_directories(dir);
  auto r = test::runProcess(
      {"bash", std::string(RAILSHARD_SOURCE_DIR) + "/tests/programs/mpirun_external_store.sh",
       RAILSHARD_STORE_BIN, RAILSHARD_MPIRUN, kCheck, dir},
      {{"RAILSHARD_TOKEN", "mpirun-store-test"}, {"RAILSHARD_TIMEOUT", "30"}},
      std::chrono::seconds(100));
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.out.find("joiner exit 0, store exit 0"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.err.find("generation 1 formed: 3 of 4 ranks survive"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("launch rank 4 is rank 3 of 4 in generation 2 (joined at iteration"),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " of 4 ok after 150 allreduces"),
              std::string::npos)
        << r.out << r.err;
  }
}
#endif

// Two failures one after the other: generation 1 of three, then generation 2 of two.
TEST(Elastic, SurvivorsShrinkTwice) {
  // Rank 3 dies at iteration 10; rank 1 (rank 1 of generation 1 too) dies at iteration 30.
  const std::string addr = "127.0.0.1:" + std::to_string(test::freePort());
  std::vector<test::ProcessResult> results(4);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<std::string> argv = {kCheck, "--iterations", "50", "--count",
                                       "1000", "--elastic",    "1",  "--linger-seconds",
                                       "1"};
      if (rank == 3 || rank == 1) {
        argv.insert(argv.end(), {"--die-rank", std::to_string(rank), "--die-after",
                                 rank == 3 ? "10" : "30", "--die-how", "kill"});
      }
      results[static_cast<size_t>(rank)] =
          test::runProcess(argv,
                           {{"RAILSHARD_RANK", std::to_string(rank)},
                            {"RAILSHARD_WORLD_SIZE", "4"},
                            {"RAILSHARD_STORE_ADDR", addr},
                            {"RAILSHARD_TOKEN", "twice"},
                            {"RAILSHARD_TIMEOUT", "60"}},
                           std::chrono::seconds(60));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[3].signal, SIGKILL);
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].err;
  EXPECT_NE(results[0].out.find("rank 0 of 2 ok after 50 allreduces"), std::string::npos)
      << results[0].out << results[0].err;
  EXPECT_NE(results[0].out.find("generation 2"), std::string::npos) << results[0].out;
  EXPECT_EQ(results[2].exit_code, 0) << results[2].err;
  EXPECT_NE(results[2].out.find("rank 1 of 2 ok after 50 allreduces"), std::string::npos)
      << results[2].out << results[2].err;
}

class Stopped : public ::testing::TestWithParam<std::string> {};

// SIGSTOP one rank (its connections stay open; only the heartbeat can tell): the others fail
// within the heartbeat timeout + 1 s, naming it. SIGCONT 4 s later: the resumed rank learns
// it was written off and fails with an error, not with wrong results.
TEST_P(Stopped, OthersFailWithinHeartbeatTimeoutAndTheResumedRankFailsCleanly) {
  auto results = runRanksByHand(4,
                                {"--iterations", "100000", "--die-rank", "1", "--die-after", "20",
                                 "--die-how", "stop", "--stop-seconds", "4", "--count", "1000"},
                                {{"RAILSHARD_TIMEOUT", "60"},
                                 {"RAILSHARD_HEARTBEAT_TIMEOUT", "1.5"},
                                 {"RAILSHARD_TRANSPORT", GetParam()}},
                                std::chrono::seconds(60));
  for (int rank : {0, 2, 3}) {
    const auto& r = results[static_cast<size_t>(rank)];
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("PeerLostError"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("stopped answering"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
    const double waited = secondsWaited(r.err);
    EXPECT_GE(waited, 0) << r.err;
    EXPECT_LT(waited, 1.5 + 1.0) << r.err;
  }
  const auto& resumed = results[1];
  EXPECT_NE(resumed.err.find("continued after SIGSTOP"), std::string::npos) << resumed.err;
  EXPECT_EQ(resumed.exit_code, 1) << resumed.err;  // an error (2 would be a wrong result)
  EXPECT_NE(resumed.err.find("Error"), std::string::npos) << resumed.err;
}

// With --elastic the three shrink and finish; the resumed rank is told it is not a survivor.
TEST_P(Stopped, SurvivorsShrinkAndTheResumedRankIsToldItWasLeftOut) {
  auto results = runRanksByHand(
      4,
      {"--iterations", "60", "--die-rank", "1", "--die-after", "20", "--die-how", "stop",
       "--stop-seconds", "4", "--count", "1000", "--elastic", "1", "--linger-seconds", "6"},
      {{"RAILSHARD_TIMEOUT", "60"},
       {"RAILSHARD_HEARTBEAT_TIMEOUT", "1.5"},
       {"RAILSHARD_TRANSPORT", GetParam()}},
      std::chrono::seconds(60));
  for (int rank : {0, 2, 3}) {
    const auto& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(" of 3 ok after 60 allreduces"), std::string::npos) << r.out << r.err;
  }
  const auto& resumed = results[1];
  EXPECT_EQ(resumed.exit_code, 1) << resumed.err;
  EXPECT_NE(resumed.err.find("is not among the survivors of generation 1"), std::string::npos)
      << resumed.err;
}

INSTANTIATE_TEST_SUITE_P(Transports, Stopped, ::testing::Values("tcp", "shm"));

// A rank that is alive (heartbeats flow) but never arrives: the timeout says who is missing
// and who waited, from what every rank published to the store.
TEST(Timeout, SaysWhichRankNeverEnteredTheCollective) {
  auto results = runRanksByHand(4,
                                {"--iterations", "30", "--stall-rank", "3", "--stall-after", "12",
                                 "--stall-seconds", "8", "--count", "1000"},
                                {{"RAILSHARD_TIMEOUT", "2"}}, std::chrono::seconds(60));
  for (int rank : {0, 1, 2}) {
    const auto& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("TimeoutError"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("rank 3 never entered allreduce #12 (ranks 0,1,2 waiting"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("last entered allreduce #11"), std::string::npos) << r.err;
  }
}

// The per-call timeout overrides RAILSHARD_TIMEOUT (300 s by default here).
TEST(Timeout, PerCallTimeoutOverridesTheDefault) {
  const auto start = std::chrono::steady_clock::now();
  auto results = runRanksByHand(2,
                                {"--iterations", "10", "--stall-rank", "1", "--stall-after", "3",
                                 "--stall-seconds", "6", "--count", "10", "--timeout-ms", "700"},
                                {}, std::chrono::seconds(60));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& r = results[0];
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("TimeoutError: rank 0: allreduce #3"), std::string::npos) << r.err;
  const double waited = secondsWaited(r.err);
  EXPECT_GE(waited, 0.6) << r.err;
  EXPECT_LT(waited, 2.0) << r.err;
  EXPECT_LT(elapsed, 30.0);
}

}  // namespace
}  // namespace railshard
