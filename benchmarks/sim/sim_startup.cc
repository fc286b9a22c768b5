// The start-up's store requests and ring all-gathers in virtual time (sim_startup.h).
#include "benchmarks/sim/sim_startup.h"

#include <algorithm>
#include <queue>
#include <vector>

namespace railshard::sim {

StartupResult simulateStartup(const ClusterModel& model, const collectives::HostLayout& layout,
                              const StartupModel& startup) {
  StartupResult result;
  const int n = layout.worldSize();
  const auto per_rank = static_cast<int>(startup.store_requests_per_rank + 0.5);
  result.store_requests = static_cast<double>(per_rank) * n + startup.store_requests_fixed;
  // Requests in arrival order at the one server: (time it reaches the server, rank).
  using Arrival = std::pair<double, int>;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  std::vector<int> left(static_cast<size_t>(n), per_rank);
  const double half_trip = startup.store_round_trip_us / 2;
  for (int r = 0; r < n; ++r) {
    if (per_rank > 0) arrivals.push({half_trip, r});
  }
  double server_free = 0;
  while (!arrivals.empty()) {
    const auto [at, rank] = arrivals.top();
    arrivals.pop();
    server_free = std::max(server_free, at) + startup.store_service_us;
    const double answered = server_free + half_trip;
    result.store_us = std::max(result.store_us, answered);
    if (--left[static_cast<size_t>(rank)] > 0) arrivals.push({answered + half_trip, rank});
  }
  const double graph =
      startup.graph_bytes_per_rank * n + startup.graph_bytes_per_host * layout.hostCount();
  result.store_bytes_out = graph * startup.graph_reads * n;
  result.store_send_us = result.store_bytes_out / (startup.store_gbps / 8 * 1e3);
  // A hop crosses hosts where the ring's neighbours are on different hosts: ranks are
  // numbered host by host, so H of the N hops.
  const double hosts = layout.hostCount();
  auto hop = [&](const collectives::LinkModel& link) {
    return link.alpha_us + startup.ring_value_bytes / (link.beta_gbps * 1e3) +
           2 * model.message_cpu_us + model.wake_cpu_us;
  };
  const double per_allgather = (n - 1) * ((hosts > 1 ? hosts / n : 0) * hop(model.network) +
                                          (1 - (hosts > 1 ? hosts / n : 0)) * hop(model.loopback));
  result.ring_us = startup.ring_allgathers * per_allgather;
  return result;
}

}  // namespace railshard::sim
