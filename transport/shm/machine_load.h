#pragma once

namespace railshard::transport::shm {

// The inputs of planWait (wait_policy.h) that come from the machine. (The rank's CPU quota is
// launcher/cgroup.h's: init() fits the spin budget to it.)

// Runnable threads on the machine right now (the 4th field of /proc/loadavg, "R/T"; the
// reader itself included); 0 when it cannot be read.
unsigned runnableThreads();

// Cores the calling thread may run on (its affinity mask; taskset, cpusets).
unsigned allowedCores();

}  // namespace railshard::transport::shm
