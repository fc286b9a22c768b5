#include "core/dispatch/collective_dispatcher.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "base/clock.h"
#include "base/error.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "base/trace.h"
#include "core/communicator.h"
#include "core/dispatch/dispatch_metrics.h"
#include "core/dispatch/static_weights.h"
#include "core/topology/topology.h"

namespace railshard::dispatch {

namespace {

// The wire form of a RankReport: sixteen 8-byte fields, gathered as bytes.
struct WireReport {
  double samples;
  double seconds;
  double energy_joules;
  LoadSignals load;  // ten doubles
  uint64_t plan_fingerprint;
  uint64_t has_report;  // 0 before the first step
  uint64_t reserved;
};
static_assert(sizeof(LoadSignals) == 10 * sizeof(double));
static_assert(sizeof(WireReport) == 128);

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

// What a survivor tells the others in recover().
struct WirePosition {
  uint64_t committed;
  uint64_t completed;
  uint64_t open;
  uint64_t rank;  // the dispatcher's numbering
};
static_assert(sizeof(WirePosition) == 32);

}  // namespace

CollectiveDispatcher::CollectiveDispatcher(Communicator& comm, uint64_t epoch_size,
                                           DispatchOptions options)
    : comm_(&comm),
      state_(comm.size(), epoch_size, withTopologyWeights(comm, std::move(options))),
      members_(comm.worldRanks()),
      my_rank_(comm.rank()) {
  ranks_.resize(static_cast<size_t>(comm.size()));
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r] = static_cast<int>(r);
  log_every_ = comm.config().dispatch_log_every;
}

const std::vector<Range>& CollectiveDispatcher::nextStep(size_t global_batch) {
  if (state_.redoPending()) {
    // recover() agreed on this step and checked every survivor holds the same plan.
    gather_seconds_ = 0;
    plan_seconds_ = 0;
    mine_ = RankReport{};
    return state_.takeRedo().ranges[static_cast<size_t>(my_rank_)];
  }
  // The caller is past the step's gradient all-reduce: the step is applied here.
  if (state_.dispatcher().stepOpen() && !state_.openStepCommitted()) state_.commit();
  const bool have_step = state_.dispatcher().stepOpen();
  const auto gather_start = Clock::now();
  WireReport mine{};
  mine.samples = mine_.samples;
  mine.seconds = mine_.seconds;
  mine.energy_joules = mine_.energy_joules;
  mine.load = mine_.load;
  mine.plan_fingerprint = have_step ? state_.dispatcher().current().fingerprint() : 0;
  mine.has_report = have_step ? 1 : 0;
  std::vector<WireReport> all(static_cast<size_t>(comm_->size()));
  comm_->allgather(&mine, all.data(), sizeof(WireReport), DataType::kUInt8);
  gather_seconds_ = secondsSince(gather_start);

  const auto plan_start = Clock::now();
  reports_.assign(static_cast<size_t>(state_.dispatcher().worldSize()), RankReport{});
  for (size_t r = 0; r < all.size(); ++r) {
    const WireReport& w = all[r];
    reports_[static_cast<size_t>(ranks_[r])] =
        RankReport{w.samples, w.seconds, w.energy_joules, w.load, w.plan_fingerprint};
  }
  // Every rank must have run the same plan; a difference means the ranks' dispatchers
  // diverged (different options, different binaries), and training would skip or repeat
  // samples. Say so everywhere.
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].plan_fingerprint != all[0].plan_fingerprint ||
        all[r].has_report != all[0].has_report) {
      throw MismatchError("dispatcher: rank " + std::to_string(ranks_[r]) + " ran step " +
                          std::to_string(state_.dispatcher().current().step) + " with plan " +
                          std::to_string(all[r].plan_fingerprint) + ", rank " +
                          std::to_string(ranks_[0]) + " with " +
                          std::to_string(all[0].plan_fingerprint) +
                          " (same DispatchOptions and batch sizes on every rank?)");
    }
  }
  const StepPlan& plan = state_.advance(global_batch, reports_);
  mine_ = RankReport{};
  plan_seconds_ = secondsSince(plan_start);
  ++steps_;
  if (comm_->config().metricsOn()) {
    exportMetrics(state_.dispatcher(), my_rank_, comm_->worldRank());
  }
  if (trace::enabled()) {
    // Shares and the estimates behind them over time, by launch rank, and each rank's power
    // and samples per joule (docs/tracing.md).
    const Dispatcher& d = state_.dispatcher();
    const auto& estimator = d.estimator();
    std::vector<double> shares(plan.samples.begin(), plan.samples.end());
    std::vector<double> rates;
    std::vector<double> watts;
    std::vector<double> per_joule;
    for (int r = 0; r < estimator.ranks(); ++r) {
      rates.push_back(estimator.rate(r));
      watts.push_back(d.load(r).power_watts);
      per_joule.push_back(d.joulesPerSample(r) > 0 ? 1 / d.joulesPerSample(r) : 0);
    }
    trace::recordCounter(comm_->worldRank(), "shares", std::move(shares));
    trace::recordCounter(comm_->worldRank(), "throughput", std::move(rates));
    trace::recordCounter(comm_->worldRank(), "power_watts", std::move(watts));
    trace::recordCounter(comm_->worldRank(), "samples_per_joule", std::move(per_joule));
  }
  if (log_every_ > 0 && comm_->rank() == 0 && steps_ % static_cast<uint64_t>(log_every_) == 0) {
    RS_LOG_INFO("dispatch {}", describe(plan, state_.dispatcher().estimator()));
  } else {
    RS_LOG_DEBUG("dispatch {}", describe(plan, state_.dispatcher().estimator()));
  }
  return plan.ranges[static_cast<size_t>(my_rank_)];
}

