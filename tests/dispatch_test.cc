// The dispatcher's logic (pure: no I/O) and, over a real communicator, the per-step
// all-gather that keeps every rank's plan identical and the sample-weighted gradient.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "core/dispatch/collective_dispatcher.h"
#include "core/dispatch/dispatcher.h"
#include "core/dispatch/sample_weighted.h"
#include "core/dispatch/static_weights.h"
#include "core/topology/topology.h"
#include "launcher/load_monitor.h"
#include "test_util.h"

namespace railshard::dispatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

size_t sum(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t{0});
}

// ---- splitting ----

TEST(LargestRemainder, SharesAddUpAndFollowTheWeights) {
  EXPECT_THAT(largestRemainder(7, {1, 2, 4}), ElementsAre(1, 2, 4));
  EXPECT_THAT(largestRemainder(10, {1, 1, 1}), ElementsAre(4, 3, 3));
  EXPECT_THAT(largestRemainder(10, {1, 1, 1}, 0, 1), ElementsAre(3, 4, 3));  // ties rotate
  EXPECT_THAT(largestRemainder(10, {1, 1, 1}, 0, 2), ElementsAre(3, 3, 4));
  EXPECT_THAT(largestRemainder(5, {1, 0, 3}), ElementsAre(1, 0, 4));  // 1.25 / 3.75
  EXPECT_THAT(largestRemainder(0, {1, 2}), ElementsAre(0, 0));
  // A minimum per rank when the batch allows it, the rest by weight.
  EXPECT_THAT(largestRemainder(10, {1, 100}, 2), ElementsAre(2, 8));
  EXPECT_THAT(largestRemainder(3, {1, 100, 1}, 2), ElementsAre(1, 1, 1));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t n = 1 + rng() % 9;
    std::vector<double> w(n);
    for (auto& x : w) x = (rng() % 4 == 0) ? 0 : std::ldexp(1.0 + rng() % 1000, -(rng() % 8));
    if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; })) w[0] = 1;
    const size_t units = rng() % 5000;
    const auto shares = largestRemainder(units, w);
    ASSERT_EQ(sum(shares), units);
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    for (size_t r = 0; r < n; ++r) {
      const double quota = units * w[r] / total;
      EXPECT_LE(std::abs(static_cast<double>(shares[r]) - quota), 1.0) << "trial " << trial;
      if (w[r] == 0) {
        EXPECT_EQ(shares[r], 0u);
      }
    }
  }
}

TEST(LargestRemainder, BadWeightsAreInvalidArguments) {
  EXPECT_THROW(largestRemainder(3, {1, -1}), InvalidArgument);
  EXPECT_THROW(largestRemainder(3, {1, NAN}), InvalidArgument);
  try {
    largestRemainder(3, {0, 0});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 units to share but no rank takes part"));
  }
}

TEST(Policies, RoundRobinWeightedAndLeastLoaded) {
  EXPECT_THAT(roundRobin(10, {1, 1, 1}, 0), ElementsAre(4, 3, 3));
  EXPECT_THAT(roundRobin(10, {1, 1, 1}, 2), ElementsAre(3, 3, 4));
  EXPECT_THAT(roundRobin(10, {1, 0, 5}, 1), ElementsAre(5, 0, 5));  // weights only gate
  EXPECT_THAT(weightedRoundRobin(7, {5, 1, 1}), ElementsAre(5, 1, 1));
  EXPECT_THAT(weightedRoundRobin(14, {1, 2, 4}), ElementsAre(2, 4, 8));
  // Rates 1:3, nothing queued: like proportional. Rank 1 with 8 queued: rank 0 catches up first.
  EXPECT_THAT(leastLoaded(8, {1, 3}, {0, 0}), ElementsAre(2, 6));
  EXPECT_THAT(leastLoaded(8, {1, 3}, {0, 8}), ElementsAre(4, 4));
  EXPECT_EQ(parsePolicy("equal"), Policy::kRoundRobin);
  EXPECT_EQ(parsePolicy("least_loaded"), Policy::kLeastLoaded);
  try {
    parsePolicy("fastest");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown dispatch policy 'fastest'"));
  }
}

// ---- throughput estimation ----

TEST(ThroughputEstimator, WarmsUpSmoothsAndIgnoresOneOutlier) {
  ThroughputEstimator e(2, {2.0, 1.5});
  EXPECT_FALSE(e.warm());
  e.report(0, 100, 1.0);
  EXPECT_FALSE(e.warm());
  EXPECT_DOUBLE_EQ(e.rate(0), 100);
  EXPECT_EQ(e.rate(1), 0);
  e.report(1, 50, 1.0);
  EXPECT_TRUE(e.warm());
  // Within the jump ratio: EWMA with half-life 2 steps (alpha = 1 - 0.5^(1/2)).
  const double alpha = 1 - std::sqrt(0.5);
  e.report(0, 120, 1.0);
  EXPECT_NEAR(e.rate(0), 100 + alpha * 20, 1e-9);
  const double before = e.rate(0);
  e.report(0, 10, 1.0);  // one terrible step (a hiccup): held back
  EXPECT_DOUBLE_EQ(e.rate(0), before);
  e.report(0, 100, 1.0);  // back to normal: the hiccup is forgotten
  EXPECT_NEAR(e.rate(0), before + alpha * (100 - before), 1e-9);
  e.report(0, 0, 0);  // nothing measured: no change
  EXPECT_NEAR(e.rate(0), before + alpha * (100 - before), 1e-9);
}

