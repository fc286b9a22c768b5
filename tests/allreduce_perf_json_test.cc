// allreduce_perf's profiling outputs, from the real binary at np=2 under railshard-launch:
// -J's JSON (one row per size, nccl-tests' formulas, efficiency against --link-gbps or the
// topology's ring limit, null when unknown), the efficiency column of the text table, a -J
// path that cannot be written, and no progress line when stderr is not a terminal.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace railshard {
namespace {

using nlohmann::json;

#ifdef RAILSHARD_ALLREDUCE_PERF_BIN
const std::string kPerf = RAILSHARD_ALLREDUCE_PERF_BIN;
#else
const std::string kPerf;
#endif
const std::string kLaunch = RAILSHARD_LAUNCH_BIN;

#define SKIP_WITHOUT_PERF() \
  if (kPerf.empty()) GTEST_SKIP() << "allreduce_perf is not built (benchmarks off)"

// 8 B, 512 B, 32 KiB: three rows.
const std::vector<size_t> kSizes = {8, 512, 32768};

std::vector<std::string> sweep(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kLaunch, "-n", "2",  kPerf, "-b", "8",  "-e",
                                   "32K",   "-f", "64", "-n",  "2",  "-w", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

test::ProcessResult run(const std::vector<std::string>& argv,
                        std::map<std::string, std::string> env = {}) {
  env.emplace("RAILSHARD_TIMEOUT", "60");
  return test::runProcess(argv, env, std::chrono::seconds(120));
}

json readJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);  // throws (fails the test) on a document that does not parse
}

// Every row: nccl-tests' algbw = bytes / time and busbw = algbw * 2(n-1)/n (n = 2: x1),
// both for out-of-place and in-place, and no wrong values.
void expectRowsConsistent(const json& doc) {
  ASSERT_TRUE(doc.contains("rows")) << doc.dump(2);
  const json& rows = doc["rows"];
  ASSERT_EQ(rows.size(), kSizes.size()) << doc.dump(2);
  const int ranks = doc["config"]["ranks"].get<int>();
  ASSERT_EQ(ranks, 2);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const json& row = rows[i];
    EXPECT_EQ(row["size"].get<size_t>(), kSizes[i]);
    EXPECT_EQ(row["count"].get<size_t>(), kSizes[i] / 4);
    EXPECT_EQ(row["type"], "float");
    EXPECT_EQ(row["redop"], "sum");
    EXPECT_EQ(row["root"], -1);
    for (const std::string p : {"oop", "ip"}) {
      const double us = row[p + "_time_us"].get<double>();
      ASSERT_GT(us, 0) << row.dump();
      const double algbw = row[p + "_algbw"].get<double>();
      EXPECT_NEAR(algbw, static_cast<double>(kSizes[i]) / (us * 1e-6) / 1e9, algbw * 1e-9)
          << row.dump();
      EXPECT_NEAR(row[p + "_busbw"].get<double>(), algbw * 2.0 * (ranks - 1) / ranks, algbw * 1e-9)
          << row.dump();
      EXPECT_EQ(row[p + "_wrong"].get<size_t>(), 0u) << row.dump();
    }
  }
  EXPECT_EQ(doc["wrong_total"].get<size_t>(), 0u);
}

TEST(AllreducePerfJson, LinkGbpsGivesEfficiencyInJsonAndTable) {
  SKIP_WITHOUT_PERF();
  const std::string path = test::tempPath("perf_link.json");
  std::remove(path.c_str());
  const auto r = run(sweep({"-J", path, "--link-gbps", "0.5"}));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  const json doc = readJson(path);
  EXPECT_EQ(doc["config"]["backend"], "railshard");
  EXPECT_EQ(doc["config"]["dtype"], "float");
  EXPECT_EQ(doc["config"]["op"], "sum");
  EXPECT_EQ(doc["config"]["iters"], 2);
  EXPECT_EQ(doc["config"]["warmup"], 1);
  EXPECT_FALSE(doc["version"].get<std::string>().empty());
  ASSERT_TRUE(doc["link_limit"].is_object()) << doc.dump(2);
  EXPECT_DOUBLE_EQ(doc["link_limit"]["gbps"].get<double>(), 0.5);
  EXPECT_EQ(doc["link_limit"]["source"], "--link-gbps");
  expectRowsConsistent(doc);
  for (const json& row : doc["rows"]) {
    ASSERT_TRUE(row["efficiency"].is_number()) << row.dump();
    EXPECT_NEAR(row["efficiency"].get<double>(), row["ip_busbw"].get<double>() * 8 / 0.5,
                1e-9 * row["efficiency"].get<double>())
        << row.dump();
  }

  // The text table: the header names the limit, every row gains a 14th column, eff in %,
  // matching the JSON (which has full precision; the table rounds to 0.1).
  EXPECT_NE(r.out.find("# link limit: 0.5 Gbit/s (--link-gbps)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eff"), std::string::npos) << r.out;
  const auto rows = test::perfTableRows(r.out);
  ASSERT_EQ(rows.size(), kSizes.size()) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 14u) << r.out;
    const double percent = std::stod(rows[i][13]);
    const double expected = 100 * doc["rows"][i]["efficiency"].get<double>();
    EXPECT_NEAR(percent, expected, 0.051 + expected * 1e-6) << r.out;
  }
  EXPECT_NE(r.out.find("# Avg efficiency"), std::string::npos) << r.out;
  std::remove(path.c_str());
}

