// RAILSHARD_TRACE end to end in one process: ranks on threads with real TCP connections (and,
// for the rail test, two loopback "rails" from a cluster graph), a known sequence of
// collectives, then the per-rank files the recorder writes, parsed back as JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "base/trace.h"
#include "core/communicator.h"
#include "core/topology/topology.h"
#include "core/tracing/link_limit.h"
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard {
namespace {

using nlohmann::json;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Config traceConfig(const std::string& dir) {
  Config config;
  config.timeout = std::chrono::seconds(60);
  config.connect_timeout = std::chrono::seconds(30);
  config.chunk_bytes = 64 * 1024;
  config.transport = TransportKind::kTcp;
  config.trace_dir = dir;
  config.trace_events = 1 << 20;
  return config;
}

// A fresh directory, and the recorder reset around the test (it is per process).
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trace::disableAndClear();
    dir_ = test::tempPath(
        "trace_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    trace::disableAndClear();
    std::filesystem::remove_all(dir_);
  }
  json load(int rank) const { return json::parse(readFile(trace::rankFile(dir_, rank))); }

  std::string dir_;
};

std::vector<json> eventsOf(const json& file, const std::string& cat) {
  std::vector<json> out;
  for (const auto& e : file["traceEvents"]) {
    if (e.value("cat", "") == cat) out.push_back(e);
  }
  return out;
}

TEST_F(TraceTest, KnownSequenceOfCollectivesIsRecordedInOrderOnEveryRank) {
  constexpr int kSize = 3;
  constexpr size_t kCount = 200000;  // 800 KB: the ring, several chunks
  MemoryStore store;
  test::rethrowFirst(test::runRanks(kSize, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = kSize;
    options.config = traceConfig(dir_);
    auto comm = Communicator::create(store, options);
    std::vector<float> data(kCount, 1.0f + static_cast<float>(rank));
    comm->allreduce(data.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(data[kCount - 1], 6.0f);
    std::vector<int32_t> small(10, rank);
    comm->broadcast(small.data(), small.size(), DataType::kInt32, 2);
    std::vector<double> gathered(kSize * 1000);
    std::vector<double> mine(1000, rank);
    comm->allgather(mine.data(), gathered.data(), mine.size(), DataType::kFloat64);
    comm->barrier();
  }));
  const auto written = trace::flush();
  ASSERT_EQ(written.size(), static_cast<size_t>(kSize));

  const std::vector<std::string> names = {"allreduce", "broadcast", "allgather", "barrier"};
  const std::vector<uint64_t> bytes = {kCount * 4, 10 * 4, kSize * 1000 * 8, 0};
  for (int rank = 0; rank < kSize; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const json file = load(rank);
    const json& meta = file["railshard"];
    EXPECT_EQ(meta["version"], 1);
    EXPECT_EQ(meta["rank"], rank);
    EXPECT_EQ(meta["world_size"], kSize);
    EXPECT_EQ(meta["clock"]["aligned"], "store");
    // One process: the same steady clock, so the measured offset is within its uncertainty.
    EXPECT_LE(std::abs(meta["clock"]["offset_us"].get<double>()),
              meta["clock"]["uncertainty_us"].get<double>() + 1.0);
    EXPECT_EQ(meta["dropped_events"], 0);

    const auto collectives = eventsOf(file, "collective");
    ASSERT_EQ(collectives.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const json& e = collectives[i];
      EXPECT_EQ(e["ph"], "X");
      EXPECT_EQ(e["pid"], rank);
      EXPECT_EQ(e["tid"], 0);
      EXPECT_EQ(e["name"], names[i]);
      EXPECT_EQ(e["args"]["seq"], i);
      EXPECT_EQ(e["args"]["bytes"], bytes[i]);
      EXPECT_EQ(e["args"]["size"], kSize);
      EXPECT_FALSE(e["args"].contains("failed"));
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      // Collectives follow each other on the calling thread's track.
      if (i > 0) {
        EXPECT_GE(e["ts"].get<double>(), collectives[i - 1]["ts"].get<double>() +
                                             collectives[i - 1]["dur"].get<double>() - 0.002);
      }
    }
    EXPECT_EQ(collectives[0]["args"]["algorithm"], "ring");
    EXPECT_EQ(collectives[0]["args"]["dtype"], "float");
    EXPECT_EQ(collectives[0]["args"]["op"], "sum");
    EXPECT_EQ(collectives[0]["args"]["count"], kCount);
    EXPECT_EQ(collectives[1]["args"]["root"], 2);

    // The ring all-reduce's two phases lie inside it; its reductions inside those.
    const auto phases = eventsOf(file, "phase");
    const double ar_begin = collectives[0]["ts"].get<double>();
    const double ar_end = ar_begin + collectives[0]["dur"].get<double>();
    std::set<std::string> ar_phases;
    for (const auto& p : phases) {
      if (p["args"]["seq"] != 0) continue;
      ar_phases.insert(p["name"].get<std::string>());
      EXPECT_GE(p["ts"].get<double>(), ar_begin - 0.002);
      EXPECT_LE(p["ts"].get<double>() + p["dur"].get<double>(), ar_end + 0.002);
    }
    EXPECT_EQ(ar_phases, (std::set<std::string>{"reduce_scatter", "all_gather"}));
    uint64_t reduced = 0;
    for (const auto& r : eventsOf(file, "reduce")) {
      if (r["ts"].get<double>() >= ar_begin && r["ts"].get<double>() <= ar_end) {
        reduced += r["args"]["bytes"].get<uint64_t>();
      }
    }
    // Reduce-scatter folds n-1 of the n segments into this rank's partial sums: (n-1)/n of
    // the buffer (segments differ by at most one element).
    EXPECT_NEAR(static_cast<double>(reduced), kCount * 4.0 * (kSize - 1) / kSize, 4.0 * kSize);

    // Every wait names a peer that is the ring neighbour.
    for (const auto& w : eventsOf(file, "wait")) {
      const int peer = w["args"]["peer"];
      EXPECT_NE(peer, rank);
      EXPECT_GE(peer, 0);
      EXPECT_LT(peer, kSize);
    }
    // Transfers: async begin/end pairs; bytes sent over them equal the rail events' bytes and
    // the transport's own count of payload handed to its connections.
    uint64_t transfer_sent = 0;
    std::map<uint64_t, int> open;
    for (const auto& e : file["traceEvents"]) {
      if (e.value("cat", "") != "transfer") continue;
      if (e["ph"] == "b") {
        ++open[e["id"].get<uint64_t>()];
        if (e["name"] == "send") transfer_sent += e["args"]["bytes"].get<uint64_t>();
      } else {
        EXPECT_EQ(e["ph"], "e");
        --open[e["id"].get<uint64_t>()];
      }
    }
    for (const auto& [id, n] : open) EXPECT_EQ(n, 0) << "transfer " << id;
    uint64_t rail_bytes = 0;
    for (const auto& e : eventsOf(file, "rail")) rail_bytes += e["args"]["bytes"].get<uint64_t>();
    uint64_t status_bytes = 0;
    for (const auto& r : meta["rails"]) status_bytes += r["bytes_sent"].get<uint64_t>();
    EXPECT_GT(transfer_sent, kCount * 4 * 2 * (kSize - 1) / kSize - 100);
    EXPECT_EQ(rail_bytes, transfer_sent);
    EXPECT_EQ(status_bytes, transfer_sent);
  }
}

// The cluster graph of tests/fixtures/two_rail_pair.json moved onto loopback addresses
// (127.0.1.0/24 and 127.0.2.0/24 are local on Linux), one rank per host: two real rails.
std::shared_ptr<topology::Topology> loopbackPair() {
  std::string text =
      readFile(std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/two_rail_pair.json");
  auto replaceAll = [&](const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  };
  replaceAll("10.1.0.", "127.0.1.");
  replaceAll("10.2.0.", "127.0.2.");
  json graph = json::parse(text);
  graph["ranks"] =
      json::array({{{"rank", 0}, {"host", "alpha"}, {"local_rank", 0}, {"numa", "alpha/numa0"}},
                   {{"rank", 1}, {"host", "beta"}, {"local_rank", 0}, {"numa", "beta/numa0"}}});
  return std::make_shared<topology::Topology>(
      topology::Topology::fromJson(graph.dump(), "loopback pair"));
}

TEST_F(TraceTest, RailTracksCarryEveryByteSentAndTheLinkLimitComesFromTheGraph) {
  const auto graph = loopbackPair();
  ASSERT_EQ(graph->rails("alpha", "beta").size(), 2u);
  constexpr size_t kCount = 1 << 20;  // 4 MiB: striped over both rails
  MemoryStore store;
  std::vector<uint64_t> sent(2);
  test::rethrowFirst(test::runRanks(2, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = 2;
    options.config = traceConfig(dir_);
    options.topology = graph;
    options.advertise_host = "127.0.0.1";
    auto comm = Communicator::create(store, options);
    std::vector<float> data(kCount, 1.0f);
    for (int i = 0; i < 3; ++i) {
      comm->allreduce(data.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    }
    EXPECT_EQ(data[12345], 8.0f);
    for (const auto& rail : comm->transport().rails())
      sent[static_cast<size_t>(rank)] += rail.bytes_sent;
  }));
  trace::flush();
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const json file = load(rank);
    const json& meta = file["railshard"];
    ASSERT_EQ(meta["rails"].size(), 2u);
    // eth0 25 Gbit/s + eth1 9.41 Gbit/s measured (the fixture's probe result).
    EXPECT_NEAR(meta["link_limit"]["gbps"].get<double>(), 25.0 + 9.41, 1e-9);
    EXPECT_NE(meta["topology"], nullptr);
    // One named track per rail, and bytes per rail equal to what each rail reports it carried.
    std::map<int, std::string> track_names;
    for (const auto& e : file["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name") track_names[e["tid"]] = e["args"]["name"];
    }
    std::map<std::string, uint64_t> by_rail;
    std::map<int, double> last_end;
    uint64_t total = 0;
    for (const auto& e : eventsOf(file, "rail")) {
      const int tid = e["tid"];
      ASSERT_TRUE(track_names.count(tid)) << tid;
      EXPECT_EQ(track_names[tid],
                e["args"]["rail"].get<std::string>() + " to rank " + std::to_string(1 - rank));
      by_rail[e["args"]["rail"]] += e["args"]["bytes"].get<uint64_t>();
      total += e["args"]["bytes"].get<uint64_t>();
      // A connection writes one piece after another: the track's events do not overlap.
      const double begin = e["ts"].get<double>();
      if (last_end.count(tid)) {
        EXPECT_GE(begin, last_end[tid] - 0.002);
      }
      last_end[tid] = begin + e["dur"].get<double>();
    }
    // (How the scheduler split them is its business: a rank may even have sent everything on
    // one rail when the other's estimate lagged; multirail_test covers the split.)
    for (const auto& rail : meta["rails"]) {
      EXPECT_EQ(by_rail[rail["name"]], rail["bytes_sent"].get<uint64_t>()) << rail["name"];
    }
    EXPECT_LE(by_rail.size(), 2u);
    // Ring all-reduce of two ranks: each sends half the buffer twice (reduce-scatter and
    // all-gather), three times.
    EXPECT_EQ(total, 3u * 2u * (kCount * 4 / 2));
    EXPECT_EQ(total, sent[static_cast<size_t>(rank)]);
  }
}

TEST_F(TraceTest, BufferKeepsTheNewestEventsAndCountsTheDropped) {
  trace::enable(dir_, 100);
  trace::setRankInfo(0, trace::RankInfo{});
  for (int i = 0; i < 250; ++i) {
    trace::Event e;
    e.category = trace::Category::kCollective;
    e.name = "allreduce";
    e.rank = 0;
    e.seq = static_cast<uint64_t>(i);
    e.begin_ns = 1000 * i;
    e.end_ns = 1000 * i + 500;
    trace::record(e);
  }
  trace::flush();
  const json file = load(0);
  EXPECT_EQ(file["railshard"]["dropped_events"], 150);
  const auto collectives = eventsOf(file, "collective");
  ASSERT_EQ(collectives.size(), 100u);
  for (size_t i = 0; i < collectives.size(); ++i) {
    EXPECT_EQ(collectives[i]["args"]["seq"], 150 + i);  // oldest first
  }
}

TEST_F(TraceTest, OffWhenNotAskedAndZeroCapacityIsRefused) {
  EXPECT_FALSE(trace::enabled());
  trace::Event e;
  e.rank = 0;
  trace::record(e);  // ignored
  EXPECT_TRUE(trace::flush().empty());
  try {
    trace::enable(dir_, 0);
    FAIL() << "no error";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("RAILSHARD_TRACE_EVENTS"), std::string::npos);
  }
}