TEST(ThroughputEstimator, ARealSlowdownIsTrackedAfterTwoSteps) {
  ThroughputEstimator e(1, {2.0, 1.5});
  for (int i = 0; i < 5; ++i) e.report(0, 400, 1.0);
  e.report(0, 200, 1.0);
  EXPECT_DOUBLE_EQ(e.rate(0), 400);  // one step: could be noise
  e.report(0, 204, 1.0);
  EXPECT_DOUBLE_EQ(e.rate(0), 202);  // twice: the rank changed; jump to the two samples' mean
  e.report(0, 200, 1.0);
  EXPECT_NEAR(e.rate(0), 202 - (1 - std::sqrt(0.5)) * 2, 1e-9);
}

TEST(ThroughputEstimator, BadReportsAreRejected) {
  ThroughputEstimator e(2);
  EXPECT_THROW(e.report(2, 1, 1), InvalidArgument);
  EXPECT_THROW(e.report(0, -1, 1), InvalidArgument);
  EXPECT_THROW(e.report(0, 1, INFINITY), InvalidArgument);
  EXPECT_THROW(ThroughputEstimator(2, {0.0, 1.5}), InvalidArgument);
  EXPECT_THROW(ThroughputEstimator(2, {1.0, 1.0}), InvalidArgument);
}

// ---- the dispatcher ----

// Simulated ranks with fixed speeds (samples per second): what each processes and how long.
struct Simulation {
  std::vector<double> speeds;
  std::map<uint64_t, int> processed;  // sample index -> times processed

  double runStep(Dispatcher& d, const StepPlan& plan) {
    double slowest = 0;
    for (size_t r = 0; r < plan.samples.size(); ++r) {
      if (!d.alive(static_cast<int>(r))) continue;
      for (const Range& range : plan.ranges[r]) {
        for (uint64_t i = range.begin; i < range.end; ++i) ++processed[i];
      }
      const double seconds = static_cast<double>(plan.samples[r]) / speeds[r];
      d.report(static_cast<int>(r), static_cast<double>(plan.samples[r]), seconds);
      slowest = std::max(slowest, seconds);
    }
    d.completeStep();
    return slowest;
  }

  void expectEachSampleOnce(uint64_t epoch_size) const {
    ASSERT_EQ(processed.size(), epoch_size);
    for (const auto& [index, times] : processed) {
      ASSERT_LT(index, epoch_size);
      ASSERT_EQ(times, 1) << "sample " << index;
    }
  }
};

TEST(Dispatcher, ProportionalConvergesToTheIdealAfterOneStep) {
  DispatchOptions options;
  options.micro_batch = 4;
  Dispatcher d(3, 7 * 4 * 100, options);
  Simulation sim{{100, 200, 400}, {}};
  const StepPlan& first = d.plan(7 * 4 * 10);
  EXPECT_THAT(first.samples, ElementsAre(96, 92, 92));  // warm-up: equal, whole micro-batches
  const double equal_time = sim.runStep(d, first);
  const StepPlan& second = d.plan(7 * 4 * 10);
  EXPECT_THAT(second.samples, ElementsAre(40, 80, 160));  // 1:2:4
  const double ideal = 280.0 / 700.0;
  EXPECT_NEAR(equal_time / ideal, 96.0 / 100 / ideal, 1e-9);  // ~2.4x: the equal penalty
  EXPECT_DOUBLE_EQ(sim.runStep(d, second), ideal);
  // Every plan's ranges are contiguous and cover the step exactly.
  EXPECT_EQ(second.ranges[0][0].begin, 280u);
  EXPECT_EQ(second.ranges[2][0].end, 560u);
}

TEST(Dispatcher, EpochCoversEverySampleOnceWithATail) {
  DispatchOptions options;
  options.micro_batch = 8;
  const uint64_t epoch = 1000;  // not a multiple of the batch or the micro-batch
  Dispatcher d(3, epoch, options);
  Simulation sim{{1, 3, 5}, {}};
  while (!d.epochDone()) {
    const StepPlan& plan = d.plan(96);
    EXPECT_LE(plan.total(), 96u);
    sim.runStep(d, plan);
  }
  sim.expectEachSampleOnce(epoch);
  EXPECT_EQ(d.done(), epoch);
  EXPECT_THROW(d.plan(96), InvalidArgument);
  d.newEpoch();
  EXPECT_EQ(d.plan(96).ranges[0][0].begin, 0u);
}

