#include "core/dispatch/collective_dispatcher.h"

#include <cstring>
#include <sstream>

#include "core/base/clock.h"
#include "core/base/error.h"
#include "core/base/logging.h"
#include "core/communicator.h"
#include "core/dispatch/static_weights.h"
#include "core/topology/topology.h"

namespace railshard::dispatch {

namespace {

// The wire form of a RankReport: eight 8-byte fields, gathered as bytes.
struct WireReport {
  double samples;
  double seconds;
  double queued_samples;
  double memory_bytes;
  double gpu_utilization;
  double gpu_memory_bytes;
  uint64_t plan_fingerprint;
  uint64_t has_report;  // 0 before the first step
};
static_assert(sizeof(WireReport) == 64);

std::string describe(const StepPlan& plan, const ThroughputEstimator& estimator) {
  std::ostringstream out;
  out << "step " << plan.step << " shares [";
  for (size_t r = 0; r < plan.samples.size(); ++r) out << (r ? " " : "") << plan.samples[r];
  out << "] throughput [";
  for (int r = 0; r < estimator.ranks(); ++r) {
    out << (r ? " " : "") << static_cast<long long>(estimator.rate(r) + 0.5);
  }
  out << "] samples/s";
  return out.str();
}

}  // namespace

namespace {

// weighted_round_robin without weights: take them from the GPU models in the cluster graph.
DispatchOptions withTopologyWeights(const Communicator& comm, DispatchOptions options) {
  const topology::Topology* graph = comm.topology();
  if (options.policy == Policy::kWeightedRoundRobin && options.weights.empty() &&
      graph != nullptr && graph->worldSize() == comm.size()) {
    options.weights = weightsFromTopology(*graph);
  }
  return options;
}

}  // namespace

CollectiveDispatcher::CollectiveDispatcher(Communicator& comm, uint64_t epoch_size,
                                           DispatchOptions options)
    : comm_(comm),
      dispatcher_(comm.size(), epoch_size, withTopologyWeights(comm, std::move(options))) {
  log_every_ = comm.config().dispatch_log_every;
}

const std::vector<Range>& CollectiveDispatcher::nextStep(size_t global_batch) {
  const auto gather_start = Clock::now();
  WireReport mine{};
  mine.samples = mine_.samples;
  mine.seconds = mine_.seconds;
  mine.queued_samples = mine_.load.queued_samples;
  mine.memory_bytes = mine_.load.memory_bytes;
  mine.gpu_utilization = mine_.load.gpu_utilization;
  mine.gpu_memory_bytes = mine_.load.gpu_memory_bytes;
  mine.plan_fingerprint = have_step_ ? dispatcher_.current().fingerprint() : 0;
  mine.has_report = have_step_ ? 1 : 0;
  std::vector<WireReport> all(static_cast<size_t>(comm_.size()));
  comm_.allgather(&mine, all.data(), sizeof(WireReport), DataType::kUInt8);
  gather_seconds_ = secondsSince(gather_start);

  const auto plan_start = Clock::now();
  reports_.assign(all.size(), RankReport{});
  for (size_t r = 0; r < all.size(); ++r) {
    const WireReport& w = all[r];
    reports_[r] = RankReport{
        w.samples, w.seconds,
        LoadSignals{w.queued_samples, w.memory_bytes, w.gpu_utilization, w.gpu_memory_bytes},
        w.plan_fingerprint};
  }
  if (have_step_) {
    // Every rank must have run the same plan; a difference means the ranks' dispatchers
    // diverged (different options, different binaries), and training would skip or repeat
    // samples. Say so everywhere.
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].plan_fingerprint != all[0].plan_fingerprint || all[r].has_report != 1) {
        throw MismatchError("dispatcher: rank " + std::to_string(r) + " ran step " +
                            std::to_string(dispatcher_.current().step) + " with plan " +
                            std::to_string(all[r].plan_fingerprint) + ", rank 0 with " +
                            std::to_string(all[0].plan_fingerprint) +
                            " (same DispatchOptions and batch sizes on every rank?)");
      }
    }
    // Same reports in the same order on every rank: same estimates, same next plan.
    for (size_t r = 0; r < all.size(); ++r) {
      dispatcher_.report(static_cast<int>(r), all[r].samples, all[r].seconds);
      dispatcher_.setQueued(static_cast<int>(r), all[r].queued_samples);
    }
    dispatcher_.completeStep();
  }
  if (dispatcher_.epochDone()) dispatcher_.newEpoch();
  const StepPlan& plan = dispatcher_.plan(global_batch);
  have_step_ = true;
  mine_ = RankReport{};
  plan_seconds_ = secondsSince(plan_start);
  ++steps_;
  if (log_every_ > 0 && comm_.rank() == 0 && steps_ % static_cast<uint64_t>(log_every_) == 0) {
    RS_LOG_INFO("dispatch {}", describe(plan, dispatcher_.estimator()));
  } else {
    RS_LOG_DEBUG("dispatch {}", describe(plan, dispatcher_.estimator()));
  }
  return plan.ranges[static_cast<size_t>(comm_.rank())];
}

void CollectiveDispatcher::finishStep(double samples, double seconds, const LoadSignals& load) {
  mine_.samples = samples;
  mine_.seconds = seconds;
  mine_.load = load;
}

size_t CollectiveDispatcher::mySamples() const {
  if (!have_step_) return 0;
  return dispatcher_.current().samples[static_cast<size_t>(comm_.rank())];
}

bool CollectiveDispatcher::epochDone() const {
  // The open step's samples count as done once it is run: the epoch ends with the step that
  // assigns its last samples.
  return have_step_ && dispatcher_.assigned() == dispatcher_.epochSize();
}

}  // namespace railshard::dispatch
