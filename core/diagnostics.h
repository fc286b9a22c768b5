#pragma once

#include <exception>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/config.h"
#include "base/store.h"
#include "core/tracing/link_limit.h"
#include "transport/message_tag.h"

namespace railshard {

class Channels;
class Membership;
class Planner;
class ProgressPublisher;

// What a communicator tells people about itself: which collective each rank is in (published
// to the store, so that a timeout says who never arrived), errors that name the lost or missing
// ranks and how long this one waited, trace files (clock alignment, each rank's rails, link
// limit and graph: docs/tracing.md) and Prometheus metrics (collectives, errors, each rail's
// traffic and weight).
class Diagnostics {
 public:
  Diagnostics(const Config& config, const Membership& membership, const Channels& channels,
              const Planner& planner);
  ~Diagnostics();
  Diagnostics(const Diagnostics&) = delete;
  Diagnostics& operator=(const Diagnostics&) = delete;

  // Start-up, on every rank: tracing (its clocks aligned through `store` in the first
  // generation), metrics, and the publisher of positions.
  void start(Store& store);
  // The group is retired (shrink, grow): positions are no longer published.
  void stopPublishing();

  // A collective starts: its position is published, its wait timed.
  void entered(const transport::MessageTag& tag);
  // The error of a collective that lost a peer / timed out, naming the collective, the lost or
  // missing ranks and the time waited.
  std::string explainLoss(const transport::MessageTag& tag, const std::string& error);
  std::string explainTimeout(const transport::MessageTag& tag, const std::string& error);
  // "rank 3 never entered allreduce #12 (ranks 0,1,2 waiting 30.00 s; ...)", from the positions
  // every rank published; empty without a store.
  std::string diagnoseMissing(const transport::MessageTag& tag);
  // Seconds since the current collective started.
  double waited() const { return secondsSince(collective_start_); }

  // RAILSHARD_METRICS: counts a completed / failed collective.
  bool counting() const { return metrics_; }
  void countCollective(const char* collective, const char* algorithm, size_t bytes, double seconds);
  void countError(const std::exception& error);

  // What bounds this communicator's busbw (Communicator::linkLimit).
  tracing::LinkLimit linkLimit() const;

 private:
  // diagnostics_telemetry.cc
  void setUpTracing(Store& store);
  std::string traceMetadata() const;
  void setUpMetrics();

  const Config& config_;
  const Membership& membership_;
  const Channels& channels_;
  const Planner& planner_;
  std::unique_ptr<ProgressPublisher> publisher_;
  Clock::time_point collective_start_{};
  int trace_provider_ = 0;  // trace metadata provider id, 0 = none
  bool metrics_ = false;    // RAILSHARD_METRICS set: count collectives
  int metrics_collector_ = 0;
};

}  // namespace railshard
