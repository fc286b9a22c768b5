#include "launcher/load_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "base/logging.h"

namespace railshard::launcher {

namespace {

double ramBytes(const std::string& proc) {
  std::ifstream in(proc + "/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

}  // namespace

LoadMonitor::Options LoadMonitor::fromConfig(const Config& config, int gpu_index) {
  Options options;
  options.gpu_index = gpu_index;
  options.memory_limit_bytes = static_cast<double>(config.memory_limit_bytes);
  options.emulated_watts = config.power_watts;
  return options;
}

LoadMonitor::LoadMonitor(Options options)
    : options_(std::move(options)),
      gpu_(std::make_unique<NvmlDevice>(options_.gpu_index)),
      power_(PowerMeter::Options{gpu_.get(), options_.powercap_root, options_.proc,
                                 options_.emulated_watts}),
      cpu_(cgroup::locate("cpu", options_.proc)),
      memory_(cgroup::locate("memory", options_.proc)),
      ram_bytes_(ramBytes(options_.proc)) {
  if (options_.gpu_index >= 0 && !gpu_->available()) {
    sayOnce("gpu", "load signals: no GPU utilisation or memory: " + gpu_->why());
  }
  if (!power_.available()) {
    sayOnce("power", "load signals: no power source (no NVML GPU, no readable RAPL zone under " +
                         options_.powercap_root +
                         ", RAILSHARD_POWER_WATTS unset): energy is unknown and the energy policy "
                         "plans as proportional");
  } else {
    RS_LOG_DEBUG("load signals: power from {}", power_.source());
  }
  if (!cpu_.found()) {
    sayOnce("cpu", "load signals: no cgroup cpu controller: CPU quota and throttling unknown");
  }
}

LoadMonitor::~LoadMonitor() = default;

void LoadMonitor::sayOnce(const std::string& key, const std::string& what) {
  if (said_.insert(key).second) RS_LOG_INFO("{}", what);
}

LoadMonitor::Sample LoadMonitor::sample() {
  Sample out;
  dispatch::LoadSignals& s = out.signals;
  {
    std::ifstream statm(options_.proc + "/self/statm");
    long long pages_total = 0;
    long long pages_resident = 0;
    if (statm >> pages_total >> pages_resident) {
      s.memory_bytes =
          static_cast<double>(pages_resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    }
  }
  // What it may use: the tightest of its cgroup, the configured cap and the machine.
  double limit = ram_bytes_;
  const double group = cgroup::memoryLimitBytes(memory_);
  if (group > 0) limit = limit > 0 ? std::min(limit, group) : group;
  if (options_.memory_limit_bytes > 0) {
    limit = limit > 0 ? std::min(limit, options_.memory_limit_bytes) : options_.memory_limit_bytes;
  }
  s.memory_limit_bytes = std::max(limit, 0.0);

  const auto now = std::chrono::steady_clock::now();
  const double quota = cgroup::cpuQuotaCores(cpu_);
  if (quota >= 0) {
    s.cpu_quota_cores = quota;
  } else if (cpu_.found()) {
    sayOnce("quota", "load signals: cannot read the CPU quota under " + cpu_.dir);
  }
  const double throttled = cgroup::throttledSeconds(cpu_);
  if (throttled >= 0 && last_throttled_ >= 0) {
    const double interval = std::chrono::duration<double>(now - last_time_).count();
    if (interval > 0)
      s.cpu_throttled = std::clamp((throttled - last_throttled_) / interval, 0.0, 1.0);
  }
  last_throttled_ = throttled;
  last_time_ = now;

  if (gpu_->available()) {
    s.gpu_utilization = std::clamp(gpu_->utilization(), 0.0, 1.0);
    s.gpu_memory_bytes = std::max(gpu_->memoryUsedBytes(), 0.0);
    s.gpu_memory_total_bytes = std::max(gpu_->memoryTotalBytes(), 0.0);
  }
  const PowerMeter::Reading power = power_.sample();
  s.power_watts = power.watts;
  out.energy_joules = power.joules;
  return out;
}

}  // namespace railshard::launcher
