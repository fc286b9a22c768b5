#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/store.h"
#include "transport/messaging/mesh.h"

namespace railshard {

namespace topology {
class Topology;
}

// What the links of one communicator are built from.
struct ChannelOptions {
  int rank = 0;
  int size = 1;
  std::string key_prefix;
  std::string advertise_host;
  const Config* config = nullptr;
  const topology::Topology* topology = nullptr;  // the cluster graph (rails); may be null
};

// The links of every pair of ranks, chosen per pair from the cluster graph and what each host
// has (NCCL's selectTransport loop), under one messenger per peer: TCP connections on every
// rail the graph gives the pair (or one to the peer's advertised address), RDMA lanes when
// both hosts have usable ports (the TCP connections then carry control only, or stripe with
// the lanes: RAILSHARD_STRIPE_TCP), started and, for lanes connected at start-up, connected.
std::unique_ptr<transport::messaging::Mesh> connectChannels(Store& store,
                                                            const ChannelOptions& options);

}  // namespace railshard
