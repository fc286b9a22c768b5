#pragma once

#include <string>

namespace railshard::dispatch {

// What a rank says about itself each step besides its samples and seconds: how loaded it is,
// what it may use, what it draws. 0 means unknown (or none) for every field, so a rank that
// cannot read a signal simply leaves it (launcher/load_monitor.h reads them).
struct LoadSignals {
  double queued_samples = 0;  // work waiting at the rank before new work can start (least_loaded)
  double memory_bytes = 0;    // host memory in use (resident)
  double memory_limit_bytes = 0;  // host memory it may use (its cgroup's limit, else the RAM)
  double gpu_utilization = 0;     // 0..1, the device's (NVML)
  double gpu_memory_bytes = 0;    // device memory in use
  double gpu_memory_total_bytes = 0;
  double cpu_quota_cores = 0;  // its CPU quota in cores (cgroup); 0 = none
  double cpu_throttled = 0;    // 0..1: the share of the last interval its quota held it back
  double power_watts = 0;      // average draw over the last interval (NVML, RAPL, emulated)
  double cap_samples = 0;      // the most samples its memory holds in one step; 0 = no cap
};

// InvalidArgument naming the rank, the field and the value when a field is negative, not
// finite, or (gpu_utilization, cpu_throttled) above 1: a nonsensical report must not move a
// plan. `who`: "rank 3" or the like.
void validate(const LoadSignals& signals, const std::string& who);

}  // namespace railshard::dispatch