TEST(Dispatcher, AFailedRanksWorkMovesToTheSurvivorsNothingLostNothingTwice) {
  for (const Policy policy : {Policy::kProportional, Policy::kRoundRobin,
                              Policy::kWeightedRoundRobin, Policy::kLeastLoaded}) {
    SCOPED_TRACE(std::string(name(policy)));
    DispatchOptions options;
    options.policy = policy;
    options.micro_batch = 5;
    const uint64_t epoch = 4321;
    Dispatcher d(4, epoch, options);
    Simulation sim{{10, 20, 30, 40}, {}};
    int step = 0;
    while (!d.epochDone()) {
      d.plan(200);
      if (step == 3) {
        // Rank 2 dies mid-step, before finishing anything: its ranges go to 0, 1 and 3.
        const size_t before = d.current().total();
        const StepPlan& moved = d.markFailed(2);
        EXPECT_EQ(moved.samples[2], 0u);
        EXPECT_TRUE(moved.ranges[2].empty());
        EXPECT_EQ(moved.total(), before);
      }
      sim.runStep(d, d.current());
      ++step;
    }
    sim.expectEachSampleOnce(epoch);
    EXPECT_FALSE(d.alive(2));
    EXPECT_EQ(d.liveRanks(), 3);
  }
}

TEST(Dispatcher, FailureErrorsAndElasticGrowth) {
  Dispatcher d(2, 100, {});
  d.plan(10);
  EXPECT_THROW(d.plan(10), InvalidArgument);  // step still open
  d.markFailed(1);
  EXPECT_THAT(d.current().samples, ElementsAre(10, 0));
  try {
    d.markFailed(1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 has already failed"));
  }
  try {
    d.markFailed(0);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("last live rank"));
  }
  d.report(0, 10, 1.0);
  d.completeStep();
  EXPECT_EQ(d.addRank(), 2);  // joins: gets the median rate until it reports
  const StepPlan& plan = d.plan(20);
  EXPECT_THAT(plan.samples, ElementsAre(10, 0, 10));
}

TEST(Dispatcher, LeastLoadedCountsQueuedWorkAndWeightedUsesStaticWeights) {
  DispatchOptions ll;
  ll.policy = Policy::kLeastLoaded;
  Dispatcher a(2, 1000, ll);
  a.plan(10);
  a.report(0, 10, 1.0);
  a.report(1, 10, 1.0);
  a.completeStep();
  LoadSignals queued;
  queued.queued_samples = 20;  // rank 0 still has 20 samples of other work queued
  a.setLoad(0, queued);
  EXPECT_THAT(a.plan(40).samples, ElementsAre(10, 30));

  DispatchOptions wrr;
  wrr.policy = Policy::kWeightedRoundRobin;
  wrr.weights = {3, 1};
  Dispatcher b(2, 1000, wrr);
  EXPECT_THAT(b.plan(40).samples, ElementsAre(30, 10));
  EXPECT_THROW(Dispatcher(3, 10, wrr), InvalidArgument);  // 2 weights for 3 ranks
}

// ---- elastic continuation (pure: ElasticState) ----

// Where the lost rank is when it dies in step k, and how far each survivor gets past that.
enum class FailurePoint {
  kBeforeAllreduce,  // it computed step k and dies: every survivor fails in k's all-reduce
  kInAllreduce,      // it sent its part of k's all-reduce: survivors in `through` complete it
                     // (and fail in step k+1's all-gather), the others fail in it
  kAfterAllreduce,   // everyone completed k's all-reduce; survivors fail in k+1's all-gather
  kInGather,         // it sent its report in k+1's all-gather: survivors in `through` get
                     // the plan of k+1 and compute it (and fail in its all-reduce), the
                     // others fail in the all-gather
};

const char* pointName(FailurePoint point) {
  switch (point) {
    case FailurePoint::kBeforeAllreduce:
      return "before all-reduce";
    case FailurePoint::kInAllreduce:
      return "in all-reduce";
    case FailurePoint::kAfterAllreduce:
      return "after all-reduce";
    case FailurePoint::kInGather:
      return "in next all-gather";
  }
  return "?";
}

struct Failure {
  int attempt = 0;  // the attempt (a step run, redone steps counted again) it hits
  int rank = 0;
  FailurePoint point = FailurePoint::kBeforeAllreduce;
  std::vector<bool> through;  // by rank: survivors that get past the failing collective
};

// Ranks of a data-parallel job as the step protocol sees them, with a model that is nothing
// but a count per (epoch, sample) of how often its gradient went into the weights: the
// independent reference. An all-reduce adds every participant's computed ranges to the model
// of each rank that completes it; undoing a step subtracts them again.
class ElasticCluster {
 public:
  ElasticCluster(const std::vector<double>& speeds, uint64_t epoch, DispatchOptions options,
                 size_t batch)
      : batch_(batch), epoch_(epoch) {
    for (const double speed : speeds) {
      ranks_.push_back(Rank{ElasticState(static_cast<int>(speeds.size()), epoch, options),
                            speed,
                            true,
                            {},
                            0,
                            {},
                            {},
                            {}});
    }
  }

