#include "core/dispatch/dispatch_metrics.h"

#include <mutex>
#include <string>

#include "base/metrics.h"

namespace railshard::dispatch {

void describeMetrics() {
  static std::once_flag once;
  std::call_once(once, [] {
    metrics::describe("railshard_dispatch_shard_size", "gauge",
                      "Samples of the current step each dispatcher rank (shard_rank) got.");
    metrics::describe("railshard_dispatch_samples_per_second", "gauge",
                      "Each dispatcher rank's measured throughput, as the plan uses it.");
    metrics::describe("railshard_dispatch_step", "gauge", "The step this rank planned last.");
    metrics::describe("railshard_load_queued_samples", "gauge",
                      "Work waiting at this rank before new work can start.");
    metrics::describe("railshard_load_memory_bytes", "gauge", "Host memory this rank uses.");
    metrics::describe("railshard_load_memory_limit_bytes", "gauge",
                      "Host memory this rank may use (cgroup, RAILSHARD_MEMORY_LIMIT, RAM).");
    metrics::describe("railshard_load_gpu_utilization", "gauge",
                      "Utilisation of this rank's GPU, 0..1 (NVML).");
    metrics::describe("railshard_load_gpu_memory_bytes", "gauge", "Device memory in use.");
    metrics::describe("railshard_load_gpu_memory_total_bytes", "gauge", "Device memory in all.");
    metrics::describe("railshard_load_cpu_quota_cores", "gauge",
                      "This rank's CPU quota in cores (cgroup); 0 = none.");
    metrics::describe("railshard_load_cpu_throttled_ratio", "gauge",
                      "Share of the last step this rank's CPU quota held it back.");
    metrics::describe("railshard_load_power_watts", "gauge",
                      "This rank's power draw over the last step (NVML, RAPL or emulated).");
    metrics::describe("railshard_load_samples_per_joule", "gauge",
                      "Samples this rank processes per joule (smoothed); 0 = unknown.");
    metrics::describe("railshard_load_cap_samples", "gauge",
                      "Most samples this rank's memory holds in a step; 0 = no cap.");
  });
}

void exportMetrics(const Dispatcher& d, int my_rank, int my_launch_rank) {
  describeMetrics();
  const std::string me = std::to_string(my_launch_rank);
  const StepPlan& plan = d.current();
  const auto& estimator = d.estimator();
  for (size_t r = 0; r < plan.samples.size(); ++r) {
    const metrics::Labels labels = {{"rank", me}, {"shard_rank", std::to_string(r)}};
    metrics::set("railshard_dispatch_shard_size", labels, static_cast<double>(plan.samples[r]));
    if (static_cast<int>(r) < estimator.ranks()) {
      metrics::set("railshard_dispatch_samples_per_second", labels,
                   estimator.rate(static_cast<int>(r)));
    }
  }
  const metrics::Labels mine = {{"rank", me}};
  metrics::set("railshard_dispatch_step", mine, static_cast<double>(plan.step));
  if (my_rank < 0 || my_rank >= d.worldSize()) return;
  const LoadSignals& load = d.load(my_rank);
  metrics::set("railshard_load_queued_samples", mine, load.queued_samples);
  metrics::set("railshard_load_memory_bytes", mine, load.memory_bytes);
  metrics::set("railshard_load_memory_limit_bytes", mine, load.memory_limit_bytes);
  metrics::set("railshard_load_gpu_utilization", mine, load.gpu_utilization);
  metrics::set("railshard_load_gpu_memory_bytes", mine, load.gpu_memory_bytes);
  metrics::set("railshard_load_gpu_memory_total_bytes", mine, load.gpu_memory_total_bytes);
  metrics::set("railshard_load_cpu_quota_cores", mine, load.cpu_quota_cores);
  metrics::set("railshard_load_cpu_throttled_ratio", mine, load.cpu_throttled);
  metrics::set("railshard_load_power_watts", mine, load.power_watts);
  const double joules = d.joulesPerSample(my_rank);
  metrics::set("railshard_load_samples_per_joule", mine, joules > 0 ? 1 / joules : 0);
  metrics::set("railshard_load_cap_samples", mine, load.cap_samples);
}

}  // namespace railshard::dispatch
