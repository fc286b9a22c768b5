// Tracing set-up of the Communicator (docs/tracing.md): clock alignment at start-up and what
// each rank's trace file says about its rails, link limit and cluster graph.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "base/trace.h"
#include "core/communicator.h"
#include "core/topology/topology.h"
#include "core/tracing/clock_sync.h"
#include "core/tracing/link_limit.h"
#include "transport/transport.h"

namespace railshard {

void Communicator::setUpTracing(Store& store, const Options& options) {
  if (!config_.trace_dir.empty()) trace::enable(config_.trace_dir, config_.trace_events);
  if (!trace::enabled()) return;
  trace::RankInfo info;
  info.world_size = static_cast<int>(world_ranks_.size());
  if (topology_ != nullptr && topology_->worldSize() == size_)
    info.host = topology_->rank(rank_).host;
  if (options.generation == 0 && size_ > 1) {
    // Every rank of the first generation takes part, so the store rounds match up; a shrunk
    // communicator keeps the alignment its ranks already have.
    const auto aligned =
        tracing::alignClocks(store, key_prefix_, rank_, size_,
                             std::chrono::duration_cast<Duration>(config_.connect_timeout));
    info.offset_ns = aligned.offset_ns;
    info.uncertainty_ns = aligned.uncertainty_ns;
    info.epoch_ns = aligned.epoch_ns;
    info.aligned = "store";
    RS_LOG_DEBUG("rank {}: trace clock offset {} ns (+-{} ns)", rank_, aligned.offset_ns,
                 aligned.uncertainty_ns);
    trace::setRankInfo(worldRank(), info);
  } else if (size_ == 1) {
    info.epoch_ns = trace::now();
    trace::setRankInfo(worldRank(), info);
  }
  transport_->setTraceRank(worldRank());
  trace_provider_ = trace::addMetadataProvider(worldRank(), [this] { return traceMetadata(); });
}

std::string Communicator::traceMetadata() const {
  nlohmann::json rails = nlohmann::json::array();
  for (const auto& rail : transport_->rails()) {
    rails.push_back({{"peer", rail.peer},
                     {"name", rail.name},
                     {"local", rail.local},
                     {"remote", rail.remote},
                     {"up", rail.up},
                     {"gbps", rail.gbps},
                     {"bytes_sent", rail.bytes_sent}});
  }
  std::string out = "\"rails\":" + rails.dump() + ",\"generation\":" + std::to_string(generation_) +
                    ",\"algorithm\":\"" + std::string(last_algorithm_) + "\"";
  if (topology_ != nullptr && size_ > 1) {
    const auto limit = linkLimit();
    out += ",\n\"link_limit\":" + nlohmann::json{{"gbps", limit.gbps},
                                                 {"from", limit.from},
                                                 {"to", limit.to},
                                                 {"description", limit.description}}
                                      .dump();
  }
  out += ",\n\"topology\":" + (topology_ != nullptr ? topology_->toJson() : std::string("null"));
  return out;
}

tracing::LinkLimit Communicator::linkLimit() const {
  tracing::LinkLimit limit;
  if (topology_ == nullptr) {
    limit.description = "the communicator has no cluster topology";
    return limit;
  }
  if (size_ < 2) {
    limit.description = "one rank: no link is used";
    return limit;
  }
  try {
    limit = tracing::ringLimit(*topology_, world_ranks_);
  } catch (const Error& e) {
    limit.description = e.what();
    return limit;
  }
  // One host whose graph knows no speed between its ranks (CPU ranks: plain shared memory):
  // the copy rate measured at start-up is the limit, as a rail's speed is between hosts.
  if (limit.gbps <= 0 && shm_ != nullptr && measured_.shm.beta_gbps > 0) {
    limit.gbps = measured_.shm.beta_gbps * 8;
    char text[96];
    std::snprintf(text, sizeof(text), "shared memory, %.3g Gbit/s copy rate measured at start-up",
                  limit.gbps);
    limit.description = text;
  }
  return limit;
}

}  // namespace railshard
