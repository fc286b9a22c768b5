#pragma once

// This process's control groups, as the load signals read them (CPU quota and throttling,
// memory limit) and as railshard-launch --emulate-speeds writes them (a CPU quota per rank):
// cgroup v1 (a hierarchy per controller, /sys/fs/cgroup/cpu) or v2 (the unified hierarchy).
#include <string>

#include "base/config.h"

namespace railshard::launcher::cgroup {

// Where controller `controller` ("cpu", "memory") holds this process: the group's directory,
// the hierarchy's mount point (the top the limits are inherited from) and the version. dir
// is empty when no mounted hierarchy has the controller.
struct Location {
  std::string dir;
  std::string mount;
  bool v2 = false;
  bool found() const { return !dir.empty(); }
};
// `proc`: /proc (tests point it at a fake tree with self/mountinfo and self/cgroup).
Location locate(const std::string& controller, const std::string& proc = "/proc");

// The CPU time the group at `dir` may use, in cores (quota / period), the smallest along the
// path up to `mount`; 0 when no quota is set. -1 when the files cannot be read.
double cpuQuotaCores(const Location& location);
// Seconds the group was throttled (its quota used up) since it was made; -1 when unknown.
double throttledSeconds(const Location& location);
// The memory limit of the group, the smallest along the path (v1 memory.limit_in_bytes, v2
// memory.max); 0 when unlimited, -1 when unreadable.
double memoryLimitBytes(const Location& location);

// Sets the CPU quota of the group at `dir` to `cores` (> 0) with `period_us`: v1
// cpu.cfs_period_us + cpu.cfs_quota_us, v2 cpu.max. ConfigError naming the file and errno.
void setCpuQuota(const Location& location, double cores, int period_us);

// Sets the memory limit of the group at `dir` to `bytes` (> 0): v1 memory.limit_in_bytes, v2
// memory.max. ConfigError naming the file and errno.
void setMemoryLimit(const Location& location, double bytes);

// A rank whose CPU quota is below one core does not spin while it waits (unless
// RAILSHARD_SPIN_US says so: `spin_set`): spinning spends the quota it needs to compute, and a
// rank that used up its quota waiting sits out the rest of the period when its data arrives.
void fitWaitsToQuota(Config& config, bool spin_set);

}  // namespace railshard::launcher::cgroup
