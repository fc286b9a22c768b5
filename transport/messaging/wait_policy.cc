#include "transport/messaging/wait_policy.h"

#include <algorithm>

namespace railshard::transport::messaging {
namespace {

// With a core per rank, `pause` polling catches a peer a few microseconds behind; after this
// long it is more likely descheduled, and yielding lets whatever it waits for run.
constexpr auto kPauseTime = std::chrono::microseconds(20);
// A sleeper still glances this long: a collective whose peers are already there costs no
// system call.
constexpr auto kGlance = std::chrono::microseconds(2);

WaitPlan spinPlan(const MachineState& machine, Duration spin) {
  WaitPlan plan;
  const bool oversubscribed = machine.local_ranks > std::max(1u, machine.cores);
  plan.pause = oversubscribed ? Duration(0) : kPauseTime;
  plan.poll = spin;
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
  return mode == WaitMode::kSleep ? sleepPlan(spin) : spinPlan(machine, spin);
}

}  // namespace railshard::transport::messaging
