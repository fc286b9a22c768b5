#pragma once

#include <cstddef>

#include "benchmarks/sim/sim_model.h"

namespace railshard::sim {

// A start-up's costs that grow with the job (docs/simulator.md has where the figures come
// from): the store's requests, served one at a time by one server, and the start-up ring's
// all-gathers (transport/bootstrap/ring_exchange.h), N - 1 hops each.
struct StartupModel {
  double store_requests_per_rank = 11;  // counted in real start-ups: 11 N + 5 (docs/scaling.md)
  double store_requests_fixed = 5;
  // The server's CPU per request: 42-67 µs measured here (StoreStats::cpu_ns, 64-256 ranks).
  double store_service_us = 60;
  double store_round_trip_us = 60;  // a client's wait beyond the service (network, wake-ups)
  // The cluster graph every rank reads from the store (once; again with the rails' measured
  // rates under RAILSHARD_PROBE=1): its JSON grows with the ranks and the hosts. Fitted to the
  // bytes the store sent at 32-128 ranks on one host and 16 x 16 namespaced (StoreStats).
  double graph_bytes_per_rank = 100;
  double graph_bytes_per_host = 1400;
  int graph_reads = 1;
  double store_gbps = 10;  // the store host's NIC, Gbit/s
  int ring_allgathers = 4;
  double ring_value_bytes = 64;  // one rank's value in an all-gather
};

struct StartupResult {
  double store_requests = 0;
  double store_us = 0;  // the last rank's last store answer
  // The graph's copies: O(N^2) bytes, and the time the store's NIC needs to send them.
  double store_bytes_out = 0;
  double store_send_us = 0;
  double ring_us = 0;  // the all-gathers, one after another
  double total_us() const { return store_us + ring_us; }
};

// Each rank sends its requests one after another from time 0; the server answers in arrival
// order. The ring's hops are sequential: a value moves one rank on per hop.
StartupResult simulateStartup(const ClusterModel& model, const collectives::HostLayout& layout,
                              const StartupModel& startup);

}  // namespace railshard::sim
