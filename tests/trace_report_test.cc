// railshard-report and the trace merge, checked against tests/fixtures/trace (written by
// make_trace_fixtures.py; README.md there lists what each collective was made to look like).
//
// The fixture: four hosts node-a..node-d, one rank each; every pair of hosts shares a
// 2 Gbit/s rail (rail0) and a 0.5 Gbit/s rail (rail1), so every ring hop, and the ring, is
// limited to 2 + 0.5 = 2.5 Gbit/s. Seven collectives, generation 0, seq 0..6:
//
//   seq  collective  bytes    entry offsets r0..r3 (us)  durations r0..r3 (us)
//   0    allreduce   1048576  0, 50, 300, 100            6075, 6025, 5775, 5975       median 6000
//   1    allreduce   1048576  0, 100, 300, 50            6366.456, 6266.456, 6066.456, 6316.456
//                                                                               median 6291.456
//   2    allreduce   1048576  100, 0, 50, 300            6557.912, 6657.912, 6607.912, 6357.912
//                                                                               median 6582.912
//   3    allgather   4194304  0, 0, 0, 400               16777.216 x 3, 16377.216 median 16777.216
//   4    barrier     0        20, 0, 0, 0                80, 100, 100, 100        median 100
//   5,6  allreduce   65536    0, 0, 0, 0                 1000 each                median 1000
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "base/error.h"
#include "core/tracing/trace_file.h"
#include "core/tracing/trace_merge.h"
#include "launcher/tools/report/report_analysis.h"
#include "launcher/tools/report/report_html.h"
#include "launcher/tools/report/report_json.h"
#include "launcher/tools/report/report_text.h"
#include "launcher/tools/report/svg_plot.h"
#include "tests/test_util.h"

namespace railshard::report {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
// Reading and merging trace files is the library's (core/tracing); the report is the tool's.
using tracing::MergeResult;
using tracing::mergeTraces;
using tracing::parseTrace;
using tracing::rankFileName;
using tracing::readTraceDir;
using tracing::writeMergedTrace;

const std::string kFixtures = std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/trace";

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// A fresh copy of the fixture's rank files in a directory of this test's own.
std::string copyFixtures(const std::string& name) {
  const std::string dir = test::tempPath(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int rank = 0; rank < 4; ++rank) {
    fs::copy_file(kFixtures + "/" + rankFileName(rank), dir + "/" + rankFileName(rank));
  }
  return dir;
}

const SizeRow& sizeRow(const Report& report, const std::string& collective, uint64_t size) {
  for (const auto& row : report.sizes) {
    if (row.collective == collective && row.size_class == size) return row;
  }
  ADD_FAILURE() << "no size row " << collective << " " << size;
  static const SizeRow kNone;
  return kNone;
}

Report fixtureReport(const ReportOptions& options = {}) {
  return analyse(readTraceDir(kFixtures), options);
}

TEST(TraceReport, ReadsEveryRankFileOfTheFixture) {
  const TraceSet set = readTraceDir(kFixtures);
  ASSERT_EQ(set.ranks.size(), 4u);
  EXPECT_EQ(set.world_size, 4);
  EXPECT_TRUE(set.warnings.empty());
  const RankTrace& r2 = set.ranks[2];
  EXPECT_EQ(r2.rank, 2);
  EXPECT_EQ(r2.host, "node-c");
  EXPECT_EQ(r2.clock.aligned, "store");
  EXPECT_DOUBLE_EQ(r2.clock.offset_us, 25.0);
  ASSERT_EQ(r2.collectives.size(), 7u);
  EXPECT_EQ(r2.collectives[3].name, "allgather");
  EXPECT_EQ(r2.collectives[3].bytes, 4194304u);
  EXPECT_EQ(r2.collectives[0].size, 4);
  EXPECT_DOUBLE_EQ(r2.collectives[0].dur, 5775.0);
  // 6 ring steps x 3 + 3 + 6 x 2 = 33 pieces per rail, two rails.
  EXPECT_EQ(r2.rail_events.size(), 66u);
  EXPECT_EQ(r2.phases.size(), 10u);  // reduce_scatter + all_gather per allreduce
  ASSERT_EQ(r2.rails.size(), 2u);
  EXPECT_EQ(r2.rails[0].peer, 3);
  EXPECT_DOUBLE_EQ(r2.rails[1].gbps, 0.5);
  ASSERT_TRUE(r2.topology.has_value());
  EXPECT_EQ(r2.topology->worldSize(), 4);
  EXPECT_DOUBLE_EQ(r2.link_limit_gbps, 2.5);
  EXPECT_TRUE(r2.dispatch.empty());
  EXPECT_EQ(set.ranks[0].dispatch.size(), 60u);  // 30 shares + 30 throughput samples
}

TEST(TraceReport, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor("allreduce", 4), 1.5);  // 2 (n-1) / n
  EXPECT_DOUBLE_EQ(busBandwidthFactor("allreduce", 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("reduce_scatter", 4), 0.75);  // (n-1) / n
  EXPECT_DOUBLE_EQ(busBandwidthFactor("allgather", 8), 0.875);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("broadcast", 4), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("barrier", 4), 0.0);  // no data, no busbw
  EXPECT_EQ(sizeClass(0), 0u);
  EXPECT_EQ(sizeClass(1048576), 1048576u);
  EXPECT_EQ(sizeClass(1048575), 524288u);
  EXPECT_EQ(sizeClass(1000000), 524288u);
}

