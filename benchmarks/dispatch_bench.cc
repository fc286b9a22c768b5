// dispatch_bench: what the dispatcher buys on ranks of unequal speed. Every rank "computes" its
// share of a global batch — real work scaled by a per-rank speed factor — then all-reduces a
// gradient buffer weighted by its sample count, as a data-parallel training step does. Each
// policy in --policies runs the same workload in turn, with a fresh CollectiveDispatcher, so
// `proportional` and `equal` are compared side by side in one run. Rank 0 prints every step and
// a summary: step time against the ideal (total work / sum of speeds: every rank busy all step).
//
//   railshard-launch -n 3 dispatch_bench --speeds 1,2,4
//   railshard-launch -n 3 dispatch_bench --speeds 1,2,4 --slowdown 2:2:12 --json out.json
//
// --work sleep (default) models a GPU server: its CPU waits while the device computes, so a
// rank's speed is its own whatever the other ranks do. --work cpu burns calibrated
// floating-point work instead; with more ranks than cores they share cores and the speeds
// measured are no longer the ones asked for (see docs/dispatch.md).
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/dispatch_options.h"
#include "core/base/error.h"
#include "core/communicator.h"
#include "core/dispatch/collective_dispatcher.h"
#include "core/dispatch/policy.h"
#include "core/dispatch/sample_weighted.h"
#include "launcher/init.h"

namespace railshard::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr double kRecoveryRatio = 1.10;  // --slowdown: "recovered" within this of the ideal

// --- work ----------------------------------------------------------------------------------

// Multiply-adds on eight independent accumulators: real floating-point work that touches no
// memory (so ranks do not disturb each other through caches) and that the compiler cannot fold
// away (the result goes to a volatile sink).
volatile double g_sink = 0;

// Not inlined: calibration and work must run the very same machine code (inlined into both
// callers, GCC's two copies ran at 330K and 480K iterations/ms).
[[gnu::noinline]] void spin(uint64_t iterations) {
  double a[8] = {1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7};
  for (uint64_t i = 0; i < iterations; ++i) {
    for (double& x : a) x = x * 0.999999 + 1e-6;
  }
  double sum = 0;
  for (double x : a) sum += x;
  g_sink = sum;
}

double secondsOf(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

timespec monotonicNow() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now;
}

timespec plusMs(timespec t, double ms) {
  const auto ns = static_cast<int64_t>(ms * 1e6);
  t.tv_sec += static_cast<time_t>(ns / 1000000000);
  t.tv_nsec += static_cast<long>(ns % 1000000000);
  if (t.tv_nsec >= 1000000000) {
    t.tv_nsec -= 1000000000;
    ++t.tv_sec;
  }
  return t;
}

// An absolute deadline on the monotonic clock: an interrupted sleep resumes to the same end.
void sleepUntil(const timespec& deadline) {
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nullptr) != 0) {
  }
}

// Iterations of spin() per millisecond on this rank, alone on a core. The ranks take turns in
// time slots and sleep outside their own, because ranks waiting in a collective spin and would
// share the core with the one being measured. Median of seven ~5 ms runs after a sizing run.
double calibrate(Communicator& comm) {
  constexpr double kSlotMs = 60;  // a calibration takes about 36 ms
  comm.barrier();
  const timespec base = monotonicNow();
  sleepUntil(plusMs(base, kSlotMs * comm.rank()));
  auto start = SteadyClock::now();
  spin(200000);
  double per_ms = 200000 / std::max(secondsOf(start) * 1e3, 1e-3);
  std::vector<double> runs;
  for (int i = 0; i < 7; ++i) {
    const auto n = static_cast<uint64_t>(per_ms * 5);
    start = SteadyClock::now();
    spin(n);
    runs.push_back(static_cast<double>(n) / std::max(secondsOf(start) * 1e3, 1e-6));
  }
  std::sort(runs.begin(), runs.end());
  per_ms = runs[runs.size() / 2];
  sleepUntil(plusMs(base, kSlotMs * comm.size()));
  comm.barrier();
  return per_ms;
}

// This rank's compute for `ms` milliseconds of work.
void work(double ms, bool cpu, double iterations_per_ms) {
  if (ms <= 0) return;
  if (cpu) {
    spin(static_cast<uint64_t>(ms * iterations_per_ms));
  } else {
    sleepUntil(plusMs(monotonicNow(), ms));
  }
}