  // Runs attempts until the epoch's last step is committed, injecting `failures`.
  void runEpoch(const std::vector<Failure>& failures) {
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const Failure* failure = nullptr;
      for (const Failure& f : failures) {
        if (f.attempt == attempt && ranks_[static_cast<size_t>(f.rank)].alive) failure = &f;
      }
      runAttempt(failure);
      // Steps are numbered on through epochs: epoch 0 is over when its last one is committed.
      if (survivor().state.committed() >= (epoch_ + batch_ - 1) / batch_) return;
    }
    FAIL() << "epoch never finished";
  }

  // Every survivor's model holds each sample of epoch 0 exactly once and nothing else.
  void expectEachSampleOnce() const {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const Rank& rank = ranks_[r];
      if (!rank.alive) continue;
      std::vector<int> counts(epoch_, 0);
      for (const auto& [key, times] : rank.model) {
        ASSERT_EQ(key.first, 0u) << "rank " << r << ": a sample of epoch " << key.first;
        ASSERT_LT(key.second, epoch_);
        counts[key.second] = times;
      }
      size_t missing = 0, repeated = 0;
      for (uint64_t i = 0; i < epoch_; ++i) {
        missing += counts[i] == 0;
        repeated += counts[i] > 1;
      }
      EXPECT_EQ(missing, 0u) << "rank " << r;
      EXPECT_EQ(repeated, 0u) << "rank " << r;
    }
  }

  std::vector<Recovery> recoveries;  // of the first survivor, one per failure
  std::vector<bool> undone;          // any survivor undid a step, per failure
  const ElasticState& state(int r) const { return ranks_[static_cast<size_t>(r)].state; }

 private:
  struct Rank {
    ElasticState state;
    double speed = 1;
    bool alive = true;
    std::vector<Range> computing;
    uint64_t computing_epoch = 0;
    RankReport report;
    std::map<std::pair<uint64_t, uint64_t>, int> model;
    std::vector<std::pair<uint64_t, Range>> last_applied;
  };
  using Contribution = std::vector<std::pair<uint64_t, Range>>;

  const Rank& survivor() const {
    for (const Rank& r : ranks_) {
      if (r.alive) return r;
    }
    throw std::logic_error("nobody alive");
  }

  // The start-of-step all-gather has passed on `rank`: it commits what it ran (it is past the
  // step) and plans the next step, or takes the step to redo.
  void startStep(Rank& rank, const std::vector<RankReport>& reports) {
    if (rank.state.redoPending()) {
      const StepPlan& plan = rank.state.takeRedo();
      rank.computing = plan.ranges[index(rank)];
    } else {
      if (rank.state.dispatcher().stepOpen() && !rank.state.openStepCommitted()) {
        rank.state.commit();
      }
      rank.computing = rank.state.advance(batch_, reports).ranges[index(rank)];
    }
    rank.computing_epoch = rank.state.dispatcher().epoch();
  }
  void compute(Rank& rank) {
    double samples = 0;
    for (const Range& r : rank.computing) samples += static_cast<double>(r.size());
    rank.report = RankReport{samples, samples / rank.speed, {}, 0};
  }
  std::vector<RankReport> reports() const {
    std::vector<RankReport> all(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) all[r] = ranks_[r].report;
    return all;
  }
  Contribution contributions(const std::vector<size_t>& participants) const {
    Contribution all;
    for (const size_t r : participants) {
      for (const Range& range : ranks_[r].computing) {
        all.emplace_back(ranks_[r].computing_epoch, range);
      }
    }
    return all;
  }
  void apply(Rank& rank, const Contribution& contribution) {
    for (const auto& [epoch, range] : contribution) {
      for (uint64_t i = range.begin; i < range.end; ++i) ++rank.model[{epoch, i}];
    }
    rank.last_applied = contribution;
    rank.state.commit();
  }
  size_t index(const Rank& rank) const { return static_cast<size_t>(&rank - ranks_.data()); }
  std::vector<size_t> live() const {
    std::vector<size_t> out;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].alive) out.push_back(r);
    }
    return out;
  }

  void runAttempt(const Failure* failure) {
    const std::vector<size_t> everyone = live();
    // A redo needs no all-gather; otherwise the reports of the live ranks.
    const std::vector<RankReport> gathered = reports();
    for (const size_t r : everyone) startStep(ranks_[r], gathered);
    for (const size_t r : everyone) compute(ranks_[r]);
    const Contribution all = contributions(everyone);
    if (failure == nullptr) {
      for (const size_t r : everyone) apply(ranks_[r], all);
      return;
    }
    Rank& dead = ranks_[static_cast<size_t>(failure->rank)];
    const auto through = [&](size_t r) {
      return r < failure->through.size() && failure->through[r];
    };
    switch (failure->point) {
      case FailurePoint::kBeforeAllreduce:
        dead.alive = false;
        break;
      case FailurePoint::kInAllreduce:
        dead.alive = false;
        for (const size_t r : live()) {
          if (through(r)) apply(ranks_[r], all);
        }
        break;
      case FailurePoint::kAfterAllreduce:
        for (const size_t r : everyone) apply(ranks_[r], all);
        dead.alive = false;
        break;
      case FailurePoint::kInGather: {
        for (const size_t r : everyone) apply(ranks_[r], all);
        const std::vector<RankReport> next = reports();
        dead.alive = false;
        for (const size_t r : live()) {
          if (!through(r)) continue;
          startStep(ranks_[r], next);
          compute(ranks_[r]);
        }
        break;
      }
    }
    recover();
  }

  // Every survivor: shrink (here: the survivor set) and recover.
  void recover() {
    const std::vector<size_t> survivors = live();
    std::vector<Position> positions;
    std::vector<bool> survives(ranks_.size(), false);
    for (const size_t r : survivors) {
      positions.push_back(ranks_[r].state.position());
      survives[r] = true;
    }
    std::reverse(positions.begin(), positions.end());  // any order will do
    bool any_undo = false;
    std::vector<uint64_t> fingerprints;
    for (const size_t r : survivors) {
      Rank& rank = ranks_[r];
      const uint64_t committed_before = rank.state.committed();
      const Recovery recovery = rank.state.recover(positions, survives);
      EXPECT_EQ(recovery.undo_last_step, committed_before > recovery.committed);
      if (recovery.undo_last_step) {
        // Back to the model before the last step: what an application restores from its
        // one-step snapshot.
        for (const auto& [epoch, range] : rank.last_applied) {
          for (uint64_t i = range.begin; i < range.end; ++i) --rank.model[{epoch, i}];
        }
        any_undo = true;
      }
      rank.last_applied.clear();
      if (r == survivors.front()) recoveries.push_back(recovery);
      fingerprints.push_back(rank.state.fingerprint());
    }
    undone.push_back(any_undo);
    for (const uint64_t f : fingerprints) ASSERT_EQ(f, fingerprints.front());
    for (auto& rank : ranks_) rank.report = RankReport{};
    for (auto& rank : ranks_) {
      std::erase_if(rank.model, [](const auto& entry) { return entry.second == 0; });
    }
  }

  size_t batch_;
  uint64_t epoch_;
  std::vector<Rank> ranks_;
};

