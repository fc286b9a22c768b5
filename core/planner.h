#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/config.h"
#include "core/collectives/tuner.h"
#include "transport/message_tag.h"

namespace railshard {

class Channels;

// Which algorithm an all-reduce runs: the tuner's choice (collectives/tuner.h) from the
// message size and what this communicator is made of — one host or several, ranks per host,
// the links' figures (the graph's rails, what start-up measured) — or RAILSHARD_ALGO. Training
// repeats the same sizes, so the last choice is kept; at debug level every all-reduce says
// what ran and the estimates behind it.
class Planner {
 public:
  Planner(const Config& config, const Channels& channels, int rank, int size);

  collectives::Algorithm allreduce(size_t bytes, const transport::MessageTag& tag);
  // The algorithm the last collective ran ("ring", "shm_direct", ...).
  std::string_view last() const { return last_; }
  void ran(std::string_view algorithm) { last_ = algorithm; }

 private:
  const Config& config_;
  const Channels& channels_;
  int rank_;
  int size_;
  std::string_view last_ = "none";
  bool tuned_ = false;  // the last choice below is set
  size_t tuned_bytes_ = 0;
  collectives::Algorithm tuned_algorithm_{};
};

}  // namespace railshard
