#include "benchmarks/dispatch_work.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "base/error.h"
#include "launcher/cgroup.h"
#include "launcher/rank_groups.h"

namespace railshard::bench {

namespace {

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

}  // namespace

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

// --quota-change: this rank's own CPU quota (its cgroup) times `factor`: the machine makes it
// slower or faster, and only its load signals can tell the dispatcher before its rate does.
void changeOwnQuota(double factor, int slot, int step) {
  const auto group = launcher::cgroup::locate("cpu");
  const double cores = launcher::cgroup::cpuQuotaCores(group);
  if (cores <= 0) {
    throw ConfigError("--quota-change: slot " + std::to_string(slot) +
                      " has no CPU quota to change (run it under railshard-launch "
                      "--emulate-speeds)");
  }
  launcher::cgroup::setCpuQuota(group, cores * factor, launcher::RankGroups::kPeriodUs);
  std::printf("# slot %d: CPU quota %.3f -> %.3f cores in step %d\n", slot, cores, cores * factor,
              step);
  std::fflush(stdout);
}

}  // namespace railshard::bench
