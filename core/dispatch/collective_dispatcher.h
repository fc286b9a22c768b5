#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dispatch/dispatcher.h"

namespace railshard {
class Communicator;
}

namespace railshard::dispatch {

// What a rank says about its last step, beyond samples and seconds. All optional (0 = unknown).
struct LoadSignals {
  double queued_samples = 0;    // work waiting at the rank (least_loaded uses it)
  double memory_bytes = 0;      // host memory in use
  double gpu_utilization = 0;   // 0..1
  double gpu_memory_bytes = 0;  // device memory in use
};

// One rank's report as every rank sees it after the per-step all-gather.
struct RankReport {
  double samples = 0;
  double seconds = 0;
  LoadSignals load;
  uint64_t plan_fingerprint = 0;  // the plan the rank ran
};

// The Dispatcher on every rank of a communicator. Each step, one all-gather of a 64-byte
// report per rank carries last step's measurements (and the fingerprint of the plan each rank
// ran); every rank feeds the same reports to its own Dispatcher in rank order and so computes
// the same next plan: no coordinator, nothing to disagree about — and if two ranks did compute
// different plans, the fingerprints show it and every rank raises MismatchError.
//
//   CollectiveDispatcher d(*comm, dataset_size, options);
//   do {
//     for (auto range : d.nextStep(global_batch)) { ... train on samples in range ... }
//     d.finishStep(samples, compute_seconds);
//     allreduceSampleMean(*comm, grad, n, kFloat32, d.mySamples(), d.stepSamples());
//   } while (!d.epochDone());
class CollectiveDispatcher {
 public:
  CollectiveDispatcher(Communicator& comm, uint64_t epoch_size, DispatchOptions options);

  // Gathers every rank's report of the previous step, completes it, and plans the next one.
  // Returns this rank's ranges. Collective: every rank calls it once per step.
  const std::vector<Range>& nextStep(size_t global_batch);
  // This rank's measurement of the step just run (compute time only, not waiting).
  void finishStep(double samples, double seconds, const LoadSignals& load = {});

  size_t mySamples() const;
  size_t stepSamples() const { return dispatcher_.current().total(); }
  const StepPlan& plan() const { return dispatcher_.current(); }
  // The reports gathered at the start of the current step (last step's), by rank.
  const std::vector<RankReport>& lastReports() const { return reports_; }
  // The current step hands out the epoch's last samples; the next nextStep() starts a new
  // epoch.
  bool epochDone() const;
  Dispatcher& dispatcher() { return dispatcher_; }
  // Time nextStep() spent in its all-gather and in planning, last call (seconds).
  double lastGatherSeconds() const { return gather_seconds_; }
  double lastPlanSeconds() const { return plan_seconds_; }

 private:
  Communicator& comm_;
  Dispatcher dispatcher_;
  RankReport mine_;
  std::vector<RankReport> reports_;
  bool have_step_ = false;
  uint64_t steps_ = 0;
  int log_every_ = 0;
  double gather_seconds_ = 0;
  double plan_seconds_ = 0;
};

}  // namespace railshard::dispatch
