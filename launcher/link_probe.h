#pragma once

#include <chrono>
#include <string>

#include "base/clock.h"
#include "base/store.h"
#include "core/topology/topology.h"

namespace railshard::launcher {

struct ProbeOptions {
  std::string key_prefix;                       // store namespace for the probe
  std::chrono::milliseconds bulk_time{200};     // bulk transfer per rail
  int pings = 21;                               // latency samples per rail (median)
  Duration timeout = std::chrono::seconds(60);  // every store wait and socket call
  std::string token;                            // job token, checked by the server side
};

// Run by one rank per host (its lowest rank). Hosts are paired in rounds (the circle method:
// every host meets every other once, each host in at most one pair per round), and in each
// pair the host earlier in canonical order connects to the other over every rail between
// them in turn, binding its rail address, so each measurement sees one rail alone:
//   latency   = median round trip of `pings` 8-byte messages / 2,
//   bandwidth = bytes the receiver counted / time from its first byte to end of stream,
//               while the sender streams for `bulk_time`.
// Rails without IP addresses on both ends (native InfiniBand) are left to the RDMA transport.
// The client host publishes its pair's results in the store.
void runLinkProbe(Store& store, const topology::Topology& graph, const std::string& host,
                  const ProbeOptions& options);

// Rank 0: waits for every pair's results and records each rail's measurement as a direct
// NIC -- NIC link of the rail's kind (Topology::rails() reads it from there).
void collectProbeResults(Store& store, topology::Topology& graph, const ProbeOptions& options);

// The circle-method schedule over n hosts: rounds of disjoint (i, j) pairs, i < j, covering
// every pair exactly once in n - 1 rounds (n even) or n rounds (n odd).
std::vector<std::vector<std::pair<int, int>>> probeSchedule(int hosts);

}  // namespace railshard::launcher
