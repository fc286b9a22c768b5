#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace railshard::plugins::nccl {

// One network rail of this host as the plugin offers it: an interface with an IPv4 address,
// or an HCA port (rdma_rails.h).
struct Rail {
  std::string name;       // the interface: "rail0", "eth2"; an HCA port: "mlx5_0:1"
  std::string address;    // its IPv4 address (a TCP rail's)
  int prefix_length = 0;  // of its subnet
  double gbps = 0;        // nominal (sysfs speed; RAILSHARD_NCCL_RAIL_GBPS overrides); 0 = unknown
  std::string pci_path;   // /sys/devices/... of the NIC; "" for a virtual interface
  uint64_t guid = 0;      // from the MAC address (an HCA's node GUID): one guid, one port to NCCL
  bool rdma = false;      // an HCA port
  char layer = 0;         // an HCA port's link layer: 'I' (InfiniBand) or 'E' (RoCE)
  int rdma_port = -1;     // which port findRdmaRails() found
};

// 'I' or 'E' per RDMA rail of `rails`, in order: what a peer pairs its own rails against (lane
// r joins rail r of each end where both have one of the same layer).
std::string rdmaLayers(const std::vector<Rail>& rails);

// What NCCL sees as one network device: one rail, or one fused device over all of them. An
// RDMA rail's connection records travel over TCP: alone, its device has the host's TCP rails
// too, carrying control only.
struct NetDevice {
  std::string name;        // "railshard-rail0", "railshard-fused(rail0+rail1)"
  std::vector<int> rails;  // indices into the rails
  bool fused = false;
  bool tcp_data = true;      // its TCP rails carry data (else only control: an RDMA rail alone)
  std::vector<int> members;  // a virtual device's (makeVDevice): the devices it merges
};

// Which devices to offer (RAILSHARD_NCCL_DEVICES): the fused one (one device striping over
// every rail by measured rate: what NCCL cannot do itself), each rail alone (as NCCL's own
// socket transport would), or both (rails first, the fused device last).
enum class DeviceSet { kFused, kRails, kAll };

struct DeviceOptions {
  std::string interfaces;  // RAILSHARD_NCCL_RAILS: NCCL_SOCKET_IFNAME syntax; "" = every up one
  DeviceSet set = DeviceSet::kFused;
  std::vector<double> gbps;  // RAILSHARD_NCCL_RAIL_GBPS: nominal rate per TCP rail, in rail order
  bool rdma = true;          // RAILSHARD_NCCL_RDMA: offer the HCA ports too (rdma_rails.h)
  std::string sysfs_root = "/sys";
};

// This host's rails: every up, non-loopback IPv4 interface the spec selects, by name.
std::vector<Rail> findRails(const DeviceOptions& options);
// The devices over `rails` (TCP rails, then RDMA rails; a single rail is offered alone whatever
// the set says; an RDMA rail only where there is a TCP rail for its records).
std::vector<NetDevice> makeDevices(const std::vector<Rail>& rails, DeviceSet set);

// From the environment: RAILSHARD_NCCL_RAILS, RAILSHARD_NCCL_DEVICES, RAILSHARD_NCCL_RAIL_GBPS,
// RAILSHARD_NCCL_RDMA.
// ConfigError naming the variable when a value is malformed.
DeviceOptions deviceOptionsFromEnvironment();

}  // namespace railshard::plugins::nccl
