#pragma once

namespace railshard::transport::shm {

// The inputs of planWait (wait_policy.h) that come from the machine.

// Runnable threads on the machine right now (the 4th field of /proc/loadavg, "R/T"; the
// reader itself included); 0 when it cannot be read.
unsigned runnableThreads();

// Cores the calling thread may run on (its affinity mask; taskset, cpusets).
unsigned allowedCores();

// The CPU quota of this process's cgroup in cores (cgroup v1 cpu.cfs_quota_us /
// cpu.cfs_period_us, or v2 cpu.max), the smallest along the path to the root; 0 when there is
// none. Read where the cgroup file systems are usually mounted (/sys/fs/cgroup).
double cpuQuotaCores();

}  // namespace railshard::transport::shm
