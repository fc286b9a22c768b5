// RAILSHARD_METRICS wired into the Communicator: two ranks on threads over real TCP, a known
// number of collectives, then the Prometheus text the registry renders and the file the
// exporter keeps.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "base/metrics.h"
#include "core/communicator.h"
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard {
namespace {

// "name{labels}" -> value for every sample line of Prometheus text.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(CommunicatorMetrics, CollectivesBytesRailsAndErrorsAreCountedPerRank) {
  metrics::reset();
  const std::string path = test::tempPath("metrics_rank{rank}.prom");
  MemoryStore store;
  auto errors = test::runRanks(2, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = 2;
    options.config.transport = TransportKind::kTcp;
    options.config.timeout = std::chrono::seconds(30);
    options.config.metrics_path = path;
    options.config.metrics_interval = std::chrono::milliseconds(50);
    auto comm = Communicator::create(store, options);
    std::vector<float> data(1000, 1.0f);
    for (int i = 0; i < 5; ++i)
      comm->allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    comm->barrier();
    // Rails are read from the transport at each scrape: equal to its own count while this
    // rank sends nothing more.
    uint64_t sent = 0;
    for (const auto& rail : comm->transport().rails()) sent += rail.bytes_sent;
    const auto scraped = samples(metrics::renderPrometheus());
    const std::string key = "railshard_rail_bytes_total{peer=\"" + std::to_string(1 - rank) +
                            "\",rail=\"tcp\",rank=\"" + std::to_string(rank) + "\"}";
    ASSERT_TRUE(scraped.count(key)) << key;
    EXPECT_EQ(scraped.at(key), static_cast<double>(sent));
    EXPECT_GE(sent, 5u * 4000u / 2u * 2u);  // ring of two: half the buffer, twice, per call
    EXPECT_EQ(scraped.at("railshard_rail_up{peer=\"" + std::to_string(1 - rank) +
                         "\",rail=\"tcp\",rank=\"" + std::to_string(rank) + "\"}"),
              1);
    // A rail never taken out: its outage counter is there from the first scrape, at 0.
    EXPECT_EQ(scraped.at("railshard_rail_outages_total{peer=\"" + std::to_string(1 - rank) +
                         "\",rail=\"tcp\",rank=\"" + std::to_string(rank) + "\"}"),
              0);
    // Different counts on the two ranks: a MismatchError on both, counted as such.
    std::vector<float> odd(rank == 0 ? 10 : 20);
    try {
      comm->allreduce(odd.data(), odd.size(), DataType::kFloat32, ReduceOp::kSum);
    } catch (const MismatchError&) {
    }
  });
  test::rethrowFirst(errors);
  const auto got = samples(metrics::renderPrometheus());
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    const std::string r = "rank=\"" + std::to_string(rank) + "\"";
    double allreduces = 0;
    for (const auto& [key, value] : got) {
      if (key.rfind("railshard_collectives_total{", 0) == 0 && key.find(r) != std::string::npos &&
          key.find("collective=\"allreduce\"") != std::string::npos) {
        allreduces += value;
      }
    }
    EXPECT_EQ(allreduces, 5);
    EXPECT_EQ(
        got.at("railshard_collectives_total{algorithm=\"dissemination\",collective=\"barrier\"," +
               r + "}"),
        1);
    EXPECT_EQ(got.at("railshard_collective_bytes_total{collective=\"allreduce\"," + r + "}"),
              5 * 4000);
    EXPECT_GT(got.at("railshard_collective_seconds_total{collective=\"allreduce\"," + r + "}"), 0);
    // One failed collective each: a MismatchError (rarely a PeerLostError, when the peer's
    // abort closes the connection before its explanation arrives).
    double failures = 0;
    for (const auto& [key, value] : got) {
      if (key.rfind("railshard_errors_total{", 0) == 0 && key.find(r) != std::string::npos) {
        failures += value;
      }
    }
    EXPECT_EQ(failures, 1);
  }
  EXPECT_TRUE(got.count("railshard_errors_total{kind=\"mismatch\",rank=\"0\"}") ||
              got.count("railshard_errors_total{kind=\"mismatch\",rank=\"1\"}"));
  // The exporter (started by whichever rank came first, "{rank}" replaced) keeps the file.
  const std::string file0 = test::tempPath("metrics_rank0.prom");
  const std::string file1 = test::tempPath("metrics_rank1.prom");
  std::string text;
  for (int i = 0; i < 100 && text.find("railshard_errors_total") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& file : {file0, file1}) {
      std::ifstream in(file);
      std::stringstream content;
      content << in.rdbuf();
      if (!content.str().empty()) text = content.str();
    }
  }
  EXPECT_NE(text.find("# TYPE railshard_collectives_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("railshard_errors_total"), std::string::npos) << text;
}

}  // namespace
}  // namespace railshard
