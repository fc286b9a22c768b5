// Ranks that disagree on a collective: 4 real processes in which rank 2 calls a different op,
// count, dtype or collective, or skips one (tests/programs/mismatch_check.cc). Every rank, not
// only the ones that exchange data with rank 2, must raise MismatchError, and its message must
// name the field that differs and rank 2. RAILSHARD_TIMEOUT is 60 s, so only the header check
// can explain an answer within seconds; a rank that instead waits for the timeout, or sees
// rank 2 leave (PeerLostError) before it is told about the mismatch, fails the test.
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/mismatch_check";

constexpr int kSize = 4;
constexpr int kBadRank = 2;
// Far below RAILSHARD_TIMEOUT (60 s) and the heartbeat timeout (10 s): a rank that only stops
// because of either does not make it.
constexpr double kQuickSeconds = 8.0;

struct Case {
  const char* name;   // --case of mismatch_check
  const char* field;  // what the message must name ("<field>: rank A has X, rank B has Y")
};

const Case kCases[] = {
    {"op", "op: "},
    {"count", "count: "},
    {"dtype", "dtype: "},
    {"collective", "collective: "},
    // Rank 2's next collective is a broadcast where the others run the all-reduce it skipped.
    {"order", "collective: "},
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

using Param = std::tuple<Case, std::string>;  // case, RAILSHARD_TRANSPORT

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param);
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The line rank `rank` printed about its error ("rank R: ..."), from output that may hold
// every rank's lines, each behind the launcher's "[r] ".
std::string errorLine(const std::string& err, int rank) {
  std::string key = "rank ";
  key += std::to_string(rank);
  key += ": ";
  std::istringstream lines(err);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '[') {
      const size_t close = line.find("] ");
      if (close != std::string::npos) line.erase(0, close + 2);
    }
    if (line.rfind(key, 0) == 0) return line;
  }
  return "";
}

void expectMismatchLine(const std::string& err, int rank, const Case& c) {
  const std::string line = errorLine(err, rank);
  SCOPED_TRACE("rank " + std::to_string(rank) + " printed: " + line);
  EXPECT_EQ(line.rfind("rank " + std::to_string(rank) + ": MismatchError: ", 0), 0u) << err;
  EXPECT_NE(line.find(c.field), std::string::npos) << err;
  EXPECT_NE(line.find("rank " + std::to_string(kBadRank) + " has"), std::string::npos) << err;
}

class Mismatch : public ::testing::TestWithParam<Param> {};

// Ranks started by hand: nobody stops a rank for another's failure, so each rank's own error
// and exit status is seen.
TEST_P(Mismatch, EveryRankStartedByHandRaisesMismatchErrorNamingTheField) {
  const auto& [c, transport] = GetParam();
  const std::string addr = "127.0.0.1:" + std::to_string(test::freePort());
  std::vector<test::ProcessResult> results(kSize);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      results[static_cast<size_t>(rank)] =
          test::runProcess({kCheck, "--case", c.name, "--bad-rank", std::to_string(kBadRank)},
                           {{"RAILSHARD_RANK", std::to_string(rank)},
                            {"RAILSHARD_WORLD_SIZE", std::to_string(kSize)},
                            {"RAILSHARD_STORE_ADDR", addr},
                            {"RAILSHARD_TIMEOUT", "60"},
                            {"RAILSHARD_TRANSPORT", transport}},
                           std::chrono::seconds(90));
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = secondsSince(start);
  for (int rank = 0; rank < kSize; ++rank) {
    const auto& r = results[static_cast<size_t>(rank)];
    EXPECT_FALSE(r.timed_out) << "rank " << rank;
    EXPECT_EQ(r.exit_code, 1) << "rank " << rank << ": " << r.err;
    expectMismatchLine(r.err, rank, c);
  }
  EXPECT_LT(seconds, kQuickSeconds);
}

// Under the launcher, which stops every rank as soon as one fails: the program treats the
// expected MismatchError as success, so every rank gets to report its own.
TEST_P(Mismatch, EveryRankUnderRailshardLaunchRaisesMismatchError) {
  const auto& [c, transport] = GetParam();
  const auto start = std::chrono::steady_clock::now();
  auto r = test::runProcess({kLaunch, "-n", std::to_string(kSize), kCheck, "--case", c.name,
                             "--bad-rank", std::to_string(kBadRank), "--expect-mismatch", "1"},
                            {{"RAILSHARD_TIMEOUT", "60"}, {"RAILSHARD_TRANSPORT", transport}},
                            std::chrono::seconds(90));
  const double seconds = secondsSince(start);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < kSize; ++rank) expectMismatchLine(r.err, rank, c);
  EXPECT_LT(seconds, kQuickSeconds);
}

#ifdef RAILSHARD_HAVE_MPI
TEST_P(Mismatch, EveryRankUnderMpirunRaisesMismatchError) {
  const auto& [c, transport] = GetParam();
  const auto start = std::chrono::steady_clock::now();
  auto r =
      test::runProcess({RAILSHARD_MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to",
                        "none", "-np", std::to_string(kSize), "-x", "RAILSHARD_TIMEOUT=60", "-x",
                        "RAILSHARD_TRANSPORT=" + transport, kCheck, "--case", c.name, "--bad-rank",
                        std::to_string(kBadRank), "--expect-mismatch", "1"},
                       {}, std::chrono::seconds(90));
  const double seconds = secondsSince(start);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < kSize; ++rank) expectMismatchLine(r.err, rank, c);
  // mpirun's own start-up and shutdown take a second or two more than railshard-launch's.
  EXPECT_LT(seconds, kQuickSeconds + 4);
}
#endif

INSTANTIATE_TEST_SUITE_P(CasesAndTransports, Mismatch,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(std::string("tcp"),
                                                              std::string("shm"))),
                         paramName);

}  // namespace
}  // namespace railshard