TEST(ElasticState, EverySampleOnceWhereverAStepIsHitAndHoweverFarSurvivorsGot) {
  const uint64_t epoch = 1000;  // 10 steps of 96 and a tail of 40
  const size_t batch = 96;
  int scenarios = 0;
  for (const Policy policy : {Policy::kProportional, Policy::kRoundRobin,
                              Policy::kWeightedRoundRobin, Policy::kLeastLoaded}) {
    for (const FailurePoint point : {FailurePoint::kBeforeAllreduce, FailurePoint::kInAllreduce,
                                     FailurePoint::kAfterAllreduce, FailurePoint::kInGather}) {
      for (const int attempt : {0, 1, 4, 9, 10}) {  // 10: the epoch's last (tail) step
        for (int mask = 0; mask < 8; ++mask) {      // which of survivors 0, 1, 3 get through
          SCOPED_TRACE(std::string(name(policy)) + ", rank 2 lost " + pointName(point) +
                       " of attempt " + std::to_string(attempt) + ", through mask " +
                       std::to_string(mask));
          DispatchOptions options;
          options.policy = policy;
          options.micro_batch = 5;
          options.weights = {1, 2, 3, 4};
          ElasticCluster cluster({10, 20, 30, 40}, epoch, options, batch);
          Failure failure{
              attempt, 2, point, {(mask & 1) != 0, (mask & 2) != 0, false, (mask & 4) != 0}};
          cluster.runEpoch({failure});
          cluster.expectEachSampleOnce();
          ASSERT_EQ(cluster.recoveries.size(), 1u);
          const Recovery& recovery = cluster.recoveries[0];
          EXPECT_THAT(recovery.failed, ElementsAre(2));
          // Which way the survivors went depends only on where they stood.
          const bool all = mask == 7, none = mask == 0;
          switch (point) {
            case FailurePoint::kBeforeAllreduce:
              EXPECT_TRUE(recovery.redo);
              EXPECT_EQ(recovery.committed, static_cast<uint64_t>(attempt));
              EXPECT_FALSE(cluster.undone[0]);
              break;
            case FailurePoint::kInAllreduce:
              // Some completed step k: it is undone unless all did.
              EXPECT_EQ(recovery.redo, !all);
              EXPECT_EQ(recovery.committed, static_cast<uint64_t>(attempt + (all ? 1 : 0)));
              EXPECT_EQ(cluster.undone[0], !all && !none);
              break;
            case FailurePoint::kAfterAllreduce:
              EXPECT_FALSE(recovery.redo);
              EXPECT_EQ(recovery.committed, static_cast<uint64_t>(attempt + 1));
              EXPECT_FALSE(cluster.undone[0]);
              break;
            case FailurePoint::kInGather:
              EXPECT_EQ(recovery.committed, static_cast<uint64_t>(attempt + 1));
              // The last step has no next step to plan in this epoch... but the next
              // epoch's first step: planned by those through, so the same rule holds.
              EXPECT_EQ(recovery.redo, all);
              EXPECT_FALSE(cluster.undone[0]);
              break;
          }
          ++scenarios;
        }
      }
    }
  }
  EXPECT_EQ(scenarios, 4 * 4 * 5 * 8);
}

