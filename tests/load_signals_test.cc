// What the dispatcher does with the ranks' load signals (core/dispatch/load_signals.h): CPU
// quotas move shares before the rates do, memory caps hold shares (and steps) down, queue
// lengths steer least_loaded, power steers the energy policy within its time budget, a step
// given back (out of memory) is planned again, and nonsensical reports are refused without
// moving a plan. Pure logic, checked against hand-computed plans and scalar references.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "base/error.h"
#include "core/dispatch/dispatcher.h"
#include "core/dispatch/elastic_state.h"
#include "core/dispatch/policy.h"
#include "core/dispatch/state_codec.h"

namespace railshard::dispatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LoadSignals quota(double cores) {
  LoadSignals s;
  s.cpu_quota_cores = cores;
  return s;
}

// One step of `d`: plan, then every rank reports `samples / rate` seconds for its share
// under `loads` (set before the report, as the ranks' reports carry them), then complete.
std::vector<size_t> step(Dispatcher& d, size_t batch, const std::vector<double>& rates,
                         const std::vector<LoadSignals>& loads) {
  const std::vector<size_t> shares = d.plan(batch).samples;
  for (size_t r = 0; r < rates.size(); ++r) {
    d.setLoad(static_cast<int>(r), loads[r]);
    if (shares[r] > 0) {
      d.report(static_cast<int>(r), static_cast<double>(shares[r]),
               static_cast<double>(shares[r]) / rates[r]);
    }
  }
  d.completeStep();
  return shares;
}

TEST(LoadSignals, AQuotaThatHalvesMovesTheShareAtTheNextPlan) {
  // Three ranks at 0.2/0.4/0.8 cores, 100 samples/s per core. Rank 2's quota halves during
  // step 5: that step it ran at 0.6 cores on average, and says 0.4 now.
  Dispatcher d(3, 1'000'000, DispatchOptions{});
  std::vector<double> cores = {0.2, 0.4, 0.8};
  for (int s = 0; s < 5; ++s) {
    std::vector<LoadSignals> loads;
    std::vector<double> rates;
    for (double c : cores) {
      loads.push_back(quota(c));
      rates.push_back(100 * c);
    }
    step(d, 700, rates, loads);
  }
  EXPECT_THAT(d.plan(700).samples, ElementsAre(100, 200, 400));
  d.setLoad(0, quota(0.2));
  d.setLoad(1, quota(0.4));
  d.setLoad(2, quota(0.4));
  d.report(0, 100, 100 / 20.0);
  d.report(1, 200, 200 / 40.0);
  d.report(2, 400, 400 / 60.0);  // the straddling step: 60 samples/s
  d.completeStep();
  // Planned for the new quota at once: 0.2 : 0.4 : 0.4.
  EXPECT_THAT(d.plan(700).samples, ElementsAre(140, 280, 280));
  d.completeStep();
  // Without the quota signal the estimator holds the straddling step back as an outlier and
  // needs a second slow step before it moves (the old behaviour, for comparison).
  Dispatcher blind(3, 1'000'000, DispatchOptions{});
  for (int s = 0; s < 5; ++s) step(blind, 700, {20, 40, 80}, {{}, {}, {}});
  blind.plan(700);
  blind.report(0, 100, 5);
  blind.report(1, 200, 5);
  blind.report(2, 400, 400 / 60.0);
  blind.completeStep();
  EXPECT_GT(blind.plan(700).samples[2], 350u);  // far from the 280 its new speed deserves
}

TEST(LoadSignals, CapsHoldSharesAndTheRestGoesToTheOthers) {
  DispatchOptions options;
  options.micro_batch = 10;
  Dispatcher d(3, 1'000'000, options);
  step(d, 700, {10, 20, 40}, {{}, {}, {}});
  LoadSignals capped;
  capped.cap_samples = 215;  // 21 micro-batches
  d.setLoad(2, capped);
  const auto shares = d.plan(700).samples;
  EXPECT_EQ(shares[2], 210u);
  EXPECT_EQ(std::accumulate(shares.begin(), shares.end(), size_t{0}), 700u);
  // The 190 it cannot take go to the others by their rates, 1:2.
  EXPECT_THAT(shares, ElementsAre(160, 330, 210));
  d.completeStep();
  // Every rank capped below the batch: the step is smaller, the rest waits.
  LoadSignals small;
  small.cap_samples = 100;
  for (int r = 0; r < 3; ++r) d.setLoad(r, small);
  const StepPlan plan = d.plan(700);
  EXPECT_THAT(plan.samples, ElementsAre(100, 100, 100));
  EXPECT_EQ(d.assigned(), 1700u);
  d.completeStep();
  LoadSignals none;
  none.cap_samples = 5;  // less than a micro-batch anywhere
  for (int r = 0; r < 3; ++r) d.setLoad(r, none);
  try {
    d.plan(700);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("no live rank's memory holds a micro-batch of 10 samples"));
  }
}