// --- measurement ---------------------------------------------------------------------------

struct StepRecord {
  std::string policy;
  int step = 0;
  std::vector<size_t> shares;
  std::vector<double> compute_ms;
  double step_ms = 0;
  double ideal_ms = 0;
  double allreduce_ms = 0;  // the all-reduce of the rank that came to it last
  // What nextStep() adds to the step: the all-gather as the rank that came to it last saw it
  // (the others' time in it is mostly waiting for that rank) plus the slowest planning.
  double overhead_us = 0;
  double gather_us = 0;        // that all-gather, as the last rank to reach it saw it
  double plan_us = 0;          // planning, slowest rank
  double overhead_max_us = 0;  // nextStep() on the rank that spent longest in it, waiting included
  double ratio() const { return step_ms / ideal_ms; }
  double ratioWithAllreduce() const { return step_ms / (ideal_ms + allreduce_ms); }
};

struct Summary {
  std::string policy;
  double median_ratio = 0;
  double median_ratio_with_allreduce = 0;
  double median_step_ms = 0;
  double median_ideal_ms = 0;
  double median_allreduce_ms = 0;
  double median_overhead_us = 0;
  double median_overhead_max_us = 0;
  std::optional<int> recovery_steps;  // with --slowdown; empty when it never recovered
};

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::vector<double> speedsAt(const BenchOptions& options, int step) {
  std::vector<double> speeds = options.speeds;
  if (options.slowdown && step >= options.slowdown->step) {
    speeds[static_cast<size_t>(options.slowdown->rank)] /= options.slowdown->factor;
  }
  return speeds;
}

template <typename T>
std::string joined(const std::vector<T>& values, const char* format) {
  std::string out;
  char buffer[64];
  for (size_t i = 0; i < values.size(); ++i) {
    std::snprintf(buffer, sizeof(buffer), format, values[i]);
    if (i) out += ',';
    out += buffer;
  }
  return out;
}

Summary summarise(const BenchOptions& options, const std::string& policy,
                  const std::vector<StepRecord>& records) {
  Summary s;
  s.policy = policy;
  std::vector<double> ratio, ratio_ar, step_ms, ideal_ms, allreduce_ms, overhead_us,
      overhead_max_us;
  for (const auto& r : records) {
    if (r.step < options.warmup) continue;
    ratio.push_back(r.ratio());
    ratio_ar.push_back(r.ratioWithAllreduce());
    step_ms.push_back(r.step_ms);
    ideal_ms.push_back(r.ideal_ms);
    allreduce_ms.push_back(r.allreduce_ms);
    overhead_us.push_back(r.overhead_us);
    overhead_max_us.push_back(r.overhead_max_us);
  }
  s.median_ratio = median(ratio);
  s.median_ratio_with_allreduce = median(ratio_ar);
  s.median_step_ms = median(step_ms);
  s.median_ideal_ms = median(ideal_ms);
  s.median_allreduce_ms = median(allreduce_ms);
  s.median_overhead_us = median(overhead_us);
  s.median_overhead_max_us = median(overhead_max_us);
  if (options.slowdown) {
    // Steps after the slowdown until the first one within kRecoveryRatio of the new ideal
    // (0: the step the rank slowed down was already within it).
    for (const auto& r : records) {
      if (r.step >= options.slowdown->step && r.ratio() <= kRecoveryRatio) {
        s.recovery_steps = r.step - options.slowdown->step;
        break;
      }
    }
  }
  return s;
}

