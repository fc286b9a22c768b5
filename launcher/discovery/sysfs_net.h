#pragma once

#include <string>
#include <vector>

#include "core/topology/elements.h"

namespace railshard::launcher::discovery {

// What <root>/class/net/<name> says about one network interface.
struct NetInterface {
  std::string name;
  int type = 0;  // ARPHRD_*: 1 ethernet, 32 infiniband, 772 loopback
  topology::LinkLayer link_layer = topology::LinkLayer::kUnknown;
  double speed_gbps = 0;  // 0 = unknown
  int mtu = 0;
  bool up = false;
  bool is_bridge = false;   // has a bridge/ directory
  bool has_master = false;  // enslaved to a bridge (or bond, ovs): a `master` link
  bool has_device = false;  // backed by a device (PCI, virtio...), not purely virtual
  std::string pci;          // PCI bus id of the device's nearest PCI ancestor
  std::string rdma_device;  // "mlx5_0" when this netdev is also an RDMA port
  int rdma_port = 0;
};

// One port of an RDMA device under <root>/class/infiniband.
struct RdmaPort {
  std::string device;  // "mlx5_0"
  int port = 0;
  std::string netdev;  // "eth2", "ib0"; "" when none maps to it
  topology::LinkLayer link_layer = topology::LinkLayer::kUnknown;
  double rate_gbps = 0;    // from ports/<p>/rate "200 Gb/sec (4X HDR)"
  bool active = false;     // ports/<p>/state "4: ACTIVE"
  std::string gid_prefix;  // first 4 groups of GID 0: "fe80:0000:0000:0000"
  std::string pci;         // the device's PCI bus id
};

struct NetScan {
  std::vector<NetInterface> interfaces;  // by name
  std::vector<RdmaPort> rdma_ports;      // by device, then port
};

// "up", or "unknown" with carrier (loopback and some virtual drivers report no operstate).
bool isOperationallyUp(const std::string& operstate, int carrier);
// "100 Gb/sec (4X EDR)" -> 100; 0 when unknown.
double parseRdmaRate(const std::string& text);

// Reads <root>/class/net and <root>/class/infiniband and maps RDMA ports to their netdevs:
// /class/infiniband/<dev>/ports/<p>/gid_attrs/ndevs/0 (RoCE), else <dev>/device/net/<if>
// (IPoIB and single-port devices). A missing /class/infiniband is normal (no RDMA here).
NetScan scanNetwork(const std::string& sysfs_root);

}  // namespace railshard::launcher::discovery
