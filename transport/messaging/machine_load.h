#pragma once

namespace railshard::transport::messaging {

// The input of planWait (wait_policy.h) that comes from the machine. (The rank's CPU quota is
// launcher/cgroup.h's: init() fits the spin budget to it.)

// Cores the calling thread may run on (its affinity mask; taskset, cpusets).
unsigned allowedCores();

}  // namespace railshard::transport::messaging