TEST(ElasticState, TwoFailuresAtRandomPointsStillEverySampleOnce) {
  std::mt19937 rng(11);
  const std::vector<Policy> policies = {Policy::kProportional, Policy::kRoundRobin,
                                        Policy::kWeightedRoundRobin, Policy::kLeastLoaded};
  const std::vector<FailurePoint> points = {FailurePoint::kBeforeAllreduce,
                                            FailurePoint::kInAllreduce,
                                            FailurePoint::kAfterAllreduce, FailurePoint::kInGather};
  for (int trial = 0; trial < 400; ++trial) {
    DispatchOptions options;
    options.policy = policies[rng() % policies.size()];
    options.micro_batch = 1 + rng() % 7;
    options.weights = {5, 1, 2, 3, 4};
    const size_t batch = 50 + rng() % 100;
    const uint64_t epoch = batch * (10 + rng() % 4) + rng() % batch;  // >= 10 steps
    std::vector<Failure> failures(2);
    failures[0].rank = static_cast<int>(rng() % 5);
    failures[1].rank = static_cast<int>((failures[0].rank + 1 + rng() % 4) % 5);
    failures[0].attempt = static_cast<int>(rng() % 6);
    // The second can hit the very attempt that redoes the first one's step.
    failures[1].attempt = failures[0].attempt + 1 + static_cast<int>(rng() % 3);
    std::string trace = "trial " + std::to_string(trial) + " " + std::string(name(options.policy));
    for (Failure& f : failures) {
      f.point = points[rng() % points.size()];
      f.through.resize(5);
      for (size_t r = 0; r < 5; ++r) f.through[r] = rng() % 2 == 0;
      trace += ", rank " + std::to_string(f.rank) + " lost " + pointName(f.point) + " of attempt " +
               std::to_string(f.attempt);
    }
    SCOPED_TRACE(trace);
    ElasticCluster cluster({1, 5, 2, 3, 4}, epoch, options, batch);
    cluster.runEpoch(failures);
    cluster.expectEachSampleOnce();
    EXPECT_EQ(cluster.recoveries.size(), 2u);
    if (HasFailure()) break;
  }
}

TEST(ElasticState, EstimatesSurviveAndTheRedoneStepIsSharedByTheSurvivorsSpeeds) {
  DispatchOptions options;
  options.micro_batch = 4;
  // Ranks 1:2:4 (samples/s); rank 2 dies after computing step 3, before its all-reduce.
  ElasticCluster cluster({100, 200, 400}, 280 * 8, options, 280);
  cluster.runEpoch({Failure{3, 2, FailurePoint::kBeforeAllreduce, {}}});
  cluster.expectEachSampleOnce();
  ASSERT_EQ(cluster.recoveries.size(), 1u);
  EXPECT_TRUE(cluster.recoveries[0].redo);
  EXPECT_EQ(cluster.recoveries[0].committed, 3u);
  // The estimates of ranks 0 and 1 are kept (no warm-up split after the failure).
  const Dispatcher& d = cluster.state(0).dispatcher();
  EXPECT_NEAR(d.estimator().rate(0), 100, 1e-6);
  EXPECT_NEAR(d.estimator().rate(1), 200, 1e-6);
  EXPECT_FALSE(d.alive(2));
  // The last plan (step 7) splits 280 as 1:2 in whole micro-batches: 23 and 47 units.
  EXPECT_THAT(d.current().samples, ElementsAre(92, 188, 0));

  // The redone step: rank 2's 160 samples of step 3 went 1:2 to the survivors (13 and 27
  // micro-batches), on top of their own 40 and 80.
  ElasticState lone(3, 280 * 8, options);
  const std::vector<RankReport> none(3);
  std::vector<RankReport> reports = {{40, 0.4, {}, 0}, {80, 0.4, {}, 0}, {160, 0.4, {}, 0}};
  lone.advance(280, none);
  lone.commit();
  lone.advance(280, reports);
  EXPECT_THAT(lone.dispatcher().current().samples, ElementsAre(40, 80, 160));
  const Recovery recovery = lone.recover({lone.position(), lone.position()}, {true, true, false});
  EXPECT_TRUE(recovery.redo);
  EXPECT_FALSE(recovery.undo_last_step);
  EXPECT_EQ(recovery.committed, 1u);
  EXPECT_THAT(lone.dispatcher().current().samples, ElementsAre(92, 188, 0));
  EXPECT_EQ(lone.dispatcher().current().total(), 280u);
  EXPECT_THROW(lone.advance(280, reports), InvalidArgument);  // the redo comes first
  EXPECT_EQ(lone.takeRedo().step, 1u);
}

TEST(ElasticState, PositionsThatCannotComeFromOneRunAreRefused) {
  ElasticState state(3, 1000, {});
  state.advance(10, std::vector<RankReport>(3));
  state.commit();
  try {
    // One survivor claims 5 steps committed while this one has 1: not one run.
    state.recover({state.position(), Position{5, 5, true}}, {true, true, false});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("more than one step apart"));
  }
  EXPECT_THROW(state.recover({state.position()}, {true, true}), InvalidArgument);
  // An uncommitted step cannot be completed.
  ElasticState fresh(2, 1000, {});
  fresh.advance(10, std::vector<RankReport>(2));
  EXPECT_THROW(fresh.advance(10, std::vector<RankReport>(2)), InvalidArgument);
  fresh.commit();
  EXPECT_THROW(fresh.commit(), InvalidArgument);
}