// Runs `steps` steps of one policy on every rank; rank 0 gets the records.
std::vector<StepRecord> runPolicy(Communicator& comm, const BenchOptions& options,
                                  const std::string& label, double iterations_per_ms,
                                  std::vector<float>& grad) {
  const int rank = comm.rank();
  const auto world = static_cast<size_t>(comm.size());
  dispatch::DispatchOptions dispatch_options;
  dispatch_options.policy = dispatch::parsePolicy(label);
  dispatch_options.micro_batch = options.micro;
  // Static weights are what a user who knows the hardware would configure.
  if (dispatch_options.policy == dispatch::Policy::kWeightedRoundRobin) {
    dispatch_options.weights = options.speeds;
  }
  dispatch::CollectiveDispatcher dispatcher(comm, options.epoch, dispatch_options);

  std::vector<StepRecord> records;
  constexpr size_t kStats = 5;  // compute, gather, plan, all-reduce, step (s)
  std::vector<double> all(world * kStats);
  comm.barrier();
  for (int step = 0; step < options.steps; ++step) {
    const std::vector<double> speeds = speedsAt(options, step);

    const auto start = SteadyClock::now();
    const auto& ranges = dispatcher.nextStep(options.batch);
    const double gather = dispatcher.lastGatherSeconds();
    const double plan = dispatcher.lastPlanSeconds();
    uint64_t samples = 0;
    for (const auto& range : ranges) samples += range.size();
    const auto compute_start = SteadyClock::now();
    work(static_cast<double>(samples) * options.unit_ms / speeds[static_cast<size_t>(rank)],
         options.cpu_work, iterations_per_ms);
    const double compute = secondsOf(compute_start);
    dispatcher.finishStep(static_cast<double>(samples), compute);
    const auto allreduce_start = SteadyClock::now();
    dispatch::allreduceSampleMean(comm, grad.data(), grad.size(), DataType::kFloat32,
                                  dispatcher.mySamples(), dispatcher.stepSamples());
    const double allreduce = secondsOf(allreduce_start);
    const double step_seconds = secondsOf(start);

    // Outside the timed region: every rank's numbers to rank 0 for printing.
    const double mine[kStats] = {compute, gather, plan, allreduce, step_seconds};
    comm.allgather(mine, all.data(), kStats, DataType::kFloat64);
    if (rank != 0) continue;

    StepRecord record;
    record.policy = label;
    record.step = step;
    record.shares = dispatcher.plan().samples;
    double speed_sum = 0;
    for (double s : speeds) speed_sum += s;
    record.ideal_ms = static_cast<double>(dispatcher.stepSamples()) * options.unit_ms / speed_sum;
    record.step_ms = all[4] * 1e3;  // rank 0's view
    record.allreduce_ms = all[3] * 1e3;
    for (size_t r = 0; r < world; ++r) {
      const double* stats = &all[r * kStats];
      record.compute_ms.push_back(stats[0] * 1e3);
      record.gather_us = r == 0 ? stats[1] * 1e6 : std::min(record.gather_us, stats[1] * 1e6);
      record.plan_us = std::max(record.plan_us, stats[2] * 1e6);
      record.overhead_max_us = std::max(record.overhead_max_us, (stats[1] + stats[2]) * 1e6);
      // Ranks that finished computing early wait inside the all-reduce; the one that came
      // last measured the all-reduce itself.
      record.allreduce_ms = std::min(record.allreduce_ms, stats[3] * 1e3);
    }
    record.overhead_us = record.gather_us + record.plan_us;
    std::printf("%-14s %4d  %-*s  %-*s  %8.1f  %8.1f  %6.3f  %9.2f  %6.0f  %7.0f\n", label.c_str(),
                step, static_cast<int>(world * 5), joined(record.shares, "%zu").c_str(),
                static_cast<int>(world * 7), joined(record.compute_ms, "%.1f").c_str(),
                record.step_ms, record.ideal_ms, record.ratio(), record.allreduce_ms,
                record.overhead_us, record.overhead_max_us);
    std::fflush(stdout);
    records.push_back(std::move(record));
  }
  return records;
}

void printSummary(const BenchOptions& options, const Summary& s) {
  std::printf(
      "# %s: median after %d warm-up steps: %.3fx ideal (%.3fx ideal+allreduce), step "
      "%.1f ms (ideal %.1f, all-reduce %.2f), dispatch overhead %.0f us = %.3f%% of the "
      "step (%.0f us = %.3f%% waiting included)",
      s.policy.c_str(), options.warmup, s.median_ratio, s.median_ratio_with_allreduce,
      s.median_step_ms, s.median_ideal_ms, s.median_allreduce_ms, s.median_overhead_us,
      s.median_overhead_us / 1e3 / s.median_step_ms * 100, s.median_overhead_max_us,
      s.median_overhead_max_us / 1e3 / s.median_step_ms * 100);
  if (options.slowdown) {
    if (s.recovery_steps) {
      std::printf("; within %.2fx of the new ideal %d steps after the slowdown", kRecoveryRatio,
                  *s.recovery_steps);
    } else {
      std::printf("; never back within %.2fx of the new ideal", kRecoveryRatio);
    }
  }
  std::printf("\n");
}

