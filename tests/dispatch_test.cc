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

#include "core/base/error.h"
#include "core/base/memory_store.h"
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
  a.setQueued(0, 20);  // rank 0 still has 20 samples of other work queued
  EXPECT_THAT(a.plan(40).samples, ElementsAre(10, 30));

  DispatchOptions wrr;
  wrr.policy = Policy::kWeightedRoundRobin;
  wrr.weights = {3, 1};
  Dispatcher b(2, 1000, wrr);
  EXPECT_THAT(b.plan(40).samples, ElementsAre(30, 10));
  EXPECT_THROW(Dispatcher(3, 10, wrr), InvalidArgument);  // 2 weights for 3 ranks
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
    options.config.transport = "tcp";
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
  const LoadSignals signals = monitor.sample();
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