TEST(TraceReport, EfficiencyMatchesTheHandWorkedValue) {
  const Report report = fixtureReport();
  // The ring 0 -> 1 -> 2 -> 3 -> 0 crosses hosts at every hop; each hop has rail0 + rail1 =
  // 2 + 0.5 Gbit/s, so the limit is 2.5 Gbit/s, from the topology embedded in rank 0's file.
  EXPECT_DOUBLE_EQ(report.limit.gbps, 2.5);
  EXPECT_NE(report.limit.source.find("topology"), std::string::npos);

  // 1 MiB allreduce, three of them. Per collective the median over the ranks' durations:
  // 6000, 6291.456 and 6582.912 us; the class time is their mean, 6291.456 us.
  //   algbw = 1048576 B / 6291.456 us = 166.667 MB/s = 0.1666667 GB/s
  //   busbw = algbw x 2 (4 - 1) / 4 = 0.1666667 x 1.5 = 0.25 GB/s
  //   efficiency = busbw x 8 / limit = 2.0 Gbit/s / 2.5 Gbit/s = 0.8
  const SizeRow& mib = sizeRow(report, "allreduce", 1048576);
  EXPECT_EQ(mib.count, 3);
  EXPECT_EQ(mib.ranks, 4);
  EXPECT_NEAR(mib.time_us, 6291.456, 1e-6);
  EXPECT_NEAR(mib.algbw_gbs, 1.0 / 6, 1e-9);
  EXPECT_TRUE(mib.has_busbw);
  EXPECT_NEAR(mib.busbw_gbs, 0.25, 1e-9);
  EXPECT_NEAR(mib.efficiency, 0.8, 1e-9);

  // 4 MiB allgather: durations 16777.216 x 3 and 16377.216 -> median 16777.216 us.
  //   algbw = 4194304 / 16777.216 us = 0.25 GB/s; busbw = 0.25 x 3/4 = 0.1875 GB/s;
  //   efficiency = 0.1875 x 8 / 2.5 = 0.6
  const SizeRow& gather = sizeRow(report, "allgather", 4194304);
  EXPECT_NEAR(gather.busbw_gbs, 0.1875, 1e-9);
  EXPECT_NEAR(gather.efficiency, 0.6, 1e-9);

  // 64 KiB allreduce: 65536 B / 1000 us = 0.065536 GB/s; x 1.5 = 0.098304 GB/s;
  // x 8 / 2.5 = 0.3145728.
  const SizeRow& small = sizeRow(report, "allreduce", 65536);
  EXPECT_EQ(small.count, 2);
  EXPECT_NEAR(small.busbw_gbs, 0.098304, 1e-12);
  EXPECT_NEAR(small.efficiency, 0.3145728, 1e-9);

  // A barrier moves nothing: no busbw, no efficiency.
  const SizeRow& barrier = sizeRow(report, "barrier", 0);
  EXPECT_FALSE(barrier.has_busbw);
  EXPECT_LT(barrier.efficiency, 0);
  EXPECT_NEAR(barrier.time_us, 100, 1e-9);
  // nccl-tests order: allreduce (by size), allgather, barrier.
  ASSERT_EQ(report.sizes.size(), 4u);
  EXPECT_EQ(report.sizes[0].size_class, 65536u);
  EXPECT_EQ(report.sizes[2].collective, "allgather");
  EXPECT_EQ(report.sizes[3].collective, "barrier");
}

