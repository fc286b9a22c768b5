// Elastic continuation end to end: dispatch_bench under railshard-launch --elastic, one rank
// killing itself (SIGKILL) mid-run. The survivors must shrink the communicator, recover the
// dispatcher and finish (and, with --max-restarts and --grow, admit the restarted rank); the
// per-sample ledger (the sample ids each rank reported processing in every committed step,
// summed by an all-reduce) must show each sample of the epoch exactly once. Shares after the
// failure are checked exactly (they do not depend on timing); times only loosely, as the machine
// running the tests is shared. Measured figures are in docs/dispatch.md.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tests/dispatch_bench_paths.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

using test::kBench;
using test::kLaunch;

// Runs `launcher_args` + dispatch_bench + `args` and returns the JSON it wrote (null if none).
nlohmann::json runBench(const std::vector<std::string>& launcher_args,
                        const std::vector<std::string>& args, test::ProcessResult* result) {
  const std::string json_path = test::tempPath("elastic.json");
  std::remove(json_path.c_str());
  std::vector<std::string> argv = {kLaunch};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back(kBench);
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--json", json_path});
  *result = test::runProcess(argv, {{"RAILSHARD_TIMEOUT", "30"}}, std::chrono::seconds(120));
  std::ifstream in(json_path);
  if (!in) return nullptr;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::remove(json_path.c_str());
  return j;
}

const nlohmann::json* summaryOf(const nlohmann::json& j, const std::string& policy) {
  for (const auto& s : j["summary"]) {
    if (s["policy"] == policy) return &s;
  }
  return nullptr;
}

// 4 ranks of speeds 1:2:4:2, 14 steps of 840 samples (ideal 50 ms, ~1.5 s in all).
const std::vector<std::string> kQuick = {"--speeds", "1,2,4,2", "--steps",      "14",
                                         "--warmup", "3",       "--grad-count", "16K"};

