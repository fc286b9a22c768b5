#include "transport/shm/wait_policy.h"

#include <algorithm>

namespace railshard::transport::shm {
namespace {

// With a core per rank, `pause` polling catches a peer a few microseconds behind; after this
// long it is more likely descheduled, and yielding lets whatever it waits for run.
constexpr auto kPauseTime = std::chrono::microseconds(20);
// A sleeper still glances this long: a collective whose peers are already there costs no
// system call.
constexpr auto kGlance = std::chrono::microseconds(2);

// `busy`: other processes want the cores too; a yield would hand ours to one of them for a
// whole slice, so the poller keeps it (pause) until the budget is spent.
WaitPlan spinPlan(const MachineState& machine, Duration spin, bool busy) {
  WaitPlan plan;
  const bool oversubscribed = machine.local_ranks > std::max(1u, machine.cores);
  plan.pause = oversubscribed ? Duration(0) : busy ? spin : kPauseTime;
  plan.poll = spin;
  plan.busy = busy;
  return plan;
}

WaitPlan sleepPlan(Duration spin) {
  WaitPlan plan;
  plan.poll = std::min<Duration>(spin, kGlance);
  plan.sleeps_early = true;
  return plan;
}

}  // namespace

WaitPlan planWait(WaitMode mode, const MachineState& machine, Duration spin) {
  switch (mode) {
    case WaitMode::kSpin:
      return spinPlan(machine, spin, false);
    case WaitMode::kSleep:
      return sleepPlan(spin);
    case WaitMode::kAuto:
      break;
  }
  // Every rank of the host is counted as runnable (a polling rank is), so what is left is
  // someone else's.
  const unsigned others =
      machine.runnable > machine.local_ranks ? machine.runnable - machine.local_ranks : 0;
  return spinPlan(machine, spin, others > 0 && machine.local_ranks + others > machine.cores);
}

}  // namespace railshard::transport::shm