TEST(TraceReport, LimitOverridesReplaceTheEmbeddedTopology) {
  ReportOptions gbps;
  gbps.link_gbps = 5;  // twice the topology's: half the efficiency
  const Report faster = fixtureReport(gbps);
  EXPECT_EQ(faster.limit.source, "--link-gbps");
  EXPECT_NEAR(sizeRow(faster, "allreduce", 1048576).efficiency, 0.4, 1e-9);

  // The same graph from a file gives the same answer; a graph whose rails have no speed none.
  ReportOptions file;
  file.topology = topology::Topology::fromJson(readText(kFixtures + "/topology.json"), "f");
  file.topology_source = "topology.json";
  const Report same = fixtureReport(file);
  EXPECT_EQ(same.limit.source, "--topology topology.json");
  EXPECT_NEAR(sizeRow(same, "allreduce", 1048576).efficiency, 0.8, 1e-9);

  Json graph = Json::parse(readText(kFixtures + "/topology.json"));
  for (auto& v : graph["vertices"]) v.erase("speed_gbps");
  for (auto& l : graph["links"]) {
    if (l["kind"] == "ethernet") l.erase("nominal_gbps");
  }
  ReportOptions unknown;
  unknown.topology = topology::Topology::fromJson(graph.dump(), "unknown");
  const Report none = fixtureReport(unknown);
  EXPECT_EQ(none.limit.gbps, 0);
  EXPECT_LT(sizeRow(none, "allreduce", 1048576).efficiency, 0);
  EXPECT_NE(renderText(none).find("link limit: unknown"), std::string::npos);
}

// A graph that knows no speed (one host of CPU ranks) and a rank that recorded the copy rate
// it measured as its link_limit: the report takes the recorded figure; without it, none.
TEST(TraceReport, RecordedLimitStandsInWhenTheEmbeddedGraphKnowsNoSpeed) {
  const std::string dir = copyFixtures("report_recorded_limit");
  for (int rank = 0; rank < 4; ++rank) {
    const std::string path = dir + "/" + rankFileName(rank);
    Json file = Json::parse(readText(path));
    auto& graph = file["railshard"]["topology"];
    for (auto& v : graph["vertices"]) v.erase("speed_gbps");
    for (auto& l : graph["links"]) {
      if (l["kind"] == "ethernet") l.erase("nominal_gbps");
    }
    file["railshard"]["link_limit"] = {
        {"gbps", rank == 2 ? 20.0 : 0.0},
        {"description", "shared memory, 20 Gbit/s copy rate measured at start-up"}};
    writeText(path, file.dump());
  }
  const Report recorded = analyse(readTraceDir(dir), {});
  EXPECT_DOUBLE_EQ(recorded.limit.gbps, 20.0);
  EXPECT_EQ(recorded.limit.source, "link_limit in rank 2's trace");
  EXPECT_NE(recorded.limit.description.find("shared memory"), std::string::npos);
  // 2.5 Gbit/s gave 0.8 at 1 MiB: the same busbw against 20 Gbit/s.
  EXPECT_NEAR(sizeRow(recorded, "allreduce", 1048576).efficiency, 0.8 * 2.5 / 20, 1e-9);

  const std::string path = dir + "/" + rankFileName(2);
  Json file = Json::parse(readText(path));
  file["railshard"]["link_limit"]["gbps"] = 0.0;
  writeText(path, file.dump());
  const Report none = analyse(readTraceDir(dir), {});
  EXPECT_EQ(none.limit.gbps, 0);
  EXPECT_NE(none.limit.source.find("topology"), std::string::npos) << none.limit.source;
}

