#pragma once

#include <string>
#include <vector>

#include "core/topology/topology.h"

namespace railshard::tracing {

// The bandwidth the topology says a collective could at best have had: what "efficiency"
// (busbw / limit) is measured against in allreduce_perf and railshard-report.
struct LinkLimit {
  double gbps = 0;  // Gbit/s; 0 = a hop's speed is unknown (no efficiency)
  int from = -1;    // the bottleneck hop, as topology ranks
  int to = -1;
  std::string description;  // "rank 1 (node-a) -> rank 2 (node-b): 2 rails, 2.0 + 0.5 Gbit/s"
};

// A ring over `ring` (topology ranks in ring order, e.g. the communicator's world ranks) moves
// the same bytes over every hop r -> next(r), so busbw is bounded by the slowest hop. A hop
// between hosts gets the sum of the rails between them (the rail scheduler stripes over all
// of them; measured speed when probed, else nominal); a hop inside a host the speed of its
// path; a same-host hop whose speed discovery does not know (plain shared memory) does not
// count when the ring crosses hosts. gbps = 0 when a network hop's speed is unknown, or on one
// host without a known speed. InvalidArgument when a rank is outside the topology or fewer than
// two ranks are given.
LinkLimit ringLimit(const topology::Topology& topology, const std::vector<int>& ring);

// ringLimit over 0..worldSize()-1.
LinkLimit ringLimit(const topology::Topology& topology);

// The bandwidth of one hop a -> b as ringLimit counts it.
LinkLimit hopLimit(const topology::Topology& topology, int a, int b);

}  // namespace railshard::tracing
