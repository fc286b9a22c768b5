// RAILSHARD_METRICS (docs/tracing.md "Metrics"): what a Communicator counts for an operator
// to scrape — collectives, bytes and time per collective, errors by kind, and each rail's
// traffic, estimate and weight, read from the transport at every scrape.
#include <map>
#include <mutex>
#include <string>

#include "base/logging.h"
#include "base/metrics.h"
#include "base/metrics_http.h"
#include "core/collectives/host_layout.h"
#include "core/communicator.h"
#include "transport/transport.h"

namespace railshard {

namespace {

const char* errorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kGeneric:
      return "generic";
    case ErrorKind::kInvalidArgument:
      return "invalid_argument";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kPeerLost:
      return "peer_lost";
    case ErrorKind::kMismatch:
      return "mismatch";
    case ErrorKind::kConfig:
      return "config";
    case ErrorKind::kProtocol:
      return "protocol";
  }
  return "unknown";
}

void describeAll() {
  metrics::describe("railshard_collectives_total", "counter",
                    "Collectives completed, by collective and algorithm.");
  metrics::describe("railshard_collective_bytes_total", "counter",
                    "Bytes of the collectives completed (buffer size as nccl-tests counts it).");
  metrics::describe("railshard_collective_seconds_total", "counter",
                    "Time spent inside collectives.");
  metrics::describe("railshard_errors_total", "counter", "Collectives that failed, by error kind.");
  metrics::describe("railshard_rail_bytes_total", "counter",
                    "Payload bytes handed to each connection (rail) to each peer.");
  metrics::describe("railshard_rail_estimated_gbps", "gauge",
                    "The rail scheduler's current bandwidth estimate of each rail (Gbit/s).");
  metrics::describe("railshard_rail_weight", "gauge",
                    "Share of a large message each rail gets now (0 when down).");
  metrics::describe("railshard_rail_up", "gauge", "1 while the rail carries traffic, 0 when out.");
}

}  // namespace

void Communicator::setUpMetrics() {
  if (!config_.metricsOn()) return;
  metrics_ = true;
  static std::once_flag described;
  std::call_once(described, describeAll);
  // One exporter of each kind per process, started by its first communicator.
  static std::once_flag started;
  std::call_once(started, [&] {
    if (!config_.metrics_path.empty()) {
      std::string path = config_.metrics_path;
      const std::string marker = "{rank}";
      for (size_t at = path.find(marker); at != std::string::npos; at = path.find(marker)) {
        path.replace(at, marker.size(), std::to_string(worldRank()));
      }
      metrics::startFileExporter(path, config_.metrics_interval);
    }
    if (config_.metrics_port > 0) {
      // Ranks of one host share its ports: each takes the base plus its index on the host.
      const int local = layout_ ? layout_->local_rank_of[static_cast<size_t>(rank_)] : 0;
      const int port = metrics::startHttpExporter("0.0.0.0", config_.metrics_port + local);
      RS_LOG_INFO("rank {}: metrics at http://{}:{}/metrics", worldRank(),
                  advertise_host_.empty() ? "127.0.0.1" : advertise_host_, port);
    }
  });
  const std::string rank = std::to_string(worldRank());
  metrics_collector_ =
      metrics::addCollector([this, rank, last = std::map<std::string, uint64_t>()]() mutable {
        for (const auto& rail : transport_->rails()) {
          const metrics::Labels labels = {
              {"rank", rank}, {"peer", std::to_string(rail.peer)}, {"rail", rail.name}};
          // The transport counts totals; the registry's counter advances by what is new.
          const std::string key = std::to_string(rail.peer) + "/" + rail.name;
          const uint64_t before = last[key];
          if (rail.bytes_sent > before) {
            metrics::add("railshard_rail_bytes_total", labels,
                         static_cast<double>(rail.bytes_sent - before));
          }
          last[key] = rail.bytes_sent;
          metrics::set("railshard_rail_estimated_gbps", labels, rail.gbps);
          metrics::set("railshard_rail_weight", labels, rail.fraction);
          metrics::set("railshard_rail_up", labels, rail.up ? 1 : 0);
        }
      });
}

void Communicator::tearDownMetrics() {
  if (metrics_collector_ != 0) metrics::removeCollector(metrics_collector_);
  metrics_collector_ = 0;
}

void Communicator::countCollective(const char* collective, const char* algorithm, size_t bytes,
                                   double seconds) {
  const std::string rank = std::to_string(worldRank());
  metrics::add("railshard_collectives_total",
               {{"rank", rank}, {"collective", collective}, {"algorithm", algorithm}}, 1);
  metrics::add("railshard_collective_bytes_total", {{"rank", rank}, {"collective", collective}},
               static_cast<double>(bytes));
  metrics::add("railshard_collective_seconds_total", {{"rank", rank}, {"collective", collective}},
               seconds);
}

void Communicator::countError(const std::exception& error) {
  metrics::add("railshard_errors_total",
               {{"rank", std::to_string(worldRank())}, {"kind", errorKindName(kindOf(error))}}, 1);
}

}  // namespace railshard
