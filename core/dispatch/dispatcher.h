#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"
#include "core/dispatch/load_signals.h"
#include "core/dispatch/policy.h"
#include "core/dispatch/throughput_estimator.h"

namespace railshard::dispatch {

// A half-open run of sample indices of the epoch, [begin, end).
struct Range {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Who does what in one step.
struct StepPlan {
  uint64_t step = 0;
  std::vector<size_t> samples;             // per rank (0 for failed ranks)
  std::vector<std::vector<Range>> ranges;  // per rank, the epoch indices it processes
  size_t total() const;
  // Stable across ranks and runs: lets ranks check they computed the same plan.
  uint64_t fingerprint() const;
};

struct DispatchOptions {
  // Policy from RAILSHARD_DISPATCH_POLICY, everything else at its default.
  static DispatchOptions fromConfig(const Config& config);

  Policy policy = Policy::kProportional;
  size_t micro_batch = 1;        // shares are whole micro-batches (the epoch's tail excepted)
  size_t min_micro_batches = 0;  // per live rank and step, when the batch allows (proportional)
  std::vector<double> weights;   // weighted_round_robin; empty = 1 per rank
  // energy: the step may take this many times the fastest plan's time (>= 1).
  double energy_budget = 1.05;
  EstimatorOptions estimator;
};

// Shares global batches among ranks and keeps the books of an epoch: every sample index in
// [0, epoch_size) is handed to exactly one rank once; a failed rank's unfinished work moves
// to the survivors. Pure logic (no I/O, no clock): every rank runs its own copy on the same
// inputs and gets the same plans (CollectiveDispatcher feeds it).
class Dispatcher {
 public:
  Dispatcher(int world_size, uint64_t epoch_size, DispatchOptions options);

  // Plans the next step: up to `global_batch` not yet assigned samples of the epoch, shared
  // by the policy. InvalidArgument when the previous step is not complete or the epoch is
  // done; global_batch must be > 0.
  const StepPlan& plan(size_t global_batch);
  // The current step's ranges are processed (by every live rank): they become done.
  void completeStep();
  // Measurement from `rank`: it processed `samples` in `seconds` (its compute, not waiting),
  // drawing `energy_joules` over the step (0: unknown; the energy policy's joules per sample).
  // Call after setLoad() of the same step: its CPU quota says what the rate was measured under.
  void report(int rank, double samples, double seconds, double energy_joules = 0);
  // What `rank` reports about its load (core/dispatch/load_signals.h), every step:
  //  - queued_samples: work ahead of new work there (least_loaded counts it);
  //  - cpu_quota_cores: the estimator keeps the rank's rate per core, so a quota that changes
  //    moves its share at the next plan, before a slower step has been measured;
  //  - cap_samples: no plan gives it more (whole micro-batches); what it cannot take goes to
  //    the others, and when all are full the step is smaller.
  // The rest is kept for whoever reads load(). InvalidArgument naming the rank, field and
  // value for a nonsensical report (negative, not finite), which then changes nothing.
  void setLoad(int rank, const LoadSignals& load);
  const LoadSignals& load(int rank) const;
  // Joules per sample the rank spent lately (0: unknown).
  double joulesPerSample(int rank) const;

  // The rank is gone. Its ranges of the current step (not done) go to the live ranks by the
  // policy; returns the updated plan. Later plans leave it out. InvalidArgument for the last
  // live rank or a rank already failed.
  const StepPlan& markFailed(int rank);
  // A new rank; it gets work from the next plan on (equal share until it has reported).
  int addRank(double weight = 1);
  // Samples a completed step handed out that were not processed (a rank ran out of memory and
  // every rank gave the step up): `ranges` -- the step's, every rank's -- go back into the
  // epoch, and the next plans hand them out first, under the caps then in force. InvalidArgument
  // while a step is open, for a range not handed out yet or already requeued.
  void requeue(const std::vector<Range>& ranges);
  // Withdraws the open step as if plan() had not been called (its samples go back to the
  // unassigned rest of the epoch, the step number is reused). For elastic recovery: some
  // survivors planned a step the others never reached. Ranks marked failed stay failed.
  // InvalidArgument when no step is open.
  void unplan();

  bool stepOpen() const { return step_open_; }
  // Steps completed so far (all epochs); the open step, if any, has this number.
  uint64_t completedSteps() const { return step_open_ ? plan_.step : next_step_; }
  const StepPlan& current() const { return plan_; }
  bool alive(int rank) const;
  int worldSize() const { return static_cast<int>(alive_.size()); }
  int liveRanks() const;
  uint64_t epochSize() const { return epoch_size_; }
  uint64_t assigned() const { return cursor_; }  // samples handed out so far this epoch
  // Samples requeue()d and not planned again yet.
  bool hasReturned() const { return !returned_.empty(); }
  uint64_t done() const { return done_; }  // samples of completed steps
  bool epochDone() const { return done_ == epoch_size_; }
  // Starts the next epoch (all samples again). InvalidArgument while a step is open.
  void newEpoch();
  uint64_t epoch() const { return epoch_; }
  const ThroughputEstimator& estimator() const { return estimator_; }
  const DispatchOptions& options() const { return options_; }
  // Over everything the next plans depend on (epoch position, live ranks, the open plan,
  // the estimates): equal on two ranks exactly when they will plan alike.
  uint64_t stateFingerprint() const;

 private:
  // Reads and writes every field (core/dispatch/state_codec.cc): a joiner's copy.
  friend struct StateCodecAccess;

  std::vector<size_t> share(size_t units, const std::vector<bool>& take_part, uint64_t rotation);
  std::vector<double> weightsFor(const std::vector<bool>& take_part) const;
  // Units each rank's memory holds (-1: no cap), from cap_samples.
  std::vector<long long> capsInUnits() const;
  // The policy's shares before the caps.
  std::vector<size_t> policyShares(size_t units, const std::vector<double>& weights,
                                   uint64_t rotation) const;

  DispatchOptions options_;
  uint64_t epoch_size_;
  uint64_t epoch_ = 0;
  uint64_t cursor_ = 0;
  uint64_t done_ = 0;
  uint64_t next_step_ = 0;
  bool step_open_ = false;
  std::vector<bool> alive_;
  std::vector<Range> returned_;        // requeue()d samples, planned before the cursor's
  std::vector<Range> taken_returned_;  // what the open plan took from them (for unplan())
  std::vector<LoadSignals> load_;
  std::vector<double> joules_per_sample_;  // energy, smoothed like the rates
  std::vector<double> static_weights_;
  ThroughputEstimator estimator_;
  StepPlan plan_;
};

}  // namespace railshard::dispatch