TEST(TraceConfig, VariablesAreParsedAndCheckedByName) {
  const std::map<std::string, std::string> env = {{"RAILSHARD_TRACE", "/tmp/x"},
                                                  {"RAILSHARD_TRACE_EVENTS", "1000"}};
  const Config config = Config::fromEnvironment(&env);
  EXPECT_EQ(config.trace_dir, "/tmp/x");
  EXPECT_EQ(config.trace_events, 1000u);
  const std::map<std::string, std::string> bad = {{"RAILSHARD_TRACE_EVENTS", "0"}};
  try {
    Config::fromEnvironment(&bad);
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("RAILSHARD_TRACE_EVENTS"), std::string::npos);
  }
}

#ifdef RAILSHARD_ALLREDUCE_PERF_BIN
// The whole path as a user takes it: railshard-launch --trace runs real processes (shared
// memory; then TCP), merges their files into one, and railshard-report reads the directory.
TEST_F(TraceTest, LaunchMergesEveryRanksFileIntoOneJobTrace) {
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    std::filesystem::remove_all(dir_);
    const auto run = test::runProcess(
        {RAILSHARD_LAUNCH_BIN, "-n", "3", "--trace", dir_, RAILSHARD_ALLREDUCE_PERF_BIN, "-b", "1K",
         "-e", "256K", "-f", "4", "-n", "3", "-w", "1"},
        {{"RAILSHARD_TRANSPORT", transport}});
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.err.find("trace of 3 ranks"), std::string::npos) << run.err;
    const json merged = json::parse(readFile(dir_ + "/railshard-trace.json"));
    ASSERT_EQ(merged["railshard"]["ranks"].size(), 3u);
    std::set<int> pids;
    std::map<std::pair<int, int>, double> last_begin;
    std::map<int, int> collectives;
    for (const auto& e : merged["traceEvents"]) {
      pids.insert(e["pid"].get<int>());
      if (e["ph"] != "X") continue;
      if (e["cat"] == "collective") ++collectives[e["pid"]];
      if (e["cat"] != "collective" && e["cat"] != "rail") continue;
      // Collectives on a rank's track, and pieces on a rail's, follow each other in time.
      const std::pair<int, int> key{e["pid"], e["tid"]};
      const double begin = e["ts"];
      if (last_begin.count(key)) {
        EXPECT_GE(begin, last_begin[key]) << e.dump();
      }
      last_begin[key] = begin;
    }
    EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));
    // Warm-up and timed iterations of 5 sizes, out-of-place and in-place, plus barriers:
    // the same number on every rank.
    ASSERT_EQ(collectives.size(), 3u);
    EXPECT_GE(collectives[0], 5 * 2 * 4);
    EXPECT_EQ(collectives[1], collectives[0]);
    EXPECT_EQ(collectives[2], collectives[0]);

    const auto report = test::runProcess({RAILSHARD_REPORT_BIN, dir_, "--link-gbps", "100"});
    ASSERT_EQ(report.exit_code, 0) << report.out << report.err;
    EXPECT_NE(report.out.find("efficiency"), std::string::npos) << report.out;
    EXPECT_NE(report.out.find("3 of 3 ranks"), std::string::npos) << report.out;
  }
}
#endif

