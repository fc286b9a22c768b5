// allreduce_perf's backends (benchmarks/perf_backend.h): each one that is built runs a small
// sweep at np=2 with no wrong values, and the errors for an unknown backend or a dtype a
// backend cannot run are clear. Backends not built into this allreduce_perf are skipped.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

#ifdef RAILSHARD_ALLREDUCE_PERF_BIN
const std::string kPerf = RAILSHARD_ALLREDUCE_PERF_BIN;
#else
const std::string kPerf;
#endif
const std::string kLaunch = RAILSHARD_LAUNCH_BIN;

// "Backends built in: railshard mpi gloo" from --help.
bool isBuilt(const std::string& backend) {
  if (kPerf.empty()) return false;
  const auto r = test::runProcess({kPerf, "--help"}, {}, std::chrono::seconds(30));
  const auto at = r.out.find("Backends built in:");
  if (at == std::string::npos) return false;
  std::istringstream words(r.out.substr(at + 18, r.out.find('\n', at) - at - 18));
  std::string word;
  while (words >> word) {
    if (word == backend) return true;
  }
  return false;
}

#define SKIP_UNLESS_BUILT(backend)                                                     \
  do {                                                                                 \
    if (kPerf.empty()) GTEST_SKIP() << "allreduce_perf is not built (benchmarks off)"; \
    if (!isBuilt(backend))                                                             \
      GTEST_SKIP() << "allreduce_perf has no --backend " << backend                    \
                   << " in this build (library not found by CMake)";                   \
  } while (0)

// Runs a sweep of 8 B, 512 B and 32 KiB and checks every row and the footer.
void expectCleanSweep(const std::vector<std::string>& argv, const std::string& dtype = "float",
                      const std::string& op = "sum") {
  auto r = test::runProcess(argv, {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto rows = test::perfTableRows(r.out);  // 13 columns, 14 with a known link limit
  EXPECT_EQ(rows.size(), 3u) << r.out;
  for (const auto& row : rows) {
    EXPECT_EQ(row[2], dtype) << r.out;
    EXPECT_EQ(row[3], op) << r.out;
    EXPECT_EQ(row[8], "0") << "out-of-place #wrong\n" << r.out;
    EXPECT_EQ(row[12], "0") << "in-place #wrong\n" << r.out;
  }
  EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
}

std::vector<std::string> sweep(std::vector<std::string> argv,
                               const std::vector<std::string>& extra = {}) {
  for (const char* arg : {"-b", "8", "-e", "32K", "-f", "64", "-n", "2", "-w", "1"}) {
    argv.push_back(arg);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(PerfBackends, RailshardUnderRailshardLaunch) {
  SKIP_UNLESS_BUILT("railshard");
  expectCleanSweep(sweep({kLaunch, "-n", "2", kPerf, "--backend", "railshard"}));
}

TEST(PerfBackends, HeaderNamesTheBackend) {
  SKIP_UNLESS_BUILT("railshard");
  auto r = test::runProcess({kPerf, "-b", "8", "-e", "8", "-n", "1", "-w", "0"}, {},
                            std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# Using railshard"), std::string::npos) << r.out;
}

#ifdef RAILSHARD_MPIRUN
std::vector<std::string> mpirun(int np) {
  return {RAILSHARD_MPIRUN,  "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
          std::to_string(np)};
}

TEST(PerfBackends, MpiUnderMpirun) {
  SKIP_UNLESS_BUILT("mpi");
  auto argv = mpirun(2);
  argv.insert(argv.end(), {kPerf, "--backend", "mpi"});
  expectCleanSweep(sweep(argv));
}

// avg is MPI_SUM followed by a local divide; int32 exercises the truncating divide.
TEST(PerfBackends, MpiAverageIsSumThenDivide) {
  SKIP_UNLESS_BUILT("mpi");
  auto argv = mpirun(2);
  argv.insert(argv.end(), {kPerf, "--backend", "mpi"});
  expectCleanSweep(sweep(argv, {"-d", "int32", "-o", "avg"}), "int32", "avg");
}

TEST(PerfBackends, MpiRejectsHalfClearly) {
  SKIP_UNLESS_BUILT("mpi");
  auto argv = mpirun(2);
  argv.insert(argv.end(), {kPerf, "--backend", "mpi", "-b", "8", "-e", "8", "-d", "half"});
  auto r = test::runProcess(argv, {}, std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("datatype half is not supported by the mpi backend"), std::string::npos)
      << r.out << r.err;
  EXPECT_EQ(r.out.find("# Out of bounds"), std::string::npos) << "no table expected\n" << r.out;
}
#endif

TEST(PerfBackends, MpiOutsideMpirunIsRefused) {
  SKIP_UNLESS_BUILT("mpi");
  auto r =
      test::runProcess({kLaunch, "-n", "2", kPerf, "--backend", "mpi", "-b", "8", "-e", "8"},
                       {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}},
                       std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--backend mpi must run under mpirun"), std::string::npos) << r.out << r.err;
}

TEST(PerfBackends, GlooUnderRailshardLaunchEveryAlgorithm) {
  SKIP_UNLESS_BUILT("gloo");
  for (const char* algo : {"auto", "ring", "hd"}) {
    SCOPED_TRACE(algo);
    expectCleanSweep(sweep({kLaunch, "-n", "2", kPerf, "--backend", "gloo", "--gloo-algo", algo}));
  }
}

// Gloo has no avg (sum then divide) and its float16 type goes through gloo::float16.
TEST(PerfBackends, GlooAverageAndHalf) {
  SKIP_UNLESS_BUILT("gloo");
  expectCleanSweep(sweep({kLaunch, "-n", "2", kPerf, "--backend", "gloo"}, {"-o", "avg"}), "float",
                   "avg");
  expectCleanSweep(sweep({kLaunch, "-n", "2", kPerf, "--backend", "gloo", "--gloo-algo", "ring"},
                         {"-d", "half", "-o", "max"}),
                   "half", "max");
}

TEST(PerfBackends, GlooRejectsBfloat16Clearly) {
  SKIP_UNLESS_BUILT("gloo");
  auto r = test::runProcess(
      {kLaunch, "-n", "2", kPerf, "--backend", "gloo", "-b", "8", "-e", "8", "-d", "bfloat16"}, {},
      std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("datatype bfloat16 is not supported by the gloo backend"), std::string::npos)
      << r.out << r.err;
}

TEST(PerfBackends, UnknownBackendNamesWhatIsBuilt) {
  if (kPerf.empty()) GTEST_SKIP() << "allreduce_perf is not built";
  auto r = test::runProcess({kPerf, "--backend", "rccl", "-b", "8", "-e", "8"}, {},
                            std::chrono::seconds(30));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown backend 'rccl'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("built: railshard"), std::string::npos) << r.err;
}

TEST(PerfBackends, UnknownGlooAlgorithmIsRejected) {
  if (kPerf.empty()) GTEST_SKIP() << "allreduce_perf is not built";
  auto r = test::runProcess({kPerf, "--gloo-algo", "bcube"}, {}, std::chrono::seconds(30));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--gloo-algo: expected ring, hd or auto, got 'bcube'"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace railshard
