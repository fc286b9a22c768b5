#pragma once

// How a dispatch_bench rank emulates its compute: --work sleep waits the time out (a CPU
// waiting for its GPU), --work cpu burns a calibrated number of floating-point operations per
// sample, and --quota-change rewrites its own CPU quota. The clocks the bench times with.
#include <time.h>

#include <chrono>
#include <cstdint>

#include "core/communicator.h"

namespace railshard::bench {

using SteadyClock = std::chrono::steady_clock;

double secondsOf(SteadyClock::time_point start);
timespec monotonicNow();
timespec plusMs(timespec t, double ms);
// An absolute deadline on the monotonic clock: an interrupted sleep resumes to the same end.
void sleepUntil(const timespec& deadline);
// Iterations of the work loop per millisecond on this rank, alone on a core (collective: the
// ranks take turns).
double calibrate(Communicator& comm);
// This rank's compute for `ms` milliseconds of work: sleep, or `ms * iterations_per_ms`
// iterations of the work loop.
void work(double ms, bool cpu, double iterations_per_ms);
// --quota-change: this rank's own CPU quota (its cgroup) times `factor`; ConfigError when it
// has none (not under railshard-launch --emulate-speeds).
void changeOwnQuota(double factor, int slot, int step);

}  // namespace railshard::bench
