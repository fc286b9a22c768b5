#pragma once

#include "base/clock.h"
#include "base/config.h"

namespace railshard::transport::shm {

// What a shared-memory wait knows about the machine (machine_load.h samples it).
struct MachineState {
  unsigned runnable = 0;     // runnable threads on the machine now, this rank's included
  unsigned cores = 1;        // cores this process may run on (affinity)
  unsigned local_ranks = 1;  // ranks of this host (they share its cores)
};

// How one wait passes the time before it sleeps in the kernel (futex): poll with `pause` for
// `pause`, then poll yielding the core until `poll` has passed in all.
struct WaitPlan {
  Duration pause{0};
  Duration poll{0};
  bool sleeps_early = false;  // glances, then sleeps (RAILSHARD_WAIT=sleep)
  bool busy = false;          // other processes want the cores: `pause` only, no yield
};

// Pure: no I/O, no clock (tests/wait_policy_test.cc drives it with synthetic machines).
//
// Measured on 2 vCPUs under Linux 6.18's EEVDF scheduler (docs/benchmarks.md, "Waiting under
// contention"): with two busy processes beside a 2-rank job, a rank that sleeps on the futex
// or yields its core loses the core to a busy process for a whole time slice (8 B all-reduce
// 1.2-1.8 ms instead of 0.5 µs), while one that keeps polling with `pause` holds it until its
// peer posts. So:
//  - other processes want the cores (runnable threads beyond ours exceed the cores): poll
//    with `pause` for the whole spin budget, never yield;
//  - more ranks than cores, nothing else running: the ranks only compete with each other, and
//    yielding hands the core straight to the rank waited for (issue #3);
//  - otherwise `pause` for 20 µs, then yield, then sleep (the behaviour before RAILSHARD_WAIT).
// A CPU quota under one core is not looked at here: init() already sets the spin budget to 0
// for such a rank (launcher::cgroup::fitWaitsToQuota), and a zero budget sleeps at once.
// kSpin never looks at the load; kSleep always glances and sleeps.
WaitPlan planWait(WaitMode mode, const MachineState& machine, Duration spin);

}  // namespace railshard::transport::shm
