// A bounded soak under the real launcher: 8 ranks run thousands of random collectives (every
// kind, dtype, op and size, in place and not), every element checked
// against a scalar reference (tests/programs/soak.cc), and each rank's open descriptors and
// resident memory compared between the end of a warm-up and the end of the run. Sizes are
// log-uniform from one element to 2 MiB (and 0 or 1 element in 8% of iterations).
//
// RAILSHARD_SOAK_SECONDS shortens (or lengthens) the TCP run, 60 s by default; the shared-memory
// run takes a third of it. RAILSHARD_SOAK_SEED replays a given seed (each run prints its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kSoak = std::string(RAILSHARD_BINARY_DIR) + "/tests/soak";

constexpr int kRanks = 8;

using test::kSanitized;

double tcpSeconds() {
  const char* text = std::getenv("RAILSHARD_SOAK_SECONDS");
  const double value = text ? std::atof(text) : 0;
  return value > 0 ? value : 60.0;
}

uint64_t seed() {
  if (const char* text = std::getenv("RAILSHARD_SOAK_SEED"))
    return std::strtoull(text, nullptr, 10);
  return std::random_device{}();
}

struct RankReport {
  int rank = -1;
  int size = 0;
  std::string transport;
  uint64_t iterations = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  uint64_t fds_start = 0;
  uint64_t fds_end = 0;
  uint64_t rss_start_kib = 0;
  uint64_t rss_end_kib = 0;
  uint64_t rss_max_kib = 0;
  uint64_t private_start_kib = 0;
  uint64_t private_end_kib = 0;
  uint64_t wrong = 0;
};

std::vector<RankReport> parseReports(const std::string& out) {
  const std::regex line_re(
      R"(soak rank (\d+) of (\d+) over (\w+): iterations (\d+) collectives \d+ bytes (\d+) )"
      R"(seconds ([\d.]+) fds (\d+) -> (\d+) rss_kib (\d+) -> (\d+) \(max (\d+)\) )"
      R"(private_kib (\d+) -> (\d+) wrong (\d+))");
  std::vector<RankReport> reports;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, line_re)) continue;
    RankReport r;
    r.rank = std::stoi(m[1]);
    r.size = std::stoi(m[2]);
    r.transport = m[3];
    r.iterations = std::stoull(m[4]);
    r.bytes = std::stoull(m[5]);
    r.seconds = std::stod(m[6]);
    r.fds_start = std::stoull(m[7]);
    r.fds_end = std::stoull(m[8]);
    r.rss_start_kib = std::stoull(m[9]);
    r.rss_end_kib = std::stoull(m[10]);
    r.rss_max_kib = std::stoull(m[11]);
    r.private_start_kib = std::stoull(m[12]);
    r.private_end_kib = std::stoull(m[13]);
    r.wrong = std::stoull(m[14]);
    reports.push_back(r);
  }
  return reports;
}