// "proportional: 1.03x ideal, equal: 2.29x ideal -> proportional is 2.2x faster per step"
void printFinalLine(const std::vector<Summary>& summaries) {
  std::string line;
  for (const auto& s : summaries) {
    char part[128];
    std::snprintf(part, sizeof(part), "%s%s: %.2fx ideal", line.empty() ? "" : ", ",
                  s.policy.c_str(), s.median_ratio);
    line += part;
  }
  const Summary* proportional = nullptr;
  const Summary* equal = nullptr;
  for (const auto& s : summaries) {
    const auto policy = dispatch::parsePolicy(s.policy);
    if (!proportional && policy == dispatch::Policy::kProportional) proportional = &s;
    if (!equal && policy == dispatch::Policy::kRoundRobin) equal = &s;
  }
  if (proportional && equal && proportional->median_step_ms > 0) {
    char part[160];
    std::snprintf(part, sizeof(part), " -> %s is %.2fx faster per step than %s",
                  proportional->policy.c_str(),
                  equal->median_step_ms / proportional->median_step_ms, equal->policy.c_str());
    line += part;
  }
  std::printf("%s\n", line.c_str());
}

nlohmann::ordered_json toJson(const BenchOptions& options, int world,
                              const std::vector<double>& iterations_per_ms,
                              const std::vector<StepRecord>& records,
                              const std::vector<Summary>& summaries) {
  nlohmann::ordered_json j;
  j["world_size"] = world;
  j["speeds"] = options.speeds;
  j["batch"] = options.batch;
  j["micro"] = options.micro;
  j["unit_ms"] = options.unit_ms;
  j["steps_per_policy"] = options.steps;
  j["warmup"] = options.warmup;
  j["grad_count"] = options.grad_count;
  j["work"] = options.cpu_work ? "cpu" : "sleep";
  if (options.cpu_work) j["cpu_iterations_per_ms"] = iterations_per_ms;
  j["epoch"] = options.epoch;
  j["policies"] = options.policies;
  if (options.slowdown) {
    j["slowdown"] = {{"rank", options.slowdown->rank},
                     {"factor", options.slowdown->factor},
                     {"step", options.slowdown->step}};
  } else {
    j["slowdown"] = nullptr;
  }
  auto& steps = j["steps"] = nlohmann::ordered_json::array();
  for (const auto& r : records) {
    steps.push_back({{"policy", r.policy},
                     {"step", r.step},
                     {"shares", r.shares},
                     {"compute_ms", r.compute_ms},
                     {"step_ms", r.step_ms},
                     {"ideal_ms", r.ideal_ms},
                     {"ratio", r.ratio()},
                     {"allreduce_ms", r.allreduce_ms},
                     {"ratio_to_ideal_plus_allreduce", r.ratioWithAllreduce()},
                     {"overhead_us", r.overhead_us},
                     {"gather_us", r.gather_us},
                     {"plan_us", r.plan_us},
                     {"overhead_max_us", r.overhead_max_us}});
  }
  auto& summary = j["summary"] = nlohmann::ordered_json::array();
  for (const auto& s : summaries) {
    nlohmann::ordered_json o = {
        {"policy", s.policy},
        {"dispatch_policy", std::string(dispatch::name(dispatch::parsePolicy(s.policy)))},
        {"median_ratio_to_ideal", s.median_ratio},
        {"median_ratio_to_ideal_plus_allreduce", s.median_ratio_with_allreduce},
        {"median_step_ms", s.median_step_ms},
        {"median_ideal_ms", s.median_ideal_ms},
        {"median_allreduce_ms", s.median_allreduce_ms},
        {"median_overhead_us", s.median_overhead_us},
        {"overhead_percent", s.median_overhead_us / 1e3 / s.median_step_ms * 100},
        {"median_overhead_max_us", s.median_overhead_max_us},
        {"overhead_max_percent", s.median_overhead_max_us / 1e3 / s.median_step_ms * 100}};
    if (options.slowdown) {
      o["recovery_steps"] =
          s.recovery_steps ? nlohmann::ordered_json(*s.recovery_steps) : nlohmann::ordered_json();
    }
    summary.push_back(std::move(o));
  }
  return j;
}