TEST(LoadSignals, ApplyCapsMatchesAReferenceOnRandomInputs) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t n = 1 + rng() % 6;
    std::vector<double> weights(n);
    std::vector<long long> caps(n);
    std::vector<size_t> shares(n);
    for (size_t r = 0; r < n; ++r) {
      weights[r] = 0.1 + (rng() % 100) / 10.0;
      caps[r] = rng() % 3 == 0 ? -1 : static_cast<long long>(rng() % 20);
      shares[r] = rng() % 30;
    }
    const size_t total = std::accumulate(shares.begin(), shares.end(), size_t{0});
    long long room = 0;
    bool unbounded = false;
    for (long long c : caps) {
      if (c < 0) unbounded = true;
      room += std::max(c, 0LL);
    }
    const auto out = applyCaps(shares, caps, weights);
    const size_t after = std::accumulate(out.begin(), out.end(), size_t{0});
    // Nothing lost unless every rank is full; then exactly the room.
    EXPECT_EQ(after, unbounded ? total : std::min<size_t>(total, static_cast<size_t>(room)));
    for (size_t r = 0; r < n; ++r) {
      if (caps[r] >= 0) {
        EXPECT_LE(out[r], static_cast<size_t>(caps[r]));
      }
      // No rank under its cap loses work it had.
      if (caps[r] < 0 || shares[r] <= static_cast<size_t>(caps[r])) {
        EXPECT_GE(out[r], shares[r]);
      }
    }
  }
}

TEST(LoadSignals, LeastLoadedMovesWorkOffARankWithAQueue) {
  DispatchOptions options;
  options.policy = Policy::kLeastLoaded;
  options.micro_batch = 10;
  Dispatcher d(3, 1'000'000, options);
  step(d, 600, {100, 100, 100}, {{}, {}, {}});
  EXPECT_THAT(d.plan(600).samples, ElementsAre(200, 200, 200));
  d.completeStep();
  LoadSignals stalled;
  stalled.queued_samples = 150;  // its loader ran dry: 1.5 s of waiting at 100 samples/s
  d.setLoad(1, stalled);
  // Finish times equalise: (150 + n1) = n0 = n2 -> n1 = 100, n0 = n2 = 250.
  EXPECT_THAT(d.plan(600).samples, ElementsAre(250, 100, 250));
}

TEST(LoadSignals, EnergyMovesWorkToTheCheaperRanksWithinTheTimeBudget) {
  // Reference: two equally fast ranks, one at a third of the other's joules per sample.
  const auto shares = energyAware(100, {10, 10}, {1, 3}, 1.2);
  // The fastest plan takes 100 / 20 = 5 s; the budget 6 s lets the cheap rank take 60.
  EXPECT_THAT(shares, ElementsAre(60, 40));
  EXPECT_THAT(energyAware(100, {10, 10}, {1, 3}, 1.0), ElementsAre(50, 50));
  // An unknown rank counts as the median of the known: between the two.
  EXPECT_THAT(energyAware(90, {10, 10, 10}, {1, 0, 3}, 1.5), ElementsAre(45, 45, 0));
  EXPECT_THROW(energyAware(10, {1, 1}, {1, 1}, 0.9), InvalidArgument);

  DispatchOptions options;
  options.policy = Policy::kEnergy;
  options.energy_budget = 1.05;
  Dispatcher d(3, 1'000'000, options);
  // No power known: the fastest plan, as proportional.
  EXPECT_THAT(step(d, 700, {10, 20, 40}, {{}, {}, {}}), ElementsAre(234, 233, 233));
  EXPECT_THAT(d.plan(700).samples, ElementsAre(100, 200, 400));
  // Rank 2 is the fastest but spends 4 J per sample, ranks 0 and 1 1 J.
  const std::vector<double> joules = {1, 1, 4};
  for (int r = 0; r < 3; ++r) {
    const double n = static_cast<double>(d.current().samples[static_cast<size_t>(r)]);
    d.report(r, n, n / std::vector<double>{10, 20, 40}[static_cast<size_t>(r)], n * joules[r]);
  }
  d.completeStep();
  EXPECT_DOUBLE_EQ(d.joulesPerSample(2), 4);
  const auto energy = d.plan(700).samples;
  // Fastest plan: 10 s. Budget 10.5 s: ranks 0 and 1 take 105 and 210, rank 2 the rest.
  EXPECT_THAT(energy, ElementsAre(105, 210, 385));
  const double step_time = std::max({105 / 10.0, 210 / 20.0, 385 / 40.0});
  EXPECT_LE(step_time, 1.05 * 10 + 1e-9);
  const double spent = 105 * 1 + 210 * 1 + 385 * 4;
  EXPECT_LT(spent, 100 * 1 + 200 * 1 + 400 * 4);
}

