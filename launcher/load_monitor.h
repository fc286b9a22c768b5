#pragma once

#include <memory>
#include <set>
#include <string>

#include "base/config.h"
#include "core/dispatch/load_signals.h"
#include "launcher/cgroup.h"
#include "launcher/nvml_device.h"
#include "launcher/power_meter.h"

namespace railshard::launcher {

// Reads this process's load signals for the dispatcher (core/dispatch/load_signals.h), once a
// step: resident memory and the memory it may use (the smallest of its cgroup's limit,
// RAILSHARD_MEMORY_LIMIT and the RAM); its CPU quota and the share of the last interval the
// quota held it back (cgroup cpu); its GPU's utilisation and memory (NVML); its power and the
// energy it drew over the interval (PowerMeter). A signal that cannot be read stays 0 and is
// said once at info level with what the policies do without it. queued_samples and
// cap_samples are the caller's.
class LoadMonitor {
 public:
  struct Options {
    int gpu_index = -1;             // this rank's GPU, or -1
    double memory_limit_bytes = 0;  // RAILSHARD_MEMORY_LIMIT; 0 = none
    double emulated_watts = 0;      // RAILSHARD_POWER_WATTS
    std::string powercap_root = "/sys/class/powercap";
    std::string proc = "/proc";
  };
  static Options fromConfig(const Config& config, int gpu_index);

  explicit LoadMonitor(Options options);
  explicit LoadMonitor(int gpu_index = -1) : LoadMonitor(Options{gpu_index}) {}
  ~LoadMonitor();
  LoadMonitor(const LoadMonitor&) = delete;
  LoadMonitor& operator=(const LoadMonitor&) = delete;

  struct Sample {
    dispatch::LoadSignals signals;
    double energy_joules = 0;  // drawn since the previous sample (0: unknown)
  };
  Sample sample();
  bool hasGpu() const { return gpu_->available(); }
  const std::string& powerSource() const { return power_.source(); }

 private:
  // Logs `what` once at info level (an unreadable signal is news once, not every step).
  void sayOnce(const std::string& key, const std::string& what);

  Options options_;
  std::unique_ptr<NvmlDevice> gpu_;
  PowerMeter power_;
  cgroup::Location cpu_;
  cgroup::Location memory_;
  double ram_bytes_ = 0;
  double last_throttled_ = -1;
  std::chrono::steady_clock::time_point last_time_{};
  std::set<std::string> said_;
};

}  // namespace railshard::launcher
