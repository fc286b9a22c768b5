#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/topology/topology.h"
#include "launcher/interfaces.h"

namespace railshard::launcher::discovery {

struct DiscoveryOptions {
  std::string sysfs_root = "/sys";  // tests point this at a fake tree
  std::string socket_ifname;        // RAILSHARD_SOCKET_IFNAME spec (NCCL syntax)
  std::string hostname;             // "" = gethostname(); also the host vertex id
  bool use_hwloc = true;            // false: NUMA/cores from sysfs only
  bool use_nvml = true;             // false: no NVML (GPUs only from the PCI scan)
  // Interface addresses; nullopt = getifaddrs(). Tests inject them.
  std::optional<std::vector<InterfaceAddress>> addresses;
};

// One host's graph: host vertex, NUMA nodes, PCIe switches, GPUs, NICs, the networks its NICs
// are on, and the links between them (ids and conventions: docs in host_discovery.cc). hwloc
// and NVML describe the running machine, so they are consulted only when sysfs_root is "/sys".
// Never throws for a missing optional part (logs at info and carries on); throws ConfigError
// when socket_ifname selects no usable interface (the message lists the interfaces that
// exist and why each is unusable).
topology::Topology discoverHost(const DiscoveryOptions& options);

}  // namespace railshard::launcher::discovery
