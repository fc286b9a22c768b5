// Multi-rail TCP between two "hosts" (network namespaces) joined by two shaped rails, 400 and
// 100 Mbit/s: all-reduces stay correct over both rails, the scheduler's estimates order the
// rails as the shaping does, and a rail taken down in the middle of a run is failed over
// (the run completes with right answers; the log names the rail) and re-admitted when it comes
// back. Needs root; skips otherwise. Each test is bounded to about 10-20 s.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include "netns_testbed.h"
#include "test_util.h"

namespace {

using railshard::test::NetnsTestbed;
using railshard::test::ProcessResult;
using ::testing::HasSubstr;

const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

struct RailLine {
  bool up = false;
  double gbps = 0;
  double fraction = 0;
  unsigned long long bytes = 0;
};

// The "rail NAME up=U gbps=G fraction=F bytes=B" lines collective_check --rails 1 prints.
std::map<std::string, RailLine> parseRails(const std::string& out) {
  std::map<std::string, RailLine> rails;
  const std::regex line(R"(rail (\S+) up=(\d) gbps=([0-9.]+) fraction=([0-9.]+) bytes=(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    RailLine r;
    r.up = (*it)[2] == "1";
    r.gbps = std::stod((*it)[3]);
    r.fraction = std::stod((*it)[4]);
    r.bytes = std::stoull((*it)[5]);
    rails[(*it)[1]] = r;
  }
  return rails;
}

// 4 MB all-reduces: about 70 ms each over both rails.
const std::vector<std::string> kRun = {kCheck, "--count", "500000", "--rails", "1", "--iterations"};

TEST_F(NetnsTestbed, AllreduceStripesOverBothRailsWeightedByTheirRates) {
  auto args = kRun;
  args.push_back("40");
  auto rank0 = startRank(0, args, {});
  auto rank1 = startRank(1, args, {});
  const ProcessResult r0 = rank0.get();
  const ProcessResult r1 = rank1.get();
  ASSERT_EQ(r0.exit_code, 0) << r0.err;  // every element of every result checked
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  for (const ProcessResult* r : {&r0, &r1}) {
    const auto rails = parseRails(r->out);
    ASSERT_EQ(rails.size(), 2u) << r->out;
    const RailLine& fast = rails.at("rail0");
    const RailLine& slow = rails.at("rail1");
    EXPECT_TRUE(fast.up && slow.up);
    // Both carried a real share; the veths' nominal speeds are equal, so the order and the
    // ratio (shaped 4:1) come from measurement alone.
    EXPECT_GT(slow.bytes, 10ull << 20) << r->out;
    EXPECT_GT(fast.bytes, 2 * slow.bytes) << r->out;
    EXPECT_GT(fast.fraction, slow.fraction) << r->out;
    // htb delivers ~95.5% of the shaped rate as TCP payload (FIELD-NOTES).
    const double ratio = fast.gbps / slow.gbps;
    EXPECT_GT(ratio, 3.0) << r->out;
    EXPECT_LT(ratio, 5.3) << r->out;
    EXPECT_NEAR(fast.gbps, 0.4 * 0.955, 0.4 * 0.25) << r->out;
    EXPECT_NEAR(slow.gbps, 0.1 * 0.955, 0.1 * 0.25) << r->out;
  }
}

TEST_F(NetnsTestbed, RailTakenDownMidRunIsFailedOverAndReadmitted) {
  auto args = kRun;
  args.push_back("100");
  const std::map<std::string, std::string> env = {{"RAILSHARD_RAIL_TIMEOUT", "1"},
                                                  {"RAILSHARD_LOG_LEVEL", "info"}};
  auto rank0 = startRank(0, args, env);
  auto rank1 = startRank(1, args, env);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(testbed("link", {"0", "1", "down"}).exit_code, 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_EQ(testbed("link", {"0", "1", "up"}).exit_code, 0);
  const ProcessResult r0 = rank0.get();
  const ProcessResult r1 = rank1.get();
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  const std::string log = r0.err + r1.err;
  EXPECT_THAT(log, HasSubstr("rail rail1 ("));
  EXPECT_THAT(log, HasSubstr("taken out"));
  EXPECT_THAT(log, HasSubstr("is back"));
  const auto rails = parseRails(r0.out);
  ASSERT_EQ(rails.size(), 2u) << r0.out;
  EXPECT_TRUE(rails.at("rail1").up) << r0.out << log;
}

}  // namespace