void CollectiveDispatcher::finishStep(double samples, double seconds, const LoadSignals& load,
                                      double energy_joules) {
  // Refused here, before it could reach the others' plans.
  checkReport(RankReport{samples, seconds, energy_joules, load, 0},
              "rank " + std::to_string(my_rank_));
  mine_.samples = samples;
  mine_.seconds = seconds;
  mine_.energy_joules = energy_joules;
  mine_.load = load;
}

void CollectiveDispatcher::commitStep() {
  state_.commit();
}

Recovery CollectiveDispatcher::recover(Communicator& survivors) {
  const auto start = Clock::now();
  const std::vector<int> launch = survivors.worldRanks();
  std::vector<int> ranks(launch.size());
  std::vector<bool> survives(static_cast<size_t>(state_.dispatcher().worldSize()), false);
  for (size_t r = 0; r < launch.size(); ++r) {
    const auto it = std::find(members_.begin(), members_.end(), launch[r]);
    if (it == members_.end()) {
      throw InvalidArgument("CollectiveDispatcher::recover: launch rank " +
                            std::to_string(launch[r]) +
                            " was not a member of the group this dispatcher was built on");
    }
    ranks[r] = static_cast<int>(it - members_.begin());
    survives[static_cast<size_t>(ranks[r])] = true;
  }
  const int me = ranks[static_cast<size_t>(survivors.rank())];
  if (me != my_rank_) {
    throw InvalidArgument("CollectiveDispatcher::recover: this process is rank " +
                          std::to_string(my_rank_) + " here but " + std::to_string(me) +
                          " among the survivors");
  }

  const Position position = state_.position();
  const WirePosition wire{position.committed, position.completed, position.open ? 1u : 0u,
                          static_cast<uint64_t>(my_rank_)};
  std::vector<WirePosition> all(launch.size());
  survivors.allgather(&wire, all.data(), sizeof(WirePosition), DataType::kUInt8);
  std::vector<Position> positions;
  for (const WirePosition& w : all) positions.push_back({w.committed, w.completed, w.open != 0});
  const Recovery recovery = state_.recover(positions, survives);

  // Every survivor must now hold the same dispatcher: same plan for the step to redo, same
  // epoch position, same estimates. A difference would repeat or drop samples later.
  checkSameState(survivors, ranks, "dispatcher recovery");
  comm_ = &survivors;
  ranks_ = ranks;
  mine_ = RankReport{};
  recover_seconds_ = secondsSince(start);
  if (survivors.rank() == 0) {
    std::string failed;
    for (const int r : recovery.failed) {
      if (!failed.empty()) failed += ',';
      failed += std::to_string(r);
    }
    RS_LOG_INFO(
        "dispatch: recovered on {} ranks (lost [{}]); steps 0..{} stand, step {} {} ({:.1f} ms)",
        survivors.size(), failed, static_cast<long long>(recovery.committed) - 1,
        recovery.committed, recovery.redo ? "is redone with reassigned ranges" : "is replanned",
        recover_seconds_ * 1e3);
  }
  return recovery;
}

void CollectiveDispatcher::checkSameState(Communicator& comm, const std::vector<int>& ranks,
                                          const char* what) const {
  const uint64_t fingerprint = state_.fingerprint();
  std::vector<uint64_t> fingerprints(static_cast<size_t>(comm.size()));
  comm.allgather(&fingerprint, fingerprints.data(), sizeof(uint64_t), DataType::kUInt8);
  for (size_t r = 0; r < fingerprints.size(); ++r) {
    if (fingerprints[r] != fingerprints[0]) {
      throw MismatchError(std::string(what) + ": rank " + std::to_string(ranks[r]) +
                          " ended in state " + std::to_string(fingerprints[r]) + ", rank " +
                          std::to_string(ranks[0]) + " in " + std::to_string(fingerprints[0]));
    }
  }
}

size_t CollectiveDispatcher::mySamples() const {
  const StepPlan& plan = state_.dispatcher().current();
  if (plan.samples.empty()) return 0;
  return plan.samples[static_cast<size_t>(my_rank_)];
}

const std::vector<Range>& CollectiveDispatcher::myRanges() const {
  static const std::vector<Range> kNone;
  const StepPlan& plan = state_.dispatcher().current();
  if (plan.ranges.empty()) return kNone;
  return plan.ranges[static_cast<size_t>(my_rank_)];
}

bool CollectiveDispatcher::epochDone() const {
  // The open step's samples count as done once it is run: the epoch ends with the step that
  // assigns its last samples.
  const Dispatcher& d = state_.dispatcher();
  if (d.epochDone()) return true;
  return d.stepOpen() && d.assigned() == d.epochSize();
}

}  // namespace railshard::dispatch
