#pragma once

#include <string>

namespace railshard::launcher::discovery {

// What decides whether a NIC may carry railshard's traffic.
struct NicFacts {
  std::string name;
  bool up = false;
  bool loopback = false;
  bool bridge_or_container = false;  // see isBridgeOrContainer
  bool rdma = false;                 // an RDMA port: usable without an IP address
  bool has_address = false;          // an IPv4 or non-link-local IPv6 address
};

// docker*, virbr*, br-*, cni*, flannel*, a bridge (has bridge/) or a bridge port (has master).
// A plain veth is not one: multi-rail tests join network namespaces with veth pairs.
bool isBridgeOrContainer(const std::string& name, bool is_bridge, bool has_master);

// Why the NIC carries no traffic; "" when it is usable. In order: not selected by `spec`
// (RAILSHARD_SOCKET_IFNAME, NCCL syntax), "down", then the default exclusions (loopback,
// bridge/container, ifb) unless the spec names the NIC, then "no address" for a non-RDMA NIC
// without one. Naming a NIC overrides the defaults, so RAILSHARD_SOCKET_IFNAME=lo works for
// single-host runs, but nothing makes a down NIC usable.
std::string exclusionReason(const NicFacts& nic, const std::string& spec);

}  // namespace railshard::launcher::discovery