int run(int argc, char** argv) {
  BenchOptions options = parseOptions(argc, argv);
  if (options.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  auto comm = init();
  const int rank = comm->rank();
  const int world = comm->size();
  checkAgainstWorld(options, world);

  std::ofstream json_file;
  if (rank == 0 && !options.json.empty()) {
    // Opened now so that a bad path fails before the run, not after it.
    json_file.open(options.json);
    if (!json_file) throw Error("--json: cannot write '" + options.json + "'");
  }
  const double iterations_per_ms = options.cpu_work ? calibrate(*comm) : 0;
  std::vector<double> all_iterations_per_ms(static_cast<size_t>(world));
  comm->allgather(&iterations_per_ms, all_iterations_per_ms.data(), 1, DataType::kFloat64);
  // Every rank's gradient holds the mean 1.0; the sample-weighted mean keeps it 1.0, which is
  // checked at the end.
  std::vector<float> grad(options.grad_count, 1.0f);

  if (rank == 0) {
    double sum = 0;
    for (double s : options.speeds) sum += s;
    std::printf(
        "# dispatch_bench: %d ranks, speeds %s, batch %zu (micro-batch %zu), %.4f ms "
        "per sample at speed 1, work %s, all-reduce of %zu floats per step\n",
        world, joined(options.speeds, "%g").c_str(), options.batch, options.micro, options.unit_ms,
        options.cpu_work ? "cpu" : "sleep", options.grad_count);
    std::printf("# ideal step = batch * unit / sum(speeds) = %.1f ms",
                static_cast<double>(options.batch) * options.unit_ms / sum);
    if (options.slowdown) {
      std::printf("; from step %d rank %d runs %gx slower", options.slowdown->step,
                  options.slowdown->rank, options.slowdown->factor);
    }
    if (options.cpu_work) {
      std::printf("\n# cpu work: spin iterations per ms, each rank alone on a core: %s",
                  joined(all_iterations_per_ms, "%.0f").c_str());
    }
    std::printf(
        "\n# ratio = step / ideal. allred_ms: the all-reduce of the rank that reached it last. "
        "ovh_us: nextStep's all-gather (as the last rank to reach it saw it) + planning; "
        "ovh_max: the longest nextStep of any rank, waiting for the others included\n");
    std::printf("%-14s %4s  %-*s  %-*s  %8s  %8s  %6s  %9s  %6s  %7s\n", "# policy", "step",
                world * 5, "shares", world * 7, "compute_ms", "step_ms", "ideal_ms", "ratio",
                "allred_ms", "ovh_us", "ovh_max");
    std::fflush(stdout);
  }

  std::vector<StepRecord> records;
  std::vector<Summary> summaries;
  for (const auto& policy : options.policies) {
    auto policy_records = runPolicy(*comm, options, policy, iterations_per_ms, grad);
    if (rank == 0) {
      summaries.push_back(summarise(options, policy, policy_records));
      printSummary(options, summaries.back());
      std::fflush(stdout);
      records.insert(records.end(), policy_records.begin(), policy_records.end());
    }
  }

  for (const float g : {grad.front(), grad.back()}) {
    if (std::fabs(g - 1.0f) > 1e-3f) {
      throw Error("gradient mean drifted to " + std::to_string(g) +
                  " (expected 1): sample weighting is wrong");
    }
  }
  if (rank == 0) {
    printFinalLine(summaries);
    if (json_file.is_open()) {
      json_file << toJson(options, world, all_iterations_per_ms, records, summaries).dump(2)
                << "\n";
      json_file.close();
      if (!json_file) throw Error("--json: writing '" + options.json + "' failed");
    }
    std::fflush(stdout);
  }
  comm->barrier();
  return 0;
}

}  // namespace
}  // namespace railshard::bench

int main(int argc, char** argv) {
  try {
    return railshard::bench::run(argc, argv);
  } catch (const railshard::bench::UsageError& e) {
    std::fprintf(stderr, "dispatch_bench: %s\n(dispatch_bench --help lists the options)\n",
                 e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dispatch_bench: %s\n", e.what());
    return 1;
  }
}