// Runs the soak for `seconds` and checks every rank's report. `min_rate`: collectives per
// second each rank must at least sustain (half of what this 2-core machine measured with all
// 8 ranks on it, see the callers), so a hang or a slow leak of time per collective fails.
void runSoak(const std::string& transport, double seconds, double min_rate) {
  const uint64_t s = seed();
  SCOPED_TRACE("seed " + std::to_string(s) + " (RAILSHARD_SOAK_SEED replays it), " +
               std::to_string(seconds) + " s");
  std::map<std::string, std::string> env;
  if (transport == "tcp") env["RAILSHARD_TRANSPORT"] = "tcp";
  std::ostringstream secs;
  secs << seconds;
  // Start-up, warm-up (8 collectives of 2 MiB plus 50 random ones) and the last agreement
  // round come on top of `seconds`; 8 ranks share 2 cores, more so under a sanitizer.
  const auto timeout = std::chrono::seconds(static_cast<int>(seconds) + (kSanitized ? 240 : 120));
  auto r = test::runProcess({kLaunch, "-n", std::to_string(kRanks), kSoak, "--seconds", secs.str(),
                             "--seed", std::to_string(s)},
                            env, timeout);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("WRONG"), std::string::npos) << r.err;
  const auto reports = parseReports(r.out);
  ASSERT_EQ(reports.size(), static_cast<size_t>(kRanks)) << r.out << r.err;
  const double min_iterations = min_rate * seconds;
  uint64_t iterations = reports[0].iterations;
  // The ranks stop together once the first of them is out of time: that one ran the whole
  // time; one whose clock started later may be a little short of it. Reports say 0.1 s.
  double longest = 0;
  for (const auto& report : reports) longest = std::max(longest, report.seconds);
  EXPECT_GE(longest, seconds - 0.05) << r.out;
  for (const auto& report : reports) {
    SCOPED_TRACE("rank " + std::to_string(report.rank));
    EXPECT_EQ(report.size, kRanks);
    EXPECT_EQ(report.transport, transport);
    EXPECT_EQ(report.wrong, 0u);
    // All ranks stop together (they agree on it), so all ran the same collectives.
    EXPECT_EQ(report.iterations, iterations);
    EXPECT_GE(static_cast<double>(report.iterations), min_iterations);
    EXPECT_GE(report.seconds, 0.9 * seconds);
    EXPECT_GT(report.bytes, 0u);
    // Every connection, shared-memory segment and eventfd is made at start-up; a collective
    // that opens one must close it, and nothing may close under a running job either (the
    // program names any descriptor that changed on stderr).
    EXPECT_EQ(report.fds_end, report.fds_start) << r.err;
    // Flat memory. The warm-up already ran every collective at the largest size (so buffers
    // the library grows are grown) and the program's buffers are allocated before it. Measured
    // on this machine (3 x 60 s TCP, 20 s shm): private memory (resident minus shared) grew
    // at most 1.7 MiB over TCP and 4 KiB over shm, allocator noise; the total over shm also
    // grew up to 4.3 MiB as pages of the shared segment were first touched, which is not a
    // leak. Bounds of 8 MiB private and 16 MiB total leave 4x that; a leak of 1 KiB per
    // collective (about 1,000-2,000 per run) or one 4 MiB buffer per few hundred would cross
    // them. Smaller leaks are below what RSS can resolve in a minute.
    // Under AddressSanitizer freed memory sits in its quarantine (up to 256 MiB) instead of
    // going back to the allocator, so RSS grows by design; there LeakSanitizer checks leaks
    // at exit instead, and the fd check above still holds.
    if (kSanitized) continue;
    EXPECT_LT(report.private_end_kib, report.private_start_kib + 8 * 1024)
        << "private memory grew from " << report.private_start_kib << " KiB to "
        << report.private_end_kib << " KiB";
    EXPECT_LT(report.rss_end_kib, report.rss_start_kib + 16 * 1024)
        << "RSS grew from " << report.rss_start_kib << " KiB to " << report.rss_end_kib << " KiB";
    EXPECT_LT(report.rss_max_kib, report.rss_start_kib + 16 * 1024);
  }
  std::printf("%s soak: %llu iterations in %.1f s per rank (%.0f/s), seed %llu\n",
              transport.c_str(), static_cast<unsigned long long>(iterations), reports[0].seconds,
              static_cast<double>(iterations) / reports[0].seconds,
              static_cast<unsigned long long>(s));
}

// Rates measured here (2 cores shared by 8 ranks and other jobs; load average 8-9): TCP 26.0,
// 27.9 and 30.1 iterations/s over 3 x 60 s, shared memory 46.2/s over 20 s. The bounds are
// half the slowest; under AddressSanitizer a tenth of that.
TEST(Soak, EightRanksOverTcpStayCorrectWithFlatDescriptorsAndMemory) {
  runSoak("tcp", tcpSeconds(), kSanitized ? 1.3 : 13.0);
}

// Default transport: every rank on this host, so shared memory.
TEST(Soak, EightRanksOverSharedMemoryStayCorrectWithFlatDescriptorsAndMemory) {
  runSoak("shm", tcpSeconds() / 3, kSanitized ? 2.3 : 23.0);
}

}  // namespace
}  // namespace railshard
