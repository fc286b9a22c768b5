#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dispatch/dispatcher.h"
#include "core/dispatch/load_signals.h"

namespace railshard::dispatch {

// One rank's report as every rank sees it after the per-step all-gather.
struct RankReport {
  double samples = 0;
  double seconds = 0;
  double energy_joules = 0;  // drawn over the step (0: unknown)
  LoadSignals load;
  uint64_t plan_fingerprint = 0;  // the plan the rank ran
};

// InvalidArgument naming `who`, the field and the value when a report is nonsensical:
// negative or non-finite samples, seconds or energy, or load signals out of range.
void checkReport(const RankReport& report, const std::string& who);

// Where one rank stands in the step protocol when a peer is lost; the survivors exchange these
// to agree on the last consistent state.
struct Position {
  uint64_t committed = 0;  // steps whose gradient step this rank applied (commit())
  uint64_t completed =
      0;              // steps its dispatcher completed (reports fed: Dispatcher::completedSteps)
  bool open = false;  // it has planned step `completed`
};

// The outcome of recover(), the same on every survivor except undo_last_step.
struct Recovery {
  // Steps 0..committed-1 stand; whatever any survivor did after them is undone.
  uint64_t committed = 0;
  // This rank had applied step `committed` (another survivor had not): restore the model from
  // before that step. Survivors are at most one step apart, so one step back is enough.
  bool undo_last_step = false;
  // Step `committed` stays planned, the lost ranks' ranges reassigned to survivors: the next
  // step handed out is this one again (survivors redo their own ranges plus the reassigned
  // ones). False: step `committed` is planned afresh, among the survivors only.
  bool redo = false;
  std::vector<int> failed;  // ranks (the dispatcher's numbering) marked failed now
};

// One rank's Dispatcher with the bookkeeping elastic continuation needs: how many steps this
// rank committed, and the dispatcher as it was before its last completed step (a survivor that
// completed one step more than another must be able to go back to it). Pure logic, like the
// Dispatcher: CollectiveDispatcher does the exchanges; tests drive several of these directly.
//
// A step's life on one rank: advance() after the start-of-step all-gather (completes the
// previous step with everyone's reports, plans this one); compute; gradient all-reduce;
// commit(). A failure can hit survivors at different points of that cycle; after shrinking,
// each survivor passes everyone's position() to recover().
class ElasticState {
 public:
  ElasticState(int world_size, uint64_t epoch_size, DispatchOptions options);

  // Completes the open step (it must be committed) feeding `reports` (by rank; failed ranks'
  // entries are ignored), starts a new epoch when the last is done, and plans the next step.
  const StepPlan& advance(size_t global_batch, const std::vector<RankReport>& reports);
  // This rank applied the open step (its gradient all-reduce succeeded). InvalidArgument when
  // no step is open or it is committed already.
  void commit();
  bool openStepCommitted() const;
  uint64_t committed() const { return committed_; }
  Position position() const;

  // Collective in spirit: every survivor calls it with the positions of all survivors (any
  // order) and `survives` (by rank: true for each survivor) and ends in the same state.
  // Agreed point: c = the fewest steps any survivor committed. When every survivor has step c
  // planned, it stays open with the lost ranks' ranges moved to the survivors (Recovery::redo);
  // otherwise everyone goes to "step c not planned": a survivor that completed step c-1 with
  // reports goes back to its snapshot and completes it without them (no survivor may have
  // them), one that planned step c withdraws it. Ranks that do not survive are marked failed.
  // Error when the positions cannot come from one run (more than one step apart).
  Recovery recover(const std::vector<Position>& survivors, const std::vector<bool>& survives);
  // A joiner (CollectiveDispatcher::admit): a new rank in the dispatcher and in the snapshot
  // recovery may go back to, so that both keep one numbering. Returns its rank.
  int addRank(double weight);
  // After a recovery with redo: the step to hand out again is pending until taken.
  bool redoPending() const { return redo_; }
  const StepPlan& takeRedo();

  // Equal on two ranks exactly when they are in the same state (checked after recover()).
  uint64_t fingerprint() const;
  Dispatcher& dispatcher() { return dispatcher_; }
  const Dispatcher& dispatcher() const { return dispatcher_; }

 private:
  // Reads and writes every field (core/dispatch/state_codec.cc): a joiner's copy.
  friend struct StateCodecAccess;

  Dispatcher dispatcher_;
  // The dispatcher before its last completeStep(), step `completed - 1` still open.
  std::optional<Dispatcher> previous_;
  uint64_t committed_ = 0;
  bool redo_ = false;
};

}  // namespace railshard::dispatch
