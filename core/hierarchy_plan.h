#pragma once

// The two-level layout of a hierarchical all-reduce (core/hierarchical_allreduce.h): ranks
// that share a host form a local group (NCCL inside the node), and the ranks with the same
// local rank on every host form a cross-node group (railshard between nodes). Pure: computed
// from the host of every rank, identically on every rank, so all ranks agree on it without
// talking.
#include <cstddef>
#include <string>
#include <vector>

#include "core/collectives/ring.h"

namespace railshard {

struct HierarchyPlan {
  // False when a two-level all-reduce does not fit this job; `reason` says why and what runs
  // instead. The fields below are filled as far as the hosts allow even then. One host with
  // several ranks is usable: the all-reduce is then NCCL's alone (no cross-node level).
  bool usable = false;
  std::string reason;

  int rank = 0;
  int local_rank = 0;                   // my position in local_ranks
  std::vector<int> local_ranks;         // the ranks on my host, in rank order
  int node = 0;                         // my host's index in node_hosts
  std::vector<std::string> node_hosts;  // every host once, in order of first appearance
  std::vector<int> node_of_rank;        // node index of every rank
  // The rank with my local rank on every host, by node index: my cross-node group, in which
  // my rank is `node`. Empty when hosts have different numbers of ranks.
  std::vector<int> cross_ranks;

  int localSize() const { return static_cast<int>(local_ranks.size()); }
  int numNodes() const { return static_cast<int>(node_hosts.size()); }

  // `hosts`: the host of every rank, by rank. InvalidArgument for an empty list or a rank
  // outside it.
  static HierarchyPlan make(const std::vector<std::string>& hosts, int rank);

  // Which elements of a `count`-element buffer each local rank owns (reduces across nodes
  // and broadcasts inside the node): local rank r owns [offset[r], offset[r] + length[r]),
  // balanced as the ring's segments are; the shards cover every element exactly once.
  collectives::SegmentLayout shards(size_t count) const;
};

}  // namespace railshard
