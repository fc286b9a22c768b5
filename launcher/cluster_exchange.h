#pragma once

// The store exchange behind the cluster graph, shared by the graph a job starts with
// (cluster_topology.cc) and the graph a grown generation extends (cluster_growth.cc): what
// each rank says about where it runs, one discovery per host, values that carry an error to
// every rank, and the publish-then-agree step that ends both.
#include <functional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/store.h"
#include "core/topology/topology.h"
#include "launcher/cluster_topology.h"

namespace railshard::launcher::exchange {

// Store values carry a payload or an error, so that a failure on one rank (a bad interface
// spec, an unreadable topology file) reaches every rank as the same typed error instead of
// as a timeout on the others.
std::string okValue(const std::string& payload);
std::string errorValue(const std::exception& error);
// The payload, or the error raised with its type and message.
std::string openValue(const std::string& value);

// Where one rank runs.
struct RankInfo {
  std::string host_key;  // hostname + boot id + /dev/shm: one per machine (or container)
  std::string hostname;
  int bound_numa = -1;
};
RankInfo thisRank(const ClusterTopologyOptions& options);
// Publishes `info` as rank `rank`'s, under `base` (".../topo").
void publishRank(Store& store, const std::string& base, int rank, const RankInfo& info,
                 Duration timeout);
// Every rank's, 0..size-1, within one `timeout` (TimeoutError naming the first missing).
std::vector<RankInfo> gatherRanks(Store& store, const std::string& base, int size,
                                  Duration timeout);

// The short store slot of a host key.
std::string hostSlot(const std::string& host_key);
// The first rank to arrive from `info`'s host discovers it and publishes its graph (or the
// error) at base/host/<slot>; the others return at once.
void discoverOncePerHost(Store& store, const std::string& base, const RankInfo& info,
                         const ClusterTopologyOptions& options, Duration timeout);
// The host graph published for `host_key`.
topology::Topology hostGraph(Store& store, const std::string& base, const std::string& host_key,
                             Duration timeout);
// Merges `host` into `cluster`, renaming it when another machine has its name; returns the
// id it got.
std::string mergeHost(topology::Topology& cluster, topology::Topology host,
                      const std::string& what);

// Rank 0 publishes make()'s graph (or its error) as round `round` (the others wait for it
// twice `timeout`: make() may wait that long for the ranks and a host); every rank parses it,
// checks its hash and reports; rank 0 turns the reports into one verdict every rank raises
// (MismatchError when any rank computed another hash). Returns the graph.
topology::Topology distribute(Store& store, const ClusterTopologyOptions& options,
                              const std::string& round,
                              const std::function<topology::Topology()>& make, Duration timeout);

// RAILSHARD_PROBE=1: each host's lowest rank measures the rails to every other host, rank 0
// records the measurements and distributes the result as round `round`.
topology::Topology probeRails(Store& store, const ClusterTopologyOptions& options,
                              const topology::Topology& graph, const std::string& round,
                              Duration timeout);

}  // namespace railshard::launcher::exchange
