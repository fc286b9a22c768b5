// Prints this machine's load signals as a rank would report them (launcher::LoadMonitor), one
// JSON object per line: for a GPU check (scripts/gpu_check.sh: NVML utilisation, memory,
// power and energy while the GPU works) and for looking at a host by hand.
//
//   load_probe [GPU_INDEX [SAMPLES [INTERVAL_MS]]]     (defaults: -1, 5, 500)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "base/config.h"
#include "launcher/load_monitor.h"

int main(int argc, char** argv) {
  const int gpu = argc > 1 ? std::atoi(argv[1]) : -1;
  const int samples = argc > 2 ? std::atoi(argv[2]) : 5;
  const int interval_ms = argc > 3 ? std::atoi(argv[3]) : 500;
  using railshard::launcher::LoadMonitor;
  LoadMonitor monitor(LoadMonitor::fromConfig(railshard::Config::fromEnvironment(), gpu));
  std::printf("{\"gpu\": %d, \"has_gpu\": %s, \"power_source\": \"%s\"}\n", gpu,
              monitor.hasGpu() ? "true" : "false", monitor.powerSource().c_str());
  for (int i = 0; i < samples; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    const auto s = monitor.sample();
    const auto& l = s.signals;
    std::printf(
        "{\"sample\": %d, \"memory_bytes\": %.0f, \"memory_limit_bytes\": %.0f, "
        "\"gpu_utilization\": %.3f, \"gpu_memory_bytes\": %.0f, \"gpu_memory_total_bytes\": %.0f, "
        "\"cpu_quota_cores\": %.3f, \"cpu_throttled\": %.3f, \"power_watts\": %.1f, "
        "\"energy_joules\": %.2f}\n",
        i, l.memory_bytes, l.memory_limit_bytes, l.gpu_utilization, l.gpu_memory_bytes,
        l.gpu_memory_total_bytes, l.cpu_quota_cores, l.cpu_throttled, l.power_watts,
        s.energy_joules);
    std::fflush(stdout);
  }
  return 0;
}
