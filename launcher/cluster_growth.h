#pragma once

#include "core/communicator.h"
#include "core/topology/topology.h"
#include "launcher/cluster_topology.h"

namespace railshard::launcher {

// The cluster graph of a generation that admits joiners (Communicator::grow() on the members,
// Communicator::join() on the joiners, through Options::extend_topology). Every rank of the
// new generation calls it; `options` gives the configuration and the test overrides (its
// rank, size and key_prefix are taken from `round`):
//  1. every rank publishes where it runs; the first joiner from each host discovers that host
//     (a member's host is in the members' graph already; with RAILSHARD_TOPO_FILE the file
//     must name it);
//  2. rank 0 (a member: members come first) places the joiners in the members' graph: on the
//     host of a member with the same host identity, else on a host the graph knows by name
//     that has no ranks left (every rank of a machine was lost and one came back), else on
//     the joiner's discovered host, merged in (renamed when its name is taken). A joiner takes
//     the lowest local rank free on its host (a restarted rank gets its slot's GPU back);
//     members keep their placements;
//  3. every rank checks the graph's hash, as at start-up (MismatchError on every rank);
//  4. with RAILSHARD_PROBE=1, when a host of joiners alone is in the graph, the rails are
//     measured again.
// Errors on rank 0 (a joiner's discovery failed, a host the topology file does not name) are
// raised on every rank with their type; every wait is bounded by config.connect_timeout.
topology::Topology extendClusterTopology(Store& store, const Communicator::GraphRound& round,
                                         const ClusterTopologyOptions& options);

// What Communicator::Options::extend_topology takes: extendClusterTopology with `config`.
Communicator::GraphExtender graphExtender(const Config& config);

}  // namespace railshard::launcher