TEST(DispatchElastic, KilledRanksStepIsRedoneByTheSurvivorsEverySampleOnce) {
  SKIP_UNLESS_BUILT();
  std::vector<std::string> args = kQuick;
  args.insert(args.end(), {"--kill", "2:6", "--policies", "proportional"});
  test::ProcessResult r;
  const nlohmann::json j = runBench({"--elastic", "-n", "4"}, args, &r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object()) << "no JSON written\n" << r.out << r.err;

  EXPECT_NE(r.out.find("# ledger (proportional): epoch 0: 11760 samples, each processed exactly "
                       "once (0 missing, 0 duplicated); rank 2 lost at step 6"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("re-converged within 1.10x of the survivors' ideal"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step 6 is redone with the lost ranges moved to the survivors"),
            std::string::npos)
      << r.out;

  const auto* s = summaryOf(j, "proportional");
  ASSERT_NE(s, nullptr) << j.dump();
  EXPECT_TRUE((*s)["ledger_ok"].get<bool>()) << s->dump();
  ASSERT_EQ((*s)["ledger"].size(), 1u);
  EXPECT_EQ((*s)["ledger"][0]["exactly_once"], 11760);
  EXPECT_EQ((*s)["ledger"][0]["missing"], 0);
  EXPECT_EQ((*s)["ledger"][0]["duplicated"], 0);
  ASSERT_EQ((*s)["failures"].size(), 1u);
  const auto& failure = (*s)["failures"][0];
  EXPECT_EQ(failure["lost_ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(failure["step"], 6);
  EXPECT_EQ(failure["steps_standing"], 6);  // killed before its all-reduce: step 6 is redone
  EXPECT_TRUE(failure["redo"].get<bool>());
  EXPECT_EQ(failure["survivors"], 3);

  // Every step 0..13 once; from step 6 on rank 2 has nothing and the survivors share the whole
  // batch 1:2:2 (168, 336, 336: the estimates were kept; a warm-up split would be 280 each).
  std::vector<int> seen(14, 0);
  for (const auto& step : j["steps"]) {
    const int n = step["step"];
    ASSERT_GE(n, 0);
    ASSERT_LT(n, 14);
    ++seen[static_cast<size_t>(n)];
    const auto shares = step["shares"].get<std::vector<size_t>>();
    ASSERT_EQ(shares.size(), 4u);
    EXPECT_EQ(std::accumulate(shares.begin(), shares.end(), size_t{0}), 840u) << step.dump();
    if (n < 6) {
      EXPECT_EQ(step["live_ranks"], 4) << step.dump();
      continue;
    }
    EXPECT_EQ(step["live_ranks"], 3) << step.dump();
    EXPECT_EQ(step["redo"].get<bool>(), n == 6) << step.dump();
    // Measured rates move a little on a loaded machine: allow one micro-batch per rank.
    const std::vector<size_t> expected = {168, 336, 0, 336};
    for (size_t rank = 0; rank < 4; ++rank) {
      EXPECT_LE(shares[rank], expected[rank] + 8) << step.dump();
      EXPECT_GE(shares[rank] + 8, expected[rank]) << step.dump();
    }
    EXPECT_EQ(shares[2], 0u) << step.dump();
    // The ideal is the survivors': 840 samples at speeds 1 + 2 + 2.
    EXPECT_NEAR(step["ideal_ms"].get<double>(), 840 * j["unit_ms"].get<double>() / 5, 1e-6);
  }
  EXPECT_EQ(seen, std::vector<int>(14, 1));
  const auto& after = (*s)["after_failure"];
  ASSERT_FALSE(after["reconverge_steps"].is_null()) << s->dump();
  EXPECT_LE(after["reconverge_steps"].get<int>(), 3) << r.out;
  EXPECT_LT(after["after_median_ratio"].get<double>(), 1.3) << r.out;
}

TEST(DispatchElastic, ARankLostAfterItsAllreduceLeavesTheStepStandingForEveryPolicy) {
  SKIP_UNLESS_BUILT();
  // Killed after step 5's all-reduce: step 5 stands, the survivors plan step 6 afresh; then
  // `equal` runs on the three survivors. Launch rank 0 dies: rank 0 of the end is launch 1.
  std::vector<std::string> args = kQuick;
  args.insert(args.end(), {"--kill", "0:5:commit", "--policies", "proportional,equal"});
  test::ProcessResult r;
  const nlohmann::json j = runBench({"--elastic", "-n", "4"}, args, &r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object()) << "no JSON written\n" << r.out << r.err;
  for (const std::string policy : {"proportional", "equal"}) {
    EXPECT_NE(r.out.find("# ledger (" + policy +
                         "): epoch 0: 11760 samples, each processed exactly once (0 missing, 0 "
                         "duplicated)"),
              std::string::npos)
        << r.out;
    const auto* s = summaryOf(j, policy);
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE((*s)["ledger_ok"].get<bool>());
  }
  const auto& failures = (*summaryOf(j, "proportional"))["failures"];
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0]["lost_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(failures[0]["steps_standing"], 6);
  EXPECT_FALSE(failures[0]["redo"].get<bool>());
  for (const auto& step : j["steps"]) {
    if (step["policy"] == "equal") {
      EXPECT_EQ(step["shares"], nlohmann::json({0, 280, 280, 280})) << step.dump();
    }
  }
}

// Kill and restart: railshard-launch --max-restarts 1 restarts the killed rank, which joins
// through init(); with --grow the members admit it at the next step boundary and hand it the
// dispatcher. Its first share is the median rate's (slot 1's), then its own speed's. The
// ledger is what the ranks reported processing, across both changes of membership.
TEST(DispatchElastic, TheLauncherRestartsTheKilledRankAndItGetsItsSharesBack) {
  SKIP_UNLESS_BUILT();
  const std::vector<std::string> args = {
      "--speeds", "1,2,4,2", "--steps", "22",     "--warmup",   "3",           "--grad-count",
      "16K",      "--kill",  "2:6",     "--grow", "--policies", "proportional"};
  test::ProcessResult r;
  const nlohmann::json j = runBench({"--max-restarts", "1", "-n", "4"}, args, &r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object()) << "no JSON written\n" << r.out << r.err;
  EXPECT_NE(r.out.find("# ledger (proportional): epoch 0: 18480 samples, each processed exactly "
                       "once (0 missing, 0 duplicated); rank 2 lost at step 6"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("# slot 2 rejoined as launch rank 4 (dispatcher rank 4)"), std::string::npos)
      << r.out;
  const auto* s = summaryOf(j, "proportional");
  ASSERT_NE(s, nullptr) << j.dump();
  EXPECT_TRUE((*s)["ledger_ok"].get<bool>()) << s->dump();
  ASSERT_EQ((*s)["growths"].size(), 1u) << s->dump();
  const auto& growth = (*s)["growths"][0];
  EXPECT_EQ(growth["slots"], nlohmann::json::array({2}));
  EXPECT_EQ(growth["launch_ranks"], nlohmann::json::array({4}));
  EXPECT_EQ(growth["ranks"], 4);
  const int first = growth["first_step"];
  ASSERT_GT(first, 6);
  ASSERT_LE(first, 18) << "admitted too late to see the shares settle: " << r.out;
  // Measured rates move on a loaded machine, and the joiner's estimate rests on two steps
  // only: each step may be two micro-batches (16 samples) off per slot, the median of the
  // settled steps one.
  const auto near = [](size_t share, size_t expected, size_t slack) {
    return share <= expected + slack && share + slack >= expected;
  };
  std::vector<std::vector<size_t>> settled(4);
  for (const auto& step : j["steps"]) {
    const int n = step["step"];
    const auto shares = step["shares"].get<std::vector<size_t>>();
    EXPECT_EQ(std::accumulate(shares.begin(), shares.end(), size_t{0}), 840u) << step.dump();
    if (n < first) continue;
    EXPECT_EQ(step["live_ranks"], 4) << step.dump();
    // First grown step: no measurement of the joiner yet, the median rate's share (slot 1's
    // and slot 3's); two steps on, its own speed 4 (1:2:4:2 -> 96, 184, 376, 184).
    const std::vector<size_t> expected = n == first ? std::vector<size_t>{120, 240, 240, 240}
                                                    : std::vector<size_t>{96, 184, 376, 184};
    if (n == first || n >= first + 2) {
      for (size_t slot = 0; slot < 4; ++slot) {
        EXPECT_TRUE(near(shares[slot], expected[slot], 16))
            << "slot " << slot << " expected " << expected[slot] << ": " << step.dump();
        if (n >= first + 2) settled[slot].push_back(shares[slot]);
      }
    }
  }
  const std::vector<size_t> own = {96, 184, 376, 184};
  for (size_t slot = 0; slot < 4; ++slot) {
    auto& v = settled[slot];
    ASSERT_FALSE(v.empty()) << r.out;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    EXPECT_TRUE(near(v[v.size() / 2], own[slot], 8))
        << "slot " << slot << " median share " << v[v.size() / 2] << ", expected " << own[slot];
  }
  ASSERT_FALSE((*s)["after_growth"]["regain_steps"].is_null()) << s->dump();
}

// The same across two emulated hosts (the namespace test bed, each host its own hostname),
// without railshard-launch: ranks started by hand, the store in railshard-store on host 0, the
// killed rank restarted on host 1 with RAILSHARD_JOIN=1 (benchmarks/dispatch_restart.sh 2x2).
// The survivors and the joiner find who shares a host again after the grow; the ledger the
// ranks report must hold every sample once.
TEST(DispatchElastic, OnTwoHostsAHandRestartedRankRejoinsAndEverySampleIsOnce) {
  SKIP_UNLESS_BUILT();
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const auto r = test::runProcess(
      {"bash", std::string(RAILSHARD_SOURCE_DIR) + "/benchmarks/dispatch_restart.sh",
       RAILSHARD_BINARY_DIR, "1", "2x2"},
      {}, std::chrono::seconds(150));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  // The script fails only before its trials (a trial's failure shows in the figures): the
  // test bed could not be built here (no netns/veth/tc support).
  if (r.exit_code != 0) GTEST_SKIP() << "cannot build the namespace test bed: " << r.err;
  EXPECT_NE(r.out.find("ledger exactly once: 1 of 1 trials"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("to 4 ranks (s)  n=1"), std::string::npos) << r.out << r.err;
  // The grown generation extended the cluster graph by the joiner's host (the one it left):
  // both rails between the hosts again, not hosts compared through the store.
  EXPECT_NE(r.out.find("the restarted rank sees 2 hosts x 2 ranks; cluster graph: 2 rails "),
            std::string::npos)
      << r.out << r.err;
}

TEST(DispatchElastic, WithoutElasticKillIsRefusedAndBadKillOptionsAreUsageErrors) {
  SKIP_UNLESS_BUILT();
  std::vector<std::string> args = kQuick;
  args.insert(args.end(), {"--kill", "2:3", "--policies", "proportional"});
  test::ProcessResult r;
  runBench({"-n", "4"}, args, &r);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  // Refused before any step (the killed rank would otherwise end the job with 137).
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--kill: needs railshard-launch --elastic"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("# ledger"), std::string::npos) << r.out;

  const auto rank = test::runProcess({kLaunch, "-n", "2", kBench, "--kill", "5:3"},
                                     {{"RAILSHARD_TIMEOUT", "30"}}, std::chrono::seconds(60));
  EXPECT_EQ(rank.exit_code, 2) << rank.out << rank.err;
  EXPECT_NE(rank.err.find("--kill: rank 5 does not exist"), std::string::npos) << rank.err;
  const auto shape = test::runProcess({kBench, "--kill", "2"}, {}, std::chrono::seconds(30));
  EXPECT_EQ(shape.exit_code, 2);
  EXPECT_NE(shape.err.find("--kill: expected RANK:STEP[:compute|commit]"), std::string::npos)
      << shape.err;
  const auto late =
      test::runProcess({kBench, "--kill", "1:30", "--steps", "30"}, {}, std::chrono::seconds(30));
  EXPECT_EQ(late.exit_code, 2);
  EXPECT_NE(late.err.find("--kill: step 30 is past the last step"), std::string::npos) << late.err;
}

}  // namespace
}  // namespace railshard
