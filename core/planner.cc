#include "core/planner.h"

#include "base/logging.h"
#include "core/channels.h"
#include "core/collective_tag.h"

namespace railshard {

Planner::Planner(const Config& config, const Channels& channels, int rank, int size)
    : config_(config), channels_(channels), rank_(rank), size_(size) {
  collectives::Algorithm ignored;
  collectives::parseAlgorithm(config.algorithm, ignored);  // ConfigError when unknown
}

collectives::Algorithm Planner::allreduce(size_t bytes, const transport::MessageTag& tag) {
  // Users ask which algorithm ran; at debug level every all-reduce says so, with the model's
  // estimates behind the choice. Only then are the strings built: they cost more than a small
  // shared-memory all-reduce.
  const bool explain = log::logger().should_log(spdlog::level::debug);
  if (explain || bytes != tuned_bytes_ || !tuned_) {
    const collectives::HostLayout* layout = channels_.layout();
    collectives::TunerInput input;
    input.bytes = bytes;
    input.world_size = size_;
    input.shm = channels_.oneHost();
    input.shm_slot_bytes =
        channels_.oneHost() || channels_.twoLevel() ? channels_.hostSlotBytes() : 0;
    input.hosts = layout ? layout->hostCount() : 1;
    input.ranks_per_host = layout ? layout->maxLocal() : size_;
    input.host_shm = channels_.twoLevel();
    input.network = channels_.network();
    input.shm_link = channels_.measured().shm;
    input.reduce_gbps = channels_.measured().reduce_gbps;
    input.ranks_per_core = channels_.measured().ranks_per_core;
    const auto choice = collectives::chooseAllreduce(input, config_.algorithm, explain);
    tuned_ = true;
    tuned_bytes_ = bytes;
    tuned_algorithm_ = choice.algorithm;
    if (explain) {
      RS_LOG_DEBUG("rank {}: {} -> {} ({})", rank_, describeTag(tag),
                   collectives::name(choice.algorithm), choice.reason);
    }
  }
  last_ = collectives::name(tuned_algorithm_);
  return tuned_algorithm_;
}

}  // namespace railshard