// The two-host fixture (alpha and beta, 25 + 10 Gb/s rails between them) cut down to two
// ranks: the first rank of each host (`across` true) or both ranks of alpha. The ranks really
// share this host and the data takes whatever path works here; the limit comes from the
// graph (RAILSHARD_TOPO_FILE), which is what these tests check. Returns the file's path.
std::string twoRankTopology(bool across) {
  json topo;
  {
    std::ifstream in(std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/two_rail_pair.json");
    topo = json::parse(in);
  }
  json ranks = json::array();
  for (const json& placement : topo["ranks"]) {
    const bool take =
        across ? placement["local_rank"] == 0 : placement["host"] == topo["ranks"][0]["host"];
    if (take) {
      json p = placement;
      p["rank"] = ranks.size();
      ranks.push_back(p);
    }
  }
  EXPECT_EQ(ranks.size(), 2u);
  topo["ranks"] = ranks;
  const std::string path = test::tempPath(across ? "perf_topo_across.json" : "perf_topo_same.json");
  std::ofstream(path) << topo.dump();
  return path;
}

TEST(AllreducePerfJson, TopologyRailsGiveTheLimit) {
  SKIP_WITHOUT_PERF();
  const std::string topo_path = twoRankTopology(true);
  const std::string path = test::tempPath("perf_topo_out.json");
  // The graph's rail addresses do not exist here: the ranks warn and fall back to loopback.
  const auto r = run(sweep({"-J", path}), {{"RAILSHARD_TOPO_FILE", topo_path}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json doc = readJson(path);
  ASSERT_TRUE(doc["link_limit"].is_object()) << doc.dump(2) << r.out << r.err;
  const double gbps = doc["link_limit"]["gbps"].get<double>();
  EXPECT_GT(gbps, 10);  // both rails, not just one
  EXPECT_EQ(doc["link_limit"]["source"], "topology");
  const std::string description = doc["link_limit"]["description"];
  EXPECT_NE(description.find("2 rails"), std::string::npos) << description;
  EXPECT_EQ(doc["config"]["hosts"], json({"alpha", "beta"}));
  expectRowsConsistent(doc);
  for (const json& row : doc["rows"]) {
    EXPECT_NEAR(row["efficiency"].get<double>(), row["ip_busbw"].get<double>() * 8 / gbps,
                1e-9 * row["efficiency"].get<double>());
  }
  EXPECT_NE(r.out.find(" Gbit/s (" + description + "); eff = in-place busbw"), std::string::npos)
      << r.out;
  EXPECT_EQ(test::perfTableRows(r.out).at(0).size(), 14u) << r.out;
  std::remove(topo_path.c_str());
  std::remove(path.c_str());
}

// Both ranks on one host of the graph, which knows no speed between them: the limit is the
// shared-memory copy rate the ranks measured at start-up, and every row's efficiency is the
// in-place busbw against it.
TEST(AllreducePerfJson, OneHostLimitIsTheMeasuredSharedMemoryCopyRate) {
  SKIP_WITHOUT_PERF();
  const std::string topo_path = twoRankTopology(false);
  const std::string path = test::tempPath("perf_one_host.json");
  const auto r = run(sweep({"--json", path}), {{"RAILSHARD_TOPO_FILE", topo_path}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json doc = readJson(path);
  ASSERT_TRUE(doc["link_limit"].is_object()) << doc.dump(2);
  const double gbps = doc["link_limit"]["gbps"].get<double>();
  EXPECT_GT(gbps, 0);
  const std::string description = doc["link_limit"]["description"];
  EXPECT_NE(description.find("shared memory"), std::string::npos) << description;
  EXPECT_NE(description.find("measured at start-up"), std::string::npos) << description;
  expectRowsConsistent(doc);
  for (const json& row : doc["rows"]) {
    EXPECT_NEAR(row["efficiency"].get<double>(), row["ip_busbw"].get<double>() * 8 / gbps,
                1e-9 * row["efficiency"].get<double>());
  }
  EXPECT_NE(r.out.find("Avg efficiency"), std::string::npos) << r.out;
  EXPECT_EQ(test::perfTableRows(r.out).at(0).size(), 14u) << r.out;
  std::remove(topo_path.c_str());
  std::remove(path.c_str());
}

// The same ranks kept on TCP (RAILSHARD_TRANSPORT=tcp): nothing measured a speed between
// them, so no efficiency anywhere, and the header says why. The table keeps nccl-tests' 13
// columns.
TEST(AllreducePerfJson, UnknownLimitMeansNullEfficiencyAndNoColumn) {
  SKIP_WITHOUT_PERF();
  const std::string topo_path = twoRankTopology(false);
  const std::string path = test::tempPath("perf_unknown.json");
  const auto r = run(sweep({"--json", path}),
                     {{"RAILSHARD_TOPO_FILE", topo_path}, {"RAILSHARD_TRANSPORT", "tcp"}});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json doc = readJson(path);
  EXPECT_TRUE(doc["link_limit"].is_null()) << doc.dump(2);
  const std::string reason = doc["link_limit_unknown_reason"];
  EXPECT_NE(reason.find("same host, speed unknown"), std::string::npos) << reason;
  expectRowsConsistent(doc);
  for (const json& row : doc["rows"]) EXPECT_TRUE(row["efficiency"].is_null()) << row.dump();
  EXPECT_NE(r.out.find("# link limit: unknown ("), std::string::npos) << r.out;
  const auto rows = test::perfTableRows(r.out);
  ASSERT_EQ(rows.size(), kSizes.size()) << r.out;
  for (const auto& row : rows) EXPECT_EQ(row.size(), 13u) << r.out;
  EXPECT_EQ(r.out.find("Avg efficiency"), std::string::npos) << r.out;
  std::remove(topo_path.c_str());
  std::remove(path.c_str());
}

TEST(AllreducePerfJson, UnwritablePathIsAClearErrorBeforeTheSweep) {
  SKIP_WITHOUT_PERF();
  const std::string path = test::tempPath("no_such_dir") + "/sub/out.json";
  const auto r = run(sweep({"-J", path}));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("-J " + path + ": cannot open for writing"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No such file or directory"), std::string::npos) << r.err;
  EXPECT_TRUE(test::perfTableRows(r.out).empty()) << "the sweep ran anyway\n" << r.out;
}

TEST(AllreducePerfJson, BadLinkGbpsNamesTheValue) {
  SKIP_WITHOUT_PERF();
  for (const char* bad : {"0", "-3", "fast"}) {
    const auto r = test::runProcess({kPerf, "--link-gbps", bad}, {}, std::chrono::seconds(30));
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(
        r.err.find(std::string("--link-gbps: expected a speed in Gbit/s > 0, got '") + bad + "'"),
        std::string::npos)
        << r.err;
  }
}

// One rank alone (run without a launcher): it says so, and states no efficiency -- a link limit
// given by hand would otherwise read "0.0 %".
TEST(AllreducePerfJson, OneRankAloneSaysSoAndStatesNoEfficiency) {
  SKIP_WITHOUT_PERF();
  const auto r = test::runProcess(
      {kPerf, "-b", "8", "-e", "1K", "-f", "32", "-n", "1", "-w", "0", "--link-gbps", "25"}, {},
      std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("allreduce_perf: only 1 rank: the all-reduce moves no bytes"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("railshard-launch -n N"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("# alone: 1 rank"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("efficiency"), std::string::npos) << r.out;
  EXPECT_EQ(test::perfTableRows(r.out).size(), 2u) << r.out;
}

// Not a terminal (a pipe here): no progress line, however long the sweep; --progress forces
// it on (rank 0 only), --no-progress keeps it off.
TEST(AllreducePerfJson, ProgressLineOnlyWhenAskedOrOnATerminal) {
  SKIP_WITHOUT_PERF();
  const std::vector<std::string> single = {kPerf, "-b", "8", "-e", "32K", "-f",
                                           "64",  "-n", "1", "-w", "0"};
  auto r = test::runProcess(single, {}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[1/3]"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;

  auto forced = single;
  forced.push_back("--progress");
  r = test::runProcess(forced, {}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("\r[1/3] 8 B"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\r[3/3] 32 KiB in-place"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << "progress belongs on stderr\n" << r.out;
  EXPECT_EQ(test::perfTableRows(r.out).size(), kSizes.size()) << r.out;

  forced.back() = "--no-progress";
  r = test::runProcess(forced, {}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
}

}  // namespace
}  // namespace railshard