TEST(TraceReport, SlowestRankAndWhatTheOthersWaited) {
  const Report report = fixtureReport();
  ASSERT_EQ(report.collectives.size(), 7u);
  // seq 0: rank 2 entered last, 300 us after rank 0, 250 after rank 1, 200 after rank 3.
  EXPECT_EQ(report.collectives[0].last_rank, 2);
  EXPECT_NEAR(report.collectives[0].others_waited_us, 300 + 250 + 200, 1e-6);
  EXPECT_NEAR(report.collectives[0].spread_us, 300, 1e-6);
  EXPECT_EQ(report.collectives[2].last_rank, 3);
  EXPECT_EQ(report.collectives[3].last_rank, 3);
  EXPECT_NEAR(report.collectives[3].others_waited_us, 3 * 400, 1e-6);
  EXPECT_EQ(report.collectives[4].last_rank, 0);   // the barrier: rank 0, 20 us late
  EXPECT_EQ(report.collectives[5].last_rank, -1);  // all entered together: nobody was last

  // Times last: rank 2 (seq 0, 1), rank 3 (seq 2, 3), rank 0 (seq 4). The others waited
  // 750 + 750 = 1500 us for rank 2, 750 + 1200 = 1950 us for rank 3, 3 x 20 = 60 us for rank 0.
  ASSERT_EQ(report.slowest.size(), 3u);
  const auto& first = report.ranks[report.slowest[0]];
  const auto& second = report.ranks[report.slowest[1]];
  const auto& third = report.ranks[report.slowest[2]];
  EXPECT_EQ(first.rank, 3);  // ties on times last go to the larger wait
  EXPECT_EQ(first.times_last, 2);
  EXPECT_NEAR(first.others_waited_us, 1950, 1e-6);
  EXPECT_EQ(second.rank, 2);
  EXPECT_NEAR(second.others_waited_us, 1500, 1e-6);
  EXPECT_EQ(third.rank, 0);
  EXPECT_NEAR(third.others_waited_us, 60, 1e-6);

  // Each rank's own wait for the last one, summed over seq 0..4 (5, 6 had no spread):
  //   r0: 300 + 300 + 200 + 400 + 0 = 1200     r1: 250 + 200 + 300 + 400 + 20 = 1170
  //   r2: 0 + 0 + 250 + 400 + 20 = 670         r3: 200 + 250 + 0 + 0 + 20 = 470
  // (together 3510 = 1500 + 1950 + 60, what the slowest ranks made the others wait).
  ASSERT_EQ(report.ranks.size(), 4u);
  EXPECT_NEAR(report.ranks[0].waited_us, 1200, 1e-6);
  EXPECT_NEAR(report.ranks[1].waited_us, 1170, 1e-6);
  EXPECT_NEAR(report.ranks[2].waited_us, 670, 1e-6);
  EXPECT_NEAR(report.ranks[3].waited_us, 470, 1e-6);
  EXPECT_EQ(report.ranks[1].host, "node-b");
  EXPECT_EQ(report.ranks[1].collectives, 7);
}