TEST(Dispatcher, UnplanGivesTheStepBack) {
  Dispatcher d(3, 1000, {});
  d.plan(90);
  d.completeStep();
  const uint64_t before = d.stateFingerprint();
  d.plan(90);
  d.markFailed(1);
  d.unplan();
  EXPECT_EQ(d.assigned(), 90u);
  EXPECT_EQ(d.completedSteps(), 1u);
  EXPECT_NE(d.stateFingerprint(), before);  // rank 1 stays failed
  const StepPlan& again = d.plan(90);
  EXPECT_EQ(again.step, 1u);
  EXPECT_EQ(again.ranges[0][0].begin, 90u);
  EXPECT_THAT(again.samples, ElementsAre(45, 0, 45));
  EXPECT_THROW(Dispatcher(2, 10, {}).unplan(), InvalidArgument);
}

// ---- over a real communicator ----

std::vector<std::unique_ptr<Communicator>> makeWorld(
    MemoryStore& store, int size, std::shared_ptr<const topology::Topology> graph = nullptr) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(size));
  test::rethrowFirst(test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config.token = "dispatch-test";
    options.config.transport = TransportKind::kTcp;
    options.config.timeout = std::chrono::seconds(30);
    options.topology = graph;
    comms[static_cast<size_t>(rank)] = Communicator::create(store, options);
  }));
  return comms;
}

