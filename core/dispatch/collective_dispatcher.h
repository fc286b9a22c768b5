#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/dispatch/dispatcher.h"
#include "core/dispatch/elastic_state.h"

namespace railshard {
class Communicator;
}

namespace railshard::dispatch {

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
//     d.commitStep();  // optional: nextStep() commits the previous step when it was not
//   } while (!d.epochDone());
//
// Elastic continuation: when a collective raises (a peer was lost), every survivor calls
// comm->shrink() and then recover(*survivors); the loop goes on with nextStep(), which hands
// out the step to redo (see recover()). Ranks keep their numbers from the communicator the
// dispatcher was built on (for init()'s, the launch rank) in plans, reports and estimates.
class CollectiveDispatcher {
 public:
  CollectiveDispatcher(Communicator& comm, uint64_t epoch_size, DispatchOptions options);

  // Gathers every rank's report of the previous step, completes it, and plans the next one.
  // Returns this rank's ranges. Collective: every rank calls it once per step. After a
  // recover() with Recovery::redo it returns the step to redo instead, without a collective
  // (global_batch is then ignored).
  const std::vector<Range>& nextStep(size_t global_batch);
  // This rank's measurement of the step just run (compute time only, not waiting), what it
  // says about its load (launcher::LoadMonitor reads most of it; queued_samples and
  // cap_samples are the caller's) and the energy it drew over the step (0: unknown).
  // InvalidArgument naming the field and value for a nonsensical report, which is not kept.
  void finishStep(double samples, double seconds, const LoadSignals& load = {},
                  double energy_joules = 0);
  // This rank applied the current step (its gradient all-reduce succeeded). What recover()
  // agrees on is the steps every survivor committed. Calling it is optional: nextStep()
  // commits a step it finds uncommitted, since the caller has moved past it.
  void commitStep();
  // Steps this rank committed (all epochs): the number of the next step to commit.
  uint64_t committedSteps() const { return state_.committed(); }

  // Continues on `survivors` (comm->shrink() of the communicator this dispatcher ran on, or a
  // later shrink). Collective over the survivors. Members of the old group that are not in
  // it are marked failed; the survivors agree (an all-gather of their positions) on the last
  // step every one of them committed, c, and undo anything later: when all of them had step
  // c planned it stays, the lost ranks' ranges of it moved to survivors by the policy, and
  // nextStep() hands it out again (Recovery::redo); otherwise step c is planned afresh among
  // the survivors by the next nextStep(). A survivor that had applied step c gets
  // Recovery::undo_last_step and must restore its model from before that step. Throughput
  // estimates are kept. A second all-gather checks every survivor ended in the same state
  // (MismatchError otherwise). The dispatcher uses `survivors` from now on; it must outlive
  // the dispatcher or the next recover(). If recover() itself fails (another peer lost),
  // shrink again and call recover() again.
  Recovery recover(Communicator& survivors);

  // Growth: after the members' comm->grow() (at a step boundary: past the last step's
  // gradient all-reduce -- admit() commits it, as nextStep() would -- the next not yet asked
  // for) every member calls admit(*grown) and every joiner calls
  // CollectiveDispatcher::joined(*grown) on the communicator its join() returned -- one
  // collective over the grown communicator. The first member (rank 0 of the grown
  // communicator, as grow() orders it) hands its whole dispatcher state to the joiners (a
  // broadcast); a fingerprint check then proves every rank holds the same. Joiners take the
  // next dispatcher numbers (in the grown communicator's order) and get shares from the next
  // step: planned at the median of the measured ranks' throughput (proportional,
  // least_loaded) or of the static weights (weighted_round_robin), then at their own measured
  // rate from their first step on. The committed step stands: nothing is redone, no sample
  // moves. A member grow() left out (it died at the boundary) is marked failed as recover()
  // would mark it (Admission::recovery). InvalidArgument on every rank when the members
  // are not at one step boundary.
  struct Admission {
    std::vector<int> joined;           // the joiners' dispatcher ranks
    std::optional<Recovery> recovery;  // when members were left out of the grown group
  };
  Admission admit(Communicator& grown);
  static CollectiveDispatcher joined(Communicator& grown);

  size_t mySamples() const;
  size_t stepSamples() const { return state_.dispatcher().current().total(); }
  const StepPlan& plan() const { return state_.dispatcher().current(); }
  // This rank's ranges of the current step.
  const std::vector<Range>& myRanges() const;
  // This rank in the dispatcher's numbering (its rank in the communicator it was built on).
  int myRank() const { return my_rank_; }
  // The launch rank of each dispatcher rank (failed ones included; joiners appended).
  const std::vector<int>& launchRanks() const { return members_; }
  // The reports gathered at the start of the current step (last step's), by rank (the
  // dispatcher's numbering; zeros for failed ranks).
  const std::vector<RankReport>& lastReports() const { return reports_; }
  // The current step hands out the epoch's last samples (or the epoch is complete); the next
  // nextStep() starts a new epoch.
  bool epochDone() const;
  Dispatcher& dispatcher() { return state_.dispatcher(); }
  const ElasticState& state() const { return state_; }
  // Time nextStep() spent in its all-gather and in planning, last call (seconds).
  double lastGatherSeconds() const { return gather_seconds_; }
  double lastPlanSeconds() const { return plan_seconds_; }
  // Time the last recover() took (seconds).
  double lastRecoverSeconds() const { return recover_seconds_; }
  // Time the last admit() or joined() took (seconds).
  double lastAdmitSeconds() const { return admit_seconds_; }

 private:
  // A joiner's dispatcher before adopt() fills it.
  explicit CollectiveDispatcher(Communicator& grown);
  // admit()'s and joined()'s common protocol (`member`: this rank was in the group before).
  Admission adopt(Communicator& grown, bool member);
  // An all-gather of the state's fingerprint over `comm`: MismatchError naming `what` and
  // the ranks (`ranks`: the dispatcher's number of each rank of comm) when any differs.
  void checkSameState(Communicator& comm, const std::vector<int>& ranks, const char* what) const;

  Communicator* comm_;
  ElasticState state_;
  // Launch ("world") rank of each of the dispatcher's ranks: the members of the communicator
  // it was built on; recover() finds survivors in it.
  std::vector<int> members_;
  // The dispatcher rank of each rank of comm_.
  std::vector<int> ranks_;
  int my_rank_ = 0;
  RankReport mine_;
  std::vector<RankReport> reports_;
  uint64_t steps_ = 0;
  int log_every_ = 0;
  double gather_seconds_ = 0;
  double plan_seconds_ = 0;
  double recover_seconds_ = 0;
  double admit_seconds_ = 0;
};

}  // namespace railshard::dispatch