TEST(LoadSignals, AStepGivenBackIsPlannedFirstAndEverySampleIsDoneOnce) {
  DispatchOptions options;
  options.micro_batch = 5;
  Dispatcher d(3, 300, options);
  std::multiset<uint64_t> done;
  std::vector<Range> failed;
  int steps = 0;
  while (!d.epochDone()) {
    const StepPlan plan = d.plan(60);
    d.completeStep();
    ++steps;
    if (steps == 2) {
      // A rank ran out of memory: the whole step is given up and given back.
      for (const auto& ranges : plan.ranges)
        failed.insert(failed.end(), ranges.begin(), ranges.end());
      d.requeue(failed);
      LoadSignals capped;
      capped.cap_samples = 10;
      d.setLoad(1, capped);
      continue;
    }
    for (const auto& ranges : plan.ranges) {
      for (const Range& range : ranges) {
        for (uint64_t i = range.begin; i < range.end; ++i) done.insert(i);
      }
    }
    if (steps == 3) {
      // The given-back samples come first, under the new cap.
      EXPECT_EQ(plan.ranges[0].front().begin, failed.front().begin);
      EXPECT_LE(plan.samples[1], 10u);
    }
  }
  EXPECT_EQ(steps, 6);  // one more than the 5 the epoch needs
  ASSERT_EQ(done.size(), 300u);
  for (uint64_t i = 0; i < 300; ++i) EXPECT_EQ(done.count(i), 1u) << i;
  // Errors: an open step, samples not handed out, samples already given back.
  Dispatcher e(2, 100, DispatchOptions{});
  e.plan(20);
  EXPECT_THROW(e.requeue({{0, 10}}), InvalidArgument);
  e.completeStep();
  EXPECT_THROW(e.requeue({{10, 30}}), InvalidArgument);
  e.requeue({{0, 10}});
  EXPECT_THROW(e.requeue({{5, 8}}), InvalidArgument);
}

TEST(LoadSignals, NonsensicalReportsAreRefusedNamingRankFieldAndValueAndMoveNothing) {
  Dispatcher d(2, 1000, DispatchOptions{});
  step(d, 100, {10, 10}, {{}, {}});
  const uint64_t before = d.stateFingerprint();
  const auto expectRefused = [&](LoadSignals s, const std::string& needle) {
    try {
      d.setLoad(1, s);
      FAIL() << "expected InvalidArgument for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr(needle));
    }
    EXPECT_EQ(d.stateFingerprint(), before);
  };
  LoadSignals s;
  s.queued_samples = -3;
  expectRefused(s, "rank 1 reported queued_samples = -3");
  s = {};
  s.power_watts = std::numeric_limits<double>::quiet_NaN();
  expectRefused(s, "rank 1 reported power_watts = nan");
  s = {};
  s.memory_bytes = std::numeric_limits<double>::infinity();
  expectRefused(s, "rank 1 reported memory_bytes = inf");
  s = {};
  s.gpu_utilization = 1.5;
  expectRefused(s, "gpu_utilization = 1.5 (must be between 0 and 1)");
  EXPECT_THROW(d.report(0, 10, 1, -1), InvalidArgument);

  // Through ElasticState (what CollectiveDispatcher runs on every rank): one bad report among
  // good ones changes nothing, on any rank.
  ElasticState state(2, 1000, DispatchOptions{});
  state.advance(100, {});
  state.commit();
  const uint64_t fingerprint = state.fingerprint();
  std::vector<RankReport> reports(2);
  reports[0].samples = 50;
  reports[0].seconds = 1;
  reports[1].samples = 50;
  reports[1].seconds = 1;
  reports[1].load.cap_samples = -1;
  try {
    state.advance(100, reports);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 reported cap_samples = -1"));
  }
  EXPECT_EQ(state.fingerprint(), fingerprint);
}

TEST(LoadSignals, TheCodecCarriesSignalsCapsQuotasAndGivenBackSamples) {
  DispatchOptions options;
  options.policy = Policy::kEnergy;
  options.energy_budget = 1.2;
  ElasticState state(2, 500, options);
  state.advance(100, {});
  state.commit();
  std::vector<RankReport> reports(2);
  for (int r = 0; r < 2; ++r) {
    reports[static_cast<size_t>(r)].samples = 50;
    reports[static_cast<size_t>(r)].seconds = 1 + r;
    reports[static_cast<size_t>(r)].energy_joules = 10 + r;
    reports[static_cast<size_t>(r)].load.cpu_quota_cores = 0.5 + r;
    reports[static_cast<size_t>(r)].load.cap_samples = 80;
    reports[static_cast<size_t>(r)].load.power_watts = 3;
  }
  state.advance(100, reports);
  state.commit();
  const auto bytes = StateCodec::encode(state, {0, 1});
  const auto decoded = StateCodec::decode(bytes);
  EXPECT_EQ(decoded.state.fingerprint(), state.fingerprint());
  EXPECT_DOUBLE_EQ(decoded.state.dispatcher().load(1).cpu_quota_cores, 1.5);
  EXPECT_DOUBLE_EQ(decoded.state.dispatcher().joulesPerSample(1), 11.0 / 50);
  EXPECT_DOUBLE_EQ(decoded.state.dispatcher().estimator().rate(1),
                   state.dispatcher().estimator().rate(1));
  EXPECT_DOUBLE_EQ(decoded.state.dispatcher().options().energy_budget, 1.2);
}

}  // namespace
}  // namespace railshard::dispatch