TEST(TraceReport, PerRailBytesBusyTimeAndUtilisation) {
  const Report report = fixtureReport();
  ASSERT_EQ(report.rails.size(), 8u);  // four ranks x (rail0, rail1) to the next rank
  // Each rank sends every ring step a 262144 B (1 MiB / 4) piece split 209715 + 52429,
  // 6 steps x 3 allreduces; 3 steps of 1048576 B = 838861 + 209715 for the allgather; and
  // 6 steps x 2 of 16384 B = 13107 + 3277 for the small allreduces:
  //   rail0: 18 x 209715 + 3 x 838861 + 12 x 13107 = 3774870 + 2516583 + 157284 = 6448737
  //   rail1: 18 x 52429 + 3 x 209715 + 12 x 3277 = 943722 + 629145 + 39324 = 1612191
  // (6448737 + 1612191 = 8060928 = 3 x 1.5 x 1 MiB + 0.75 x 4 MiB + 2 x 1.5 x 64 KiB).
  for (int rank = 0; rank < 4; ++rank) {
    const RailRow& rail0 = report.rails[2 * rank];
    const RailRow& rail1 = report.rails[2 * rank + 1];
    EXPECT_EQ(rail0.rank, rank);
    EXPECT_EQ(rail0.peer, (rank + 1) % 4);
    EXPECT_EQ(rail0.rail, "rail0");
    EXPECT_EQ(rail0.bytes, 6448737u);
    EXPECT_EQ(rail0.bytes_sent, 6448737u);
    EXPECT_EQ(rail0.pieces, 33);
    EXPECT_EQ(rail1.rail, "rail1");
    EXPECT_EQ(rail1.bytes, 1612191u);
    EXPECT_NEAR(rail0.share, 6448737.0 / 8060928, 1e-12);
    // Pieces were written at the rail's speed, so busy throughput is the rail's (up to the
    // ns rounding of dur).
    EXPECT_NEAR(rail0.busy_gbps, 2.0, 1e-4);
    EXPECT_NEAR(rail1.busy_gbps, 0.5, 1e-4);
    // busy = bytes x 8 / speed: 6448737 x 8 / 2e3 = 25794.948 us.
    EXPECT_NEAR(rail0.busy_us, 25794.948, 0.05);
    // The trace spans from rank 0's first collective at 1000 us to the last one's end at
    // 41976.584 us: 40976.584 us. utilisation = 6448737 x 8 / (2 Gbit/s x 40976.584 us).
    EXPECT_NEAR(report.spanUs(), 40976.584, 1e-6);
    EXPECT_NEAR(rail0.utilisation, 6448737.0 * 8 / (2e3 * 40976.584), 1e-12);
  }
  EXPECT_TRUE(report.warnings.empty()) << report.warnings.front();
}

TEST(TraceReport, DispatcherSharesAreSubsampled) {
  const Report report = fixtureReport();
  EXPECT_EQ(report.dispatch_rank, 0);
  EXPECT_EQ(report.dispatch_samples, 30);
  ASSERT_EQ(report.dispatch.size(), 20u);
  EXPECT_EQ(report.dispatch.front().sample, 0);
  EXPECT_EQ(report.dispatch.back().sample, 29);  // first and last plans always shown
  EXPECT_DOUBLE_EQ(report.dispatch.back().shares.at(0), 64 + 2 * 29);
  EXPECT_DOUBLE_EQ(report.dispatch.back().shares.at(1), 64 - 2 * 29);
  EXPECT_NEAR(report.dispatch.back().t_us, 29000, 1e-9);
  for (size_t i = 1; i < report.dispatch.size(); ++i) {
    EXPECT_GT(report.dispatch[i].sample, report.dispatch[i - 1].sample);
  }
}

TEST(TraceReport, RailTimelineAddsUpToTheBytes) {
  const Report report = fixtureReport();
  const RailTimeline& line = report.timeline;
  ASSERT_EQ(line.series.size(), 8u);
  ASSERT_EQ(line.series[0].gbps.size(), 50u);
  EXPECT_EQ(line.series[0].label, "rank 0 rail0 to 1");
  // Gbit/s x bin width gives back the bits: the bins hold all of the rail's bytes.
  double bits = 0;
  for (double gbps : line.series[0].gbps) bits += gbps * line.bin_us * 1e3;
  EXPECT_NEAR(bits, 6448737.0 * 8, 1);
  for (double gbps : line.series[0].gbps) EXPECT_LE(gbps, 2.0 + 1e-6);
}