TEST(CollectiveDispatcher, EveryRankComputesTheSamePlansAndTheEpochIsCoveredOnce) {
  MemoryStore store;
  const int size = 3;
  auto comms = makeWorld(store, size);
  const uint64_t epoch = 2000;
  std::vector<std::vector<StepPlan>> plans(size);
  std::vector<std::vector<Range>> mine(size);
  test::rethrowFirst(test::runRanks(size, [&](int rank) {
    DispatchOptions options;
    options.micro_batch = 4;
    CollectiveDispatcher d(*comms[static_cast<size_t>(rank)], epoch, options);
    const double speed = 100.0 * (1 << rank);  // 1:2:4, reported, not slept
    do {
      const auto& ranges = d.nextStep(280);
      size_t samples = 0;
      for (const Range& r : ranges) {
        mine[static_cast<size_t>(rank)].push_back(r);
        samples += r.size();
      }
      EXPECT_EQ(samples, d.mySamples());
      plans[static_cast<size_t>(rank)].push_back(d.plan());
      d.finishStep(static_cast<double>(samples), static_cast<double>(samples) / speed);
    } while (!d.epochDone());
  }));
  for (int r = 1; r < size; ++r) {
    ASSERT_EQ(plans[static_cast<size_t>(r)].size(), plans[0].size());
    for (size_t s = 0; s < plans[0].size(); ++s) {
      EXPECT_EQ(plans[static_cast<size_t>(r)][s].fingerprint(), plans[0][s].fingerprint());
    }
  }
  // After warm-up the shares follow 1:2:4.
  EXPECT_THAT(plans[0][2].samples, ElementsAre(40, 80, 160));
  std::vector<int> seen(epoch, 0);
  for (const auto& ranges : mine) {
    for (const Range& r : ranges) {
      for (uint64_t i = r.begin; i < r.end; ++i) ++seen[i];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

TEST(CollectiveDispatcher, RanksWithDifferentOptionsAreCaught) {
  MemoryStore store;
  auto comms = makeWorld(store, 2);
  const auto errors = test::runRanks(2, [&](int rank) {
    DispatchOptions options;
    if (rank == 1) {  // a configuration mistake on one rank
      options.policy = Policy::kWeightedRoundRobin;
      options.weights = {3, 1};
    }
    CollectiveDispatcher d(*comms[static_cast<size_t>(rank)], 1000, options);
    for (int step = 0; step < 3; ++step) {
      d.nextStep(64);
      d.finishStep(static_cast<double>(d.mySamples()), 0.01);
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_NE(errors[static_cast<size_t>(r)], nullptr) << r;
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const MismatchError& e) {
      EXPECT_THAT(e.what(), HasSubstr("dispatcher: rank 1 ran step 0 with plan"));
    }
  }
}

TEST(SampleWeighted, UnequalSharesGiveTheWholeBatchGradient) {
  // Least squares: per-sample gradient of 0.5 (w.x - y)^2 is (w.x - y) x. The whole-batch
  // gradient on one "machine" is the mean over all samples; three ranks with shares 1:2:4
  // each compute the mean over their own samples, then allreduceSampleMean.
  const size_t dim = 1000;
  const size_t batch = 70;
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> x(batch, std::vector<double>(dim));
  std::vector<double> y(batch);
  std::vector<double> w(dim);
  for (auto& row : x) {
    for (auto& v : row) v = normal(rng);
  }
  for (auto& v : y) v = normal(rng);
  for (auto& v : w) v = normal(rng) * 0.1;
  const auto gradientOf = [&](size_t i) {
    double residual = -y[i];
    for (size_t k = 0; k < dim; ++k) residual += w[k] * x[i][k];
    std::vector<double> g(dim);
    for (size_t k = 0; k < dim; ++k) g[k] = residual * x[i][k];
    return g;
  };
  std::vector<double> reference(dim, 0);
  for (size_t i = 0; i < batch; ++i) {
    const auto g = gradientOf(i);
    for (size_t k = 0; k < dim; ++k) reference[k] += g[k] / batch;
  }
  MemoryStore store;
  auto comms = makeWorld(store, 3);
  const std::vector<size_t> begin = {0, 10, 30};
  const std::vector<size_t> count = {10, 20, 40};
  std::vector<std::vector<float>> results(3);
  std::vector<std::vector<float>> naive(3);
  test::rethrowFirst(test::runRanks(3, [&](int rank) {
    const auto r = static_cast<size_t>(rank);
    std::vector<float> local(dim, 0);
    for (size_t i = begin[r]; i < begin[r] + count[r]; ++i) {
      const auto g = gradientOf(i);
      for (size_t k = 0; k < dim; ++k) local[k] += static_cast<float>(g[k] / count[r]);
    }
    std::vector<float> plain = local;
    allreduceSampleMean(*comms[r], local.data(), dim, DataType::kFloat32, count[r]);
    comms[r]->allreduce(plain.data(), dim, DataType::kFloat32, ReduceOp::kAvg);
    results[r] = local;
    naive[r] = plain;
  }));
  double worst = 0;
  double naive_error = 0;
  for (size_t k = 0; k < dim; ++k) {
    const double scale = std::max(1.0, std::abs(reference[k]));
    for (int r = 0; r < 3; ++r) {
      worst = std::max(worst, std::abs(results[static_cast<size_t>(r)][k] - reference[k]) / scale);
      EXPECT_EQ(results[static_cast<size_t>(r)][k], results[0][k]);  // identical everywhere
    }
    naive_error = std::max(naive_error, std::abs(naive[0][k] - reference[k]) / scale);
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(naive_error, 1e-2);  // the plain average is measurably wrong with unequal shares

  const auto errors = test::runRanks(3, [&](int rank) {
    int32_t v = 1;
    allreduceSampleMean(*comms[static_cast<size_t>(rank)], &v, 1, DataType::kInt32, 1, 3);
  });
  for (const auto& e : errors) EXPECT_NE(e, nullptr);
}

TEST(LoadMonitor, ReportsThisProcessesResidentMemory) {
  launcher::LoadMonitor monitor(0);  // GPU 0: none here, so no GPU signals (and no error)
  const std::vector<char> ballast(64 << 20, 1);  // 64 MiB touched
  const LoadSignals signals = monitor.sample().signals;
  EXPECT_GE(signals.memory_bytes, 64.0 * (1 << 20));
  EXPECT_LT(signals.memory_bytes, 64.0 * (1 << 30));
  if (!monitor.hasGpu()) {
    EXPECT_EQ(signals.gpu_utilization, 0);
    EXPECT_EQ(signals.gpu_memory_bytes, 0);
  }
  EXPECT_EQ(ballast[12345], 1);
}

TEST(StaticWeights, GpuModelsFromTheTopologyWeighTheRanks) {
  EXPECT_EQ(gpuModelTflops("NVIDIA H100 80GB HBM3"), 989);
  EXPECT_EQ(gpuModelTflops("NVIDIA H100 PCIe"), 756);
  EXPECT_EQ(gpuModelTflops("NVIDIA A100-SXM4-80GB"), 312);
  EXPECT_EQ(gpuModelTflops("NVIDIA A10"), 125);  // not A100's entry, nor the other way round
  EXPECT_EQ(gpuModelTflops("Tesla V100-SXM2-32GB"), 125);
  EXPECT_EQ(gpuModelTflops("NVIDIA GPU 10de:1234"), 0);
  std::ifstream in(std::string(RAILSHARD_SOURCE_DIR) + "/tests/fixtures/mixed_cluster.json");
  std::stringstream text;
  text << in.rdbuf();
  const auto graph = topology::Topology::fromJson(text.str(), "mixed_cluster.json");
  // Ranks 0-4 on H100s (big: 4, small: 1), ranks 5-6 on A10s (old).
  EXPECT_THAT(weightsFromTopology(graph), ElementsAre(989, 989, 989, 989, 989, 125, 125));
  DispatchOptions options;
  options.policy = Policy::kWeightedRoundRobin;
  options.weights = weightsFromTopology(graph);
  Dispatcher d(7, 100000, options);
  const auto& plan = d.plan(5194);  // 989 * 5 + 125 * 2 = 5195: one unit short of exact
  EXPECT_NEAR(static_cast<double>(plan.samples[0]) / plan.samples[5], 989.0 / 125, 0.1);
  EXPECT_THROW(weightsFromTopology(topology::Topology{}), InvalidArgument);

  // weighted_round_robin with no weights takes them from the communicator's cluster graph.
  MemoryStore store;
  auto comms = makeWorld(store, 7, std::make_shared<const topology::Topology>(graph));
  std::vector<std::vector<size_t>> shares(7);
  test::rethrowFirst(test::runRanks(7, [&](int rank) {
    DispatchOptions wrr;
    wrr.policy = Policy::kWeightedRoundRobin;
    CollectiveDispatcher cd(*comms[static_cast<size_t>(rank)], 100000, wrr);
    cd.nextStep(5195);
    shares[static_cast<size_t>(rank)] = cd.plan().samples;
  }));
  EXPECT_THAT(shares[3], ElementsAre(989, 989, 989, 989, 989, 125, 125));
  EXPECT_EQ(shares[6], shares[0]);
}

}  // namespace
}  // namespace railshard::dispatch
