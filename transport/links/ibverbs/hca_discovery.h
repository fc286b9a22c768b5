#pragma once

#include <string>
#include <vector>

#include "transport/links/ibverbs/gid_table.h"
#include "transport/links/ibverbs/verbs_api.h"

namespace railshard::transport::links::ibverbs {

// One usable HCA port: a rail for the RDMA transport.
struct HcaPort {
  std::string device;  // "mlx5_0"
  int port = 1;
  bool infiniband = true;  // link layer; false: Ethernet (RoCE)
  ibv_mtu active_mtu = IBV_MTU_1024;
  uint16_t lid = 0;
  double gbps = 0;  // active width x lane speed
  int gid_index = 0;
  std::array<uint8_t, 16> gid{};
  std::string gid_reason;  // how the GID was chosen
};

// Data rate of a port from ibv_port_attr's active_width and active_speed codes (Gbit/s);
// 0 for codes this table does not know.
double portGbps(uint8_t active_width, uint32_t active_speed);
std::string linkLayerName(uint8_t link_layer);

// Whether ibv_device_attr.vendor_id names a device implemented in software by the kernel:
// Soft-RoCE (rdma_rxe, 0xffffff) or soft iWARP (siw, 0x626d74).
bool isSoftwareDevice(uint32_t vendor_id);

// "mlx5_0,mlx5_1:1" (RAILSHARD_IB_HCA): device names, each optionally with a port; empty
// selects every device. Whether `device`:`port` is selected.
bool hcaSelected(const std::string& filter, const std::string& device, int port);

struct HcaScan {
  std::vector<HcaPort> ports;        // active, selected ports in device-list order
  std::string why_none;              // when `ports` is empty: what was found and why none is usable
  std::vector<std::string> skipped;  // "mlx5_1:1 is DOWN", for the log
};

// Opens every device, queries its ports and picks the active ones the filter selects; GIDs of
// RoCE ports come from sysfs (`sysfs_root`) when readable, else entry `gid_index` (or 0) of
// ibv_query_gid. `gid_index` >= 0 forces that index (RAILSHARD_IB_GID_INDEX).
HcaScan scanHcas(const VerbsApi& api, const std::string& filter, int gid_index,
                 const std::string& sysfs_root = "/sys");

}  // namespace railshard::transport::links::ibverbs
