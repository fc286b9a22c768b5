// Trace files and Prometheus metrics of a communicator (docs/tracing.md): clock alignment at
// start-up, what each rank's trace file says about its rails, link limit and cluster graph, and
// what RAILSHARD_METRICS counts for an operator to scrape — collectives, bytes and time per
// collective, errors by kind, and each rail's traffic, estimate and weight, read from the links
// at every scrape.
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "base/metrics_http.h"
#include "base/trace.h"
#include "core/channels.h"
#include "core/diagnostics.h"
#include "core/membership.h"
#include "core/planner.h"
#include "core/topology/topology.h"
#include "core/tracing/clock_sync.h"

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
  metrics::describe("railshard_rail_outages_total", "counter",
                    "Times each rail was taken out (counts a flap between two scrapes).");
}

}  // namespace

void Diagnostics::setUpTracing(Store& store) {
  if (!config_.trace_dir.empty()) trace::enable(config_.trace_dir, config_.trace_events);
  if (!trace::enabled()) return;
  trace::RankInfo info;
  info.world_size = static_cast<int>(membership_.worldRanks().size());
  const int rank = membership_.rank();
  const int size = membership_.size();
  const topology::Topology* graph = membership_.topology();
  if (graph != nullptr && graph->worldSize() == size) info.host = graph->rank(rank).host;
  if (membership_.generation() == 0 && size > 1) {
    // Every rank of the first generation takes part, so the store rounds match up; a shrunk
    // communicator keeps the alignment its ranks already have.
    const auto aligned =
        tracing::alignClocks(store, membership_.keyPrefix(), rank, size,
                             std::chrono::duration_cast<Duration>(config_.connect_timeout));
    info.offset_ns = aligned.offset_ns;
    info.uncertainty_ns = aligned.uncertainty_ns;
    info.epoch_ns = aligned.epoch_ns;
    info.aligned = "store";
    RS_LOG_DEBUG("rank {}: trace clock offset {} ns (+-{} ns)", rank, aligned.offset_ns,
                 aligned.uncertainty_ns);
    trace::setRankInfo(membership_.worldRank(), info);
  } else if (size == 1) {
    info.epoch_ns = trace::now();
    trace::setRankInfo(membership_.worldRank(), info);
  }
  channels_.mesh().setTraceRank(membership_.worldRank());
  if (channels_.readProbeEvent()) {
    trace::Event probe = *channels_.readProbeEvent();
    probe.rank = membership_.worldRank();
    trace::record(probe);
  }
  trace_provider_ =
      trace::addMetadataProvider(membership_.worldRank(), [this] { return traceMetadata(); });
}

std::string Diagnostics::traceMetadata() const {
  nlohmann::json rails = nlohmann::json::array();
  for (const auto& rail : channels_.mesh().rails()) {
    rails.push_back({{"peer", rail.peer},
                     {"name", rail.name},
                     {"local", rail.local},
                     {"remote", rail.remote},
                     {"up", rail.up},
                     {"gbps", rail.gbps},
                     {"bytes_sent", rail.bytes_sent}});
  }
  const topology::Topology* graph = membership_.topology();
  std::string out = "\"rails\":" + rails.dump() +
                    ",\"generation\":" + std::to_string(membership_.generation()) +
                    ",\"algorithm\":\"" + std::string(planner_.last()) + "\"";
  if (graph != nullptr && membership_.size() > 1) {
    const auto limit = linkLimit();
    out += ",\n\"link_limit\":" + nlohmann::json{{"gbps", limit.gbps},
                                                 {"from", limit.from},
                                                 {"to", limit.to},
                                                 {"description", limit.description}}
                                      .dump();
  }
  out += ",\n\"topology\":" + (graph != nullptr ? graph->toJson() : std::string("null"));
  return out;
}

tracing::LinkLimit Diagnostics::linkLimit() const {
  tracing::LinkLimit limit;
  const topology::Topology* graph = membership_.topology();
  if (graph == nullptr) {
    limit.description = "the communicator has no cluster topology";
    return limit;
  }
  if (membership_.size() < 2) {
    limit.description = "one rank: no link is used";
    return limit;
  }
  try {
    limit = tracing::ringLimit(*graph, membership_.worldRanks());
  } catch (const Error& e) {
    limit.description = e.what();
    return limit;
  }
  // One host whose graph knows no speed between its ranks (CPU ranks: plain shared memory):
  // the copy rate measured at start-up is the limit, as a rail's speed is between hosts.
  if (limit.gbps <= 0 && channels_.oneHost() && channels_.measured().shm.beta_gbps > 0) {
    limit.gbps = channels_.measured().shm.beta_gbps * 8;
    char text[96];
    std::snprintf(text, sizeof(text), "shared memory, %.3g Gbit/s copy rate measured at start-up",
                  limit.gbps);
    limit.description = text;
  }
  return limit;
}

void Diagnostics::setUpMetrics() {
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
        path.replace(at, marker.size(), std::to_string(membership_.worldRank()));
      }
      metrics::startFileExporter(path, config_.metrics_interval);
    }
    if (config_.metrics_port > 0) {
      // Ranks of one host share its ports: each takes the base plus its index on the host.
      const collectives::HostLayout* layout = channels_.layout();
      const int local = layout ? layout->local_rank_of[static_cast<size_t>(membership_.rank())] : 0;
      const int port = metrics::startHttpExporter("0.0.0.0", config_.metrics_port + local);
      const std::string& host = membership_.advertiseHost();
      RS_LOG_INFO("rank {}: metrics at http://{}:{}/metrics", membership_.worldRank(),
                  host.empty() ? "127.0.0.1" : host, port);
    }
  });
  const std::string rank = std::to_string(membership_.worldRank());
  metrics_collector_ =
      metrics::addCollector([this, rank, last = std::map<std::string, uint64_t>()]() mutable {
        for (const auto& rail : channels_.mesh().links()) {
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
          // Added even when nothing is new, so that the series exists (at 0) from the start; a
          // count below the last one is a new connection after the group re-formed.
          uint64_t& outages_before = last[key + "/outages"];
          metrics::add(
              "railshard_rail_outages_total", labels,
              static_cast<double>(rail.outages >= outages_before ? rail.outages - outages_before
                                                                 : rail.outages));
          outages_before = rail.outages;
          metrics::set("railshard_rail_estimated_gbps", labels, rail.gbps);
          metrics::set("railshard_rail_weight", labels, rail.fraction);
          metrics::set("railshard_rail_up", labels, rail.up ? 1 : 0);
        }
      });
}

void Diagnostics::countCollective(const char* collective, const char* algorithm, size_t bytes,
                                  double seconds) {
  const std::string rank = std::to_string(membership_.worldRank());
  metrics::add("railshard_collectives_total",
               {{"rank", rank}, {"collective", collective}, {"algorithm", algorithm}}, 1);
  metrics::add("railshard_collective_bytes_total", {{"rank", rank}, {"collective", collective}},
               static_cast<double>(bytes));
  metrics::add("railshard_collective_seconds_total", {{"rank", rank}, {"collective", collective}},
               seconds);
}

void Diagnostics::countError(const std::exception& error) {
  metrics::add(
      "railshard_errors_total",
      {{"rank", std::to_string(membership_.worldRank())}, {"kind", errorKindName(kindOf(error))}},
      1);
}

}  // namespace railshard