// tests/fixtures/two_rail_pair.json: hosts alpha and beta, two ranks each, joined by eth0
// (25 Gbit/s nominal) and eth1 (10 nominal, 9.41 measured). The ring 0 -> 1 -> 2 -> 3 -> 0
// crosses hosts at 1 -> 2 and 3 -> 0, each over both rails: 25 + 9.41 = 34.41 Gbit/s; the
// same-host hops (shared memory, speed unknown) do not limit.
TEST(LinkLimit, RingOverTwoHostsIsTheSumOfTheRailsAtItsCrossings) {
  const auto graph = topology::Topology::fromJson(
      readFile(std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/two_rail_pair.json"),
      "fixture");
  const auto limit = tracing::ringLimit(graph);
  EXPECT_NEAR(limit.gbps, 34.41, 1e-9);
  EXPECT_EQ(limit.from, 1);
  EXPECT_EQ(limit.to, 2);
  EXPECT_NE(limit.description.find("2 rails, 25 + 9.41 Gbit/s"), std::string::npos)
      << limit.description;
  // Ranks 0 and 1 alone: one host, no known speed.
  const auto inside = tracing::ringLimit(graph, {0, 1});
  EXPECT_EQ(inside.gbps, 0);
  EXPECT_NE(inside.description.find("same host"), std::string::npos) << inside.description;
  // A ring 0 -> 2 -> 1 -> 3 crosses four times; still the rails' sum.
  EXPECT_NEAR(tracing::ringLimit(graph, {0, 2, 1, 3}).gbps, 34.41, 1e-9);
  try {
    tracing::ringLimit(graph, {0});
    FAIL() << "no error";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("at least two ranks"), std::string::npos);
  }
}

}  // namespace
}  // namespace railshard
