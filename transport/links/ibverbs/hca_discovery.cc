#include "transport/links/ibverbs/hca_discovery.h"

#include <cerrno>
#include <cstring>
#include <sstream>

namespace railshard::transport::links::ibverbs {

double portGbps(uint8_t active_width, uint32_t active_speed) {
  double lanes = 0;
  switch (active_width) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      return 0;
  }
  double lane_gbps = 0;  // data rate per lane after encoding
  switch (active_speed) {
    case 1:
      lane_gbps = 2.0;
      break;  // SDR 2.5 Gbaud, 8b/10b
    case 2:
      lane_gbps = 4.0;
      break;  // DDR
    case 4:
      lane_gbps = 8.0;
      break;  // QDR
    case 8:
      lane_gbps = 10.0;
      break;  // FDR10
    case 16:
      lane_gbps = 13.64;
      break;  // FDR 14.0625 Gbaud, 64b/66b
    case 32:
      lane_gbps = 25.0;
      break;  // EDR
    case 64:
      lane_gbps = 50.0;
      break;  // HDR
    case 128:
      lane_gbps = 100.0;
      break;  // NDR
    case 256:
      lane_gbps = 200.0;
      break;  // XDR
    default:
      return 0;
  }
  return lanes * lane_gbps;
}

std::string linkLayerName(uint8_t link_layer) {
  switch (link_layer) {
    case IBV_LINK_LAYER_INFINIBAND:
      return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET:
      return "Ethernet";
    default:
      return "unspecified";
  }
}

bool isSoftwareDevice(uint32_t vendor_id) {
  return vendor_id == 0xffffffu || vendor_id == 0x626d74u;
}

bool hcaSelected(const std::string& filter, const std::string& device, int port) {
  if (filter.empty()) return true;
  std::stringstream in(filter);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto colon = item.find(':');
    const std::string name = item.substr(0, colon);
    if (name != device) continue;
    if (colon == std::string::npos) return true;
    try {
      if (std::stoi(item.substr(colon + 1)) == port) return true;
    } catch (...) {
    }
  }
  return false;
}

HcaScan scanHcas(const VerbsApi& api, const std::string& filter, int gid_index,
                 const std::string& sysfs_root) {
  HcaScan scan;
  errno = 0;
  int count = 0;
  ibv_device** list = api.get_device_list(&count);
  if (list == nullptr) {
    const int err = errno;
    scan.why_none = std::string("ibv_get_device_list failed: ") + std::strerror(err) +
                    (err == ENOSYS ? " (the kernel has no RDMA support loaded)" : "");
    return scan;
  }
  if (count == 0) {
    scan.why_none =
        "no RDMA device found (ibv_devices lists none: no HCA, or its driver and rdma-core "
        "provider are not loaded)";
    api.free_device_list(list);
    return scan;
  }
  for (int i = 0; i < count; ++i) {
    const std::string name = api.get_device_name(list[i]);
    ibv_context* context = api.open_device(list[i]);
    if (context == nullptr) {
      scan.skipped.push_back(name + ": cannot open (" + std::strerror(errno) + ")");
      continue;
    }
    ibv_device_attr device_attr{};
    if (api.query_device(context, &device_attr) != 0) {
      scan.skipped.push_back(name + ": ibv_query_device failed");
      api.close_device(context);
      continue;
    }
    for (int p = 1; p <= device_attr.phys_port_cnt; ++p) {
      const std::string where = name + ":" + std::to_string(p);
      if (!hcaSelected(filter, name, p)) {
        scan.skipped.push_back(where + ": not in RAILSHARD_IB_HCA");
        continue;
      }
      ibv_port_attr attr{};
      if (api.query_port(context, static_cast<uint8_t>(p), &attr) != 0) {
        scan.skipped.push_back(where + ": ibv_query_port failed");
        continue;
      }
      if (attr.state != IBV_PORT_ACTIVE) {
        scan.skipped.push_back(where + ": port state " + std::to_string(attr.state) +
                               " is not ACTIVE");
        continue;
      }
      HcaPort port;
      port.device = name;
      port.port = p;
      port.infiniband = attr.link_layer != IBV_LINK_LAYER_ETHERNET;
      port.active_mtu = attr.active_mtu;
      port.lid = attr.lid;
      port.gbps = portGbps(attr.active_width, attr.active_speed);
      int index = gid_index;
      if (index < 0) {
        const auto table = readGidTable(sysfs_root, name, p);
        if (!table.empty()) {
          // Address family of the rail: IPv4 unless the port has only IPv6 addresses.
          GidChoice choice = selectGid(table, port.infiniband, AddressFamily::kIpv4);
          if (choice.index < 0 && !port.infiniband) {
            choice = selectGid(table, false, AddressFamily::kIpv6);
          }
          if (choice.index < 0) {
            scan.skipped.push_back(where + ": " + choice.reason);
            continue;
          }
          index = choice.index;
          port.gid_reason = choice.reason;
        } else {
          index = 0;
          port.gid_reason = "GID index 0 (no GID table in sysfs)";
        }
      } else {
        port.gid_reason = "GID index " + std::to_string(index) + " (RAILSHARD_IB_GID_INDEX)";
      }
      ibv_gid gid{};
      if (api.query_gid(context, static_cast<uint8_t>(p), index, &gid) != 0) {
        scan.skipped.push_back(where + ": cannot read GID " + std::to_string(index));
        continue;
      }
      port.gid_index = index;
      std::memcpy(port.gid.data(), gid.raw, port.gid.size());
      scan.ports.push_back(port);
    }
    api.close_device(context);
  }
  api.free_device_list(list);
  if (scan.ports.empty()) {
    std::string found;
    for (const auto& s : scan.skipped) found += (found.empty() ? "" : "; ") + s;
    scan.why_none = "no usable RDMA port: " + found;
  }
  return scan;
}

}  // namespace railshard::transport::links::ibverbs