TEST(TraceReport, TextReportHasTheEfficiencyColumn) {
  const std::string text = renderText(fixtureReport());
  EXPECT_NE(text.find("efficiency"), std::string::npos) << text;
  EXPECT_NE(text.find("80.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("60.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("31.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("link limit: 2.500 Gbit/s"), std::string::npos) << text;
  EXPECT_NE(text.find("6448737"), std::string::npos) << text;
  EXPECT_NE(text.find("Dispatcher shares"), std::string::npos) << text;
}

TEST(TraceReport, JsonAndHtmlRenderings) {
  const Report report = fixtureReport();
  const Json json = Json::parse(renderJson(report));
  ASSERT_EQ(json["sizes"].size(), 4u);
  EXPECT_NEAR(json["sizes"][1]["efficiency"].get<double>(), 0.8, 1e-9);
  EXPECT_TRUE(json["sizes"][3]["efficiency"].is_null());  // barrier
  EXPECT_EQ(json["slowest"], Json::parse("[3, 2, 0]"));
  EXPECT_EQ(json["rails"][0]["bytes"], 6448737);
  EXPECT_EQ(json["dispatch"]["rows"].size(), 20u);

  const std::string html = renderHtml(report);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    ++svgs;
  }
  EXPECT_EQ(svgs, 3u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  // Nothing external: the only URLs are the SVG namespace names.
  size_t urls = 0;
  for (size_t at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1)) {
    ++urls;
  }
  EXPECT_EQ(urls, svgs);
  EXPECT_EQ(html.find("href"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_NE(html.find("link limit 2.500 Gbit/s = 0.312 GB/s"), std::string::npos);
  EXPECT_NE(html.find("efficiency"), std::string::npos);
  EXPECT_NE(html.find(">1M<"), std::string::npos);  // a log2 size tick
}

TEST(TraceReport, SvgHelpers) {
  EXPECT_EQ(niceTicks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(niceTicks(0, 0.27, 5), (std::vector<double>{0, 0.1, 0.2}));  // step >= 0.27 / 5
  EXPECT_EQ(niceTicks(0, 0.3, 3), (std::vector<double>{0, 0.1, 0.2, 0.3}));
  EXPECT_EQ(niceTicks(1.2, 7, 4), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(bytesLabel(65536), "64K");
  EXPECT_EQ(bytesLabel(1048576), "1M");
  EXPECT_EQ(escapeXml("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
  LineChart empty;
  EXPECT_NE(renderSvg(empty).find("no data"), std::string::npos);
  BarChart bars;
  bars.bars = {{"0", 1.0}, {"1", 2.5}};
  const std::string svg = renderSvg(bars);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("<rect x="), std::string::npos);
}

TEST(TraceReport, MalformedFilesAreConfigErrorsNamingTheFile) {
  const std::string dir = copyFixtures("malformed");
  const std::string bad = dir + "/" + rankFileName(1);
  const std::string good = readText(bad);
  writeText(bad, good.substr(0, good.size() / 2));  // a rank killed while writing
  try {
    readTraceDir(dir);
    FAIL() << "a truncated file was accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("railshard-trace-rank1.json"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("not valid JSON"), std::string::npos);
  }

  // A field of the wrong type: the message names the file, the event and the field.
  Json doc = Json::parse(good);
  for (auto& event : doc["traceEvents"]) {
    if (event.value("cat", "") == "rail") {
      event["args"]["bytes"] = "lots";
      break;
    }
  }
  writeText(bad, doc.dump());
  try {
    readTraceDir(dir);
    FAIL() << "a string byte count was accepted";
  } catch (const ConfigError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("railshard-trace-rank1.json"), std::string::npos) << what;
    EXPECT_NE(what.find("(rail send)"), std::string::npos) << what;
    EXPECT_NE(what.find("'bytes'"), std::string::npos) << what;
  }

  // The file name and the rank inside must agree.
  doc = Json::parse(good);
  doc["railshard"]["rank"] = 2;
  writeText(bad, doc.dump());
  EXPECT_THROW(readTraceDir(dir), ConfigError);

  // Missing metadata, unsupported version, a collective without seq.
  EXPECT_THROW(parseTrace(R"({"traceEvents": []})", "x.json"), ConfigError);
  EXPECT_THROW(parseTrace(R"({"traceEvents": [], "railshard": {"version": 2, "rank": 0,
                "world_size": 1}})",
                          "x.json"),
               ConfigError);
  try {
    parseTrace(R"({"traceEvents": [{"ph": "X", "cat": "collective", "name": "allreduce",
                  "ts": 1, "dur": 2, "args": {"bytes": 4}}],
                  "railshard": {"version": 1, "rank": 0, "world_size": 1}})",
               "x.json");
    FAIL();
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("x.json: traceEvents[0] (collective allreduce)"),
              std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("'seq'"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(TraceReport, MissingRanksAreWarningsAndAnEmptyDirectoryAnError) {
  const std::string dir = copyFixtures("missing");
  fs::remove(dir + "/" + rankFileName(2));
  const TraceSet set = readTraceDir(dir);
  EXPECT_EQ(set.ranks.size(), 3u);
  ASSERT_EQ(set.warnings.size(), 1u);
  EXPECT_NE(set.warnings[0].find("rank 2"), std::string::npos) << set.warnings[0];
  // With rank 2 gone, seq 0 and 1 have rank 3 / rank 1 last among those left.
  const Report report = analyse(set);
  EXPECT_EQ(report.collectives[0].last_rank, 3);
  EXPECT_EQ(report.collectives[0].ranks, 3);

  const std::string empty = test::tempPath("empty_trace");
  fs::remove_all(empty);
  fs::create_directories(empty);
  EXPECT_THROW(readTraceDir(empty), ConfigError);
  EXPECT_THROW(readTraceDir(empty + "/absent"), ConfigError);
  EXPECT_THROW(mergeTraces(empty), ConfigError);
  fs::remove_all(dir);
  fs::remove_all(empty);
}

TEST(TraceReport, MergeConcatenatesEveryRanksEventsUnchanged) {
  const std::string out = test::tempPath("merged.json");
  const MergeResult result = writeMergedTrace(kFixtures, out);
  EXPECT_EQ(result.ranks, 4);
  EXPECT_EQ(result.world_size, 4);
  EXPECT_TRUE(result.warnings.empty());
  const Json merged = Json::parse(readText(out));
  EXPECT_EQ(merged["displayTimeUnit"], "ns");

  // Every event of every rank file, in rank order, equal as JSON values (so ts and dur were
  // not shifted or rounded).
  Json expected = Json::array();
  Json rank0;
  for (int rank = 0; rank < 4; ++rank) {
    const Json file = Json::parse(readText(kFixtures + "/" + rankFileName(rank)));
    if (rank == 0) rank0 = file;
    for (const auto& event : file["traceEvents"]) expected.push_back(event);
  }
  EXPECT_EQ(expected.size(), 261u + 3 * 201u);
  EXPECT_EQ(result.events, expected.size());
  ASSERT_EQ(merged["traceEvents"].size(), expected.size());
  EXPECT_EQ(merged["traceEvents"], expected);

  const Json& meta = merged["railshard"];
  EXPECT_EQ(meta["version"], 1);
  ASSERT_EQ(meta["ranks"].size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(meta["ranks"][rank]["rank"], rank);
    EXPECT_FALSE(meta["ranks"][rank].contains("topology"));
    EXPECT_EQ(meta["ranks"][rank]["rails"].size(), 2u);
  }
  EXPECT_EQ(meta["topology"], rank0["railshard"]["topology"]);
  // The merged topology is a valid graph.
  EXPECT_EQ(topology::Topology::fromJson(meta["topology"].dump(), "merged").worldSize(), 4);
  fs::remove(out);
}

TEST(TraceReport, MergeSkipsMissingAndBrokenRanksWithWarnings) {
  const std::string dir = copyFixtures("merge_partial");
  fs::remove(dir + "/" + rankFileName(0));
  writeText(dir + "/" + rankFileName(3), "{\"traceEvents\": [");
  MergeResult result;
  const Json merged = Json::parse(mergeTraces(dir, &result));
  EXPECT_EQ(result.ranks, 2);
  EXPECT_EQ(merged["traceEvents"].size(), 2 * 201u);
  ASSERT_EQ(result.warnings.size(), 2u);
  EXPECT_NE(result.warnings[0].find("railshard-trace-rank3.json"), std::string::npos)
      << result.warnings[0];
  EXPECT_NE(result.warnings[1].find("rank 0, 3"), std::string::npos) << result.warnings[1];
  EXPECT_EQ(merged["railshard"]["warnings"].size(), 2u);
  // Rank 0 is gone: the topology comes from the lowest rank left.
  EXPECT_FALSE(merged["railshard"]["topology"].is_null());
  fs::remove_all(dir);
}

// ---- the railshard-report binary ----

TEST(TraceReport, ToolPrintsTheReportAndWritesHtmlJsonAndMerge) {
  const std::string html = test::tempPath("report.html");
  const std::string json = test::tempPath("report.json");
  const std::string merged = test::tempPath("tool_merged.json");
  const auto result = test::runProcess(
      {RAILSHARD_REPORT_BIN, kFixtures, "--html", html, "--json", json, "--merge", merged});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("efficiency"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("80.0%"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("merged 4 rank(s), 864 events"), std::string::npos) << result.out;
  const std::string page = readText(html);
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_NEAR(Json::parse(readText(json))["sizes"][1]["efficiency"].get<double>(), 0.8, 1e-9);
  EXPECT_EQ(Json::parse(readText(merged))["traceEvents"].size(), 864u);

  const auto faster = test::runProcess({RAILSHARD_REPORT_BIN, kFixtures, "--link-gbps", "5"});
  ASSERT_EQ(faster.exit_code, 0) << faster.err;
  EXPECT_NE(faster.out.find("40.0%"), std::string::npos) << faster.out;

  const auto file = test::runProcess(
      {RAILSHARD_REPORT_BIN, kFixtures, "--topology", kFixtures + "/topology.json"});
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_NE(file.out.find("80.0%"), std::string::npos) << file.out;
  fs::remove(html);
  fs::remove(json);
  fs::remove(merged);
}

TEST(TraceReport, ToolExitsTwoWithAOneLineReasonOnBadUsageOrInput) {
  const auto no_dir = test::runProcess({RAILSHARD_REPORT_BIN});
  EXPECT_EQ(no_dir.exit_code, 2);
  EXPECT_NE(no_dir.err.find("no trace directory"), std::string::npos) << no_dir.err;

  const auto bad_gbps = test::runProcess({RAILSHARD_REPORT_BIN, kFixtures, "--link-gbps", "x"});
  EXPECT_EQ(bad_gbps.exit_code, 2);
  EXPECT_NE(bad_gbps.err.find("--link-gbps"), std::string::npos) << bad_gbps.err;

  const auto unknown = test::runProcess({RAILSHARD_REPORT_BIN, kFixtures, "--frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);

  const auto absent = test::runProcess({RAILSHARD_REPORT_BIN, kFixtures + "/absent"});
  EXPECT_EQ(absent.exit_code, 2);
  EXPECT_NE(absent.err.find("absent"), std::string::npos) << absent.err;

  const std::string dir = copyFixtures("tool_malformed");
  writeText(dir + "/" + rankFileName(2), "[1, 2");
  const auto broken = test::runProcess({RAILSHARD_REPORT_BIN, dir});
  EXPECT_EQ(broken.exit_code, 2);
  EXPECT_NE(broken.err.find("railshard-trace-rank2.json"), std::string::npos) << broken.err;
  EXPECT_EQ(std::count(broken.err.begin(), broken.err.end(), '\n'), 1) << broken.err;

  const auto bad_topology =
      test::runProcess({RAILSHARD_REPORT_BIN, kFixtures, "--topology", dir + "/nope.json"});
  EXPECT_EQ(bad_topology.exit_code, 2);
  EXPECT_NE(bad_topology.err.find("nope.json"), std::string::npos);
  fs::remove_all(dir);

  const auto help = test::runProcess({RAILSHARD_REPORT_BIN, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: railshard-report"), std::string::npos);
}

}  // namespace
}  // namespace railshard::report
