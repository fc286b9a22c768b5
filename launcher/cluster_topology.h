#pragma once

#include <string>

#include "base/config.h"
#include "base/store.h"
#include "core/topology/topology.h"

namespace railshard::launcher {

struct ClusterTopologyOptions {
  int rank = 0;
  int size = 1;
  Config config;  // socket_ifname, topo_file, topo_dump, probe, connect_timeout
  std::string key_prefix = "railshard";
  // Host discovery overrides (tests): sysfs root, whether to use hwloc.
  std::string sysfs_root = "/sys";
  std::string hostname;  // "" = this machine's
};

// Every rank calls this once at start-up and gets the same cluster graph:
//  1. each rank publishes where it runs (host, CPU binding); the first rank to arrive on a
//     host discovers it (launcher/discovery) and publishes the host's graph, so each host is
//     scanned once, not once per rank;
//  2. rank 0 merges the hosts (or loads RAILSHARD_TOPO_FILE instead), places the ranks, and
//     publishes the graph with its hash;
//  3. with RAILSHARD_PROBE=1 the host leaders measure every rail (launcher/link_probe) and
//     rank 0 republishes the graph with the measurements;
//  4. every rank parses the graph, recomputes its hash and reports; rank 0 collects the
//     reports and publishes one verdict, so a disagreement is a MismatchError on every rank.
// An error on any rank during steps 1-2 (a bad RAILSHARD_SOCKET_IFNAME, a broken topology
// file) travels through the store and is raised, with its type and message, on every rank.
// Every wait is bounded by config.connect_timeout.
topology::Topology buildClusterTopology(Store& store, const ClusterTopologyOptions& options);

// Where ranks go on a host: the GPU (local_rank modulo the GPUs, the torch.cuda.set_device
// (local_rank) convention) and the NUMA node of that GPU; without GPUs the NUMA node the
// process is bound to (bound_numa >= 0), else NUMA nodes in blocks of local ranks.
topology::RankPlacement placeRank(const topology::Topology& host_graph, const std::string& host,
                                  int rank, int local_rank, int local_size, int bound_numa);

// The NUMA node (OS index) whose CPUs contain all CPUs this process may run on; -1 when it
// may run on several (unbound) or the information is missing.
int boundNumaNode(const std::string& sysfs_root = "/sys");

}  // namespace railshard::launcher
