#include "core/dispatch/elastic_state.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/fnv.h"

namespace railshard::dispatch {

void checkReport(const RankReport& report, const std::string& who) {
  const struct {
    const char* name;
    double value;
  } fields[] = {{"samples", report.samples},
                {"seconds", report.seconds},
                {"energy_joules", report.energy_joules}};
  for (const auto& field : fields) {
    if (!std::isfinite(field.value) || field.value < 0) {
      throw InvalidArgument(who + " reported " + field.name + " = " + std::to_string(field.value) +
                            " (must be a finite number >= 0)");
    }
  }
  validate(report.load, who);
}

ElasticState::ElasticState(int world_size, uint64_t epoch_size, DispatchOptions options)
    : dispatcher_(world_size, epoch_size, std::move(options)) {}

const StepPlan& ElasticState::advance(size_t global_batch, const std::vector<RankReport>& reports) {
  if (redo_) {
    throw InvalidArgument("ElasticState::advance: step " +
                          std::to_string(dispatcher_.current().step) +
                          " is to be redone first (takeRedo)");
  }
  if (dispatcher_.stepOpen()) {
    if (!openStepCommitted()) {
      throw InvalidArgument("ElasticState::advance: step " +
                            std::to_string(dispatcher_.current().step) + " is not committed");
    }
    if (reports.size() != static_cast<size_t>(dispatcher_.worldSize())) {
      throw InvalidArgument("ElasticState::advance: " + std::to_string(reports.size()) +
                            " reports for " + std::to_string(dispatcher_.worldSize()) + " ranks");
    }
    // Every report checked before any is applied: a nonsensical one moves nothing (and every
    // rank, seeing the same reports, raises the same error).
    for (size_t r = 0; r < reports.size(); ++r) {
      if (dispatcher_.alive(static_cast<int>(r)))
        checkReport(reports[r], "rank " + std::to_string(r));
    }
    previous_ = dispatcher_;
    // Same reports in the same order on every rank: same estimates, same next plan.
    for (size_t r = 0; r < reports.size(); ++r) {
      const int rank = static_cast<int>(r);
      if (!dispatcher_.alive(rank)) continue;
      dispatcher_.setLoad(rank, reports[r].load);
      dispatcher_.report(rank, reports[r].samples, reports[r].seconds, reports[r].energy_joules);
    }
    dispatcher_.completeStep();
  }
  if (dispatcher_.epochDone()) dispatcher_.newEpoch();
  return dispatcher_.plan(global_batch);
}

bool ElasticState::openStepCommitted() const {
  return dispatcher_.stepOpen() && committed_ == dispatcher_.current().step + 1;
}

void ElasticState::commit() {
  if (!dispatcher_.stepOpen()) throw InvalidArgument("ElasticState::commit: no step is open");
  if (openStepCommitted()) {
    throw InvalidArgument("ElasticState::commit: step " +
                          std::to_string(dispatcher_.current().step) + " is already committed");
  }
  committed_ = dispatcher_.current().step + 1;
}

Position ElasticState::position() const {
  return Position{committed_, dispatcher_.completedSteps(), dispatcher_.stepOpen()};
}

Recovery ElasticState::recover(const std::vector<Position>& survivors,
                               const std::vector<bool>& survives) {
  if (survivors.empty()) throw InvalidArgument("ElasticState::recover: no survivors");
  if (survives.size() != static_cast<size_t>(dispatcher_.worldSize())) {
    throw InvalidArgument("ElasticState::recover: survivor mask of " +
                          std::to_string(survives.size()) + " for " +
                          std::to_string(dispatcher_.worldSize()) + " ranks");
  }
  uint64_t c = survivors[0].committed;
  uint64_t least_completed = survivors[0].completed;
  for (const Position& p : survivors) {
    c = std::min(c, p.committed);
    least_completed = std::min(least_completed, p.completed);
  }
  // Every collective involves every rank, so no survivor can be more than one collective ahead
  // of another: committed in {c, c+1}, completed in {c-1, c}, and a rank commits only the step
  // it planned. Anything else is not one run (or a bug); guessing would lose samples.
  bool all_open_at_c = true;
  for (const Position& p : survivors) {
    const bool sane = p.committed <= c + 1 && p.completed <= c && p.completed + 1 >= c &&
                      p.committed >= p.completed && p.committed <= p.completed + 1 &&
                      (p.committed == p.completed || p.open);
    if (!sane) {
      throw Error(
          "dispatcher recovery: survivor positions are more than one step apart (one "
          "committed " +
          std::to_string(p.committed) + " steps and completed " + std::to_string(p.completed) +
          ", another committed only " + std::to_string(c) + ")");
    }
    all_open_at_c = all_open_at_c && p.completed == c && p.open;
  }

  Recovery out;
  out.committed = c;
  out.undo_last_step = committed_ > c;
  if (least_completed + 1 == c) {
    // Some survivor never got the reports of step c-1 (it failed in the all-gather that carries
    // them), so nobody uses them: every survivor goes back to "step c-1 planned" and completes
    // it without them. Step c-1 itself stands: every survivor committed it.
    if (dispatcher_.completedSteps() == c) {
      if (!previous_)
        throw Error("dispatcher recovery: no snapshot of step " + std::to_string(c - 1));
      dispatcher_ = *previous_;
    } else {
      previous_ = dispatcher_;
    }
    if (!dispatcher_.stepOpen() || dispatcher_.current().step + 1 != c) {
      throw Error("dispatcher recovery: expected step " + std::to_string(c - 1) + " open");
    }
    dispatcher_.completeStep();
  } else if (!all_open_at_c && dispatcher_.stepOpen()) {
    // Some survivors planned step c, others did not get that far: withdraw it everywhere.
    dispatcher_.unplan();
  }
  // All survivors now hold the same dispatcher. Ranks that did not survive leave it, in rank
  // order; with step c open their ranges of it go to the survivors by the policy.
  for (size_t r = 0; r < survives.size(); ++r) {
    const int rank = static_cast<int>(r);
    if (!survives[r] && dispatcher_.alive(rank)) {
      dispatcher_.markFailed(rank);
      out.failed.push_back(rank);
    }
  }
  committed_ = c;
  redo_ = dispatcher_.stepOpen();
  out.redo = redo_;
  return out;
}

int ElasticState::addRank(double weight) {
  if (previous_) previous_->addRank(weight);
  return dispatcher_.addRank(weight);
}

const StepPlan& ElasticState::takeRedo() {
  if (!redo_) throw InvalidArgument("ElasticState::takeRedo: no step to redo");
  redo_ = false;
  return dispatcher_.current();
}

uint64_t ElasticState::fingerprint() const {
  Fnv1a h;
  h.add(dispatcher_.stateFingerprint()).add(committed_).add(uint64_t{redo_});
  return h.value();
}

}  // namespace railshard::dispatch
