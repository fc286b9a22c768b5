#pragma once

#include "base/clock.h"
#include "base/config.h"

namespace railshard::transport::messaging {

// What a wait knows about the machine (machine_load.h reads it).
struct MachineState {
  unsigned cores = 1;        // cores this process may run on (affinity)
  unsigned local_ranks = 1;  // ranks of this host (they share its cores)
};

// How every wait of the library (waiter.h) passes the time before it sleeps in the kernel
// (futex): poll with `pause` for `pause`, then poll yielding the core until `poll` has passed
// in all.
struct WaitPlan {
  Duration pause{0};
  Duration poll{0};
  bool sleeps_early = false;  // glances, then sleeps (RAILSHARD_WAIT=sleep)
};

// Pure: no I/O, no clock (tests/wait_policy_test.cc drives it with synthetic machines).
//
// kAuto and kSpin: `pause` for 20 µs (a peer a few microseconds behind on another core is
// caught without a system call), then yield the core (the peer may be waiting for it), then
// sleep when the spin budget is spent; with more ranks than cores, yield from the start (the
// ranks compete with each other, and yielding hands the core to the rank waited for, issue
// #3). kSleep glances 2 µs, then sleeps.
//
// What was tried and dropped (docs/benchmarks.md, "Waiting under contention"): with other
// processes busy on the cores, polling with `pause` through the whole budget without ever
// yielding. It kept 8 B all-reduces fast beside two CPU hogs, but where the peer shared its
// core with a hog the waiter held its own core for the whole budget each time: 64 KiB-4 MiB
// all-reduces took 2-19 ms instead of 0.05-1.5 ms in some runs. A CPU quota under one core is
// not looked at here: init() sets the spin budget to 0 for such a rank
// (launcher::cgroup::fitWaitsToQuota), and a zero budget sleeps at once.
WaitPlan planWait(WaitMode mode, const MachineState& machine, Duration spin);

}  // namespace railshard::transport::messaging
