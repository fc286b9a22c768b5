#include "launcher/discovery/sysfs_net.h"

#include <algorithm>
#include <map>

#include "base/logging.h"
#include "launcher/discovery/sysfs_files.h"

namespace railshard::launcher::discovery {

using topology::LinkLayer;

namespace {

constexpr int kArphrdEther = 1;
constexpr int kArphrdInfiniband = 32;
constexpr int kArphrdLoopback = 772;

LinkLayer linkLayerOfType(int type) {
  switch (type) {
    case kArphrdEther:
      return LinkLayer::kEthernet;
    case kArphrdInfiniband:
      return LinkLayer::kInfiniBand;
    case kArphrdLoopback:
      return LinkLayer::kLoopback;
    default:
      return LinkLayer::kUnknown;
  }
}

LinkLayer linkLayerOfName(const std::string& text) {
  if (text == "InfiniBand") return LinkLayer::kInfiniBand;
  if (text == "Ethernet") return LinkLayer::kEthernet;
  return LinkLayer::kUnknown;
}

NetInterface readInterface(const std::string& dir, const std::string& name) {
  NetInterface nic;
  nic.name = name;
  nic.type = static_cast<int>(readInteger(dir + "/type").value_or(0));
  nic.link_layer = linkLayerOfType(nic.type);
  // Mbit/s; -1 (or a read error) when the driver does not know, as for virtual links.
  const long long mbps = readInteger(dir + "/speed").value_or(-1);
  nic.speed_gbps = mbps > 0 ? static_cast<double>(mbps) / 1000.0 : 0;
  nic.mtu = static_cast<int>(readInteger(dir + "/mtu").value_or(0));
  nic.up = isOperationallyUp(readLine(dir + "/operstate").value_or(""),
                             static_cast<int>(readInteger(dir + "/carrier").value_or(0)));
  nic.is_bridge = isDirectory(dir + "/bridge");
  nic.has_master = pathExists(dir + "/master");
  const std::string device = resolvePath(dir + "/device");
  nic.has_device = !device.empty();
  if (nic.has_device) nic.pci = nearestPciAddress(device);
  return nic;
}

std::string gidPrefix(const std::string& gid) {
  // "fe80:0000:0000:0000:0c42:a103:0012:3456" -> the subnet prefix, its first 64 bits.
  size_t at = 0;
  for (int group = 0; group < 4; ++group) {
    at = gid.find(':', at);
    if (at == std::string::npos) return "";
    ++at;
  }
  return gid.substr(0, at - 1);
}

std::vector<RdmaPort> readRdma(const std::string& sysfs_root) {
  std::vector<RdmaPort> ports;
  const std::string root = sysfs_root + "/class/infiniband";
  if (!isDirectory(root)) {
    RS_LOG_INFO("discovery: no {} (no RDMA devices or no RDMA driver loaded)", root);
    return ports;
  }
  for (const auto& device : listDirectory(root)) {
    const std::string dir = root + "/" + device;
    const std::string pci = nearestPciAddress(resolvePath(dir + "/device"));
    // Netdevs of the same PCI function: the fallback mapping for IPoIB (whose GID table names
    // no netdev) and for drivers without gid_attrs.
    const std::vector<std::string> function_netdevs = listDirectory(dir + "/device/net");
    const std::vector<std::string> port_names = listDirectory(dir + "/ports");
    for (const auto& port_name : port_names) {
      RdmaPort port;
      port.device = device;
      try {
        port.port = std::stoi(port_name);
      } catch (const std::exception&) {
        continue;
      }
      const std::string port_dir = dir + "/ports/" + port_name;
      port.link_layer = linkLayerOfName(readLine(port_dir + "/link_layer").value_or(""));
      port.rate_gbps = parseRdmaRate(readLine(port_dir + "/rate").value_or(""));
      port.active = readLine(port_dir + "/state").value_or("").find("ACTIVE") != std::string::npos;
      port.gid_prefix = gidPrefix(readLine(port_dir + "/gids/0").value_or(""));
      port.pci = pci;
      port.netdev = readLine(port_dir + "/gid_attrs/ndevs/0").value_or("");
      if (port.netdev.empty() && !function_netdevs.empty()) {
        if (port_names.size() == 1) {
          port.netdev = function_netdevs.front();
        } else {
          // Several ports on one function (mlx4): dev_port counts from 0 for port 1.
          for (const auto& netdev : function_netdevs) {
            const auto dev_port = readInteger(dir + "/device/net/" + netdev + "/dev_port");
            if (dev_port && *dev_port + 1 == port.port) port.netdev = netdev;
          }
        }
      }
      ports.push_back(port);
    }
  }
  return ports;
}

}  // namespace

bool isOperationallyUp(const std::string& operstate, int carrier) {
  return operstate == "up" || (operstate == "unknown" && carrier == 1);
}

double parseRdmaRate(const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    return used > 0 && value > 0 ? value : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

NetScan scanNetwork(const std::string& sysfs_root) {
  NetScan scan;
  const std::string root = sysfs_root + "/class/net";
  for (const auto& name : listDirectory(root)) {
    const std::string dir = root + "/" + name;
    if (!isDirectory(dir)) continue;  // bonding_masters is a file in the same folder
    scan.interfaces.push_back(readInterface(dir, name));
  }
  scan.rdma_ports = readRdma(sysfs_root);
  for (const auto& port : scan.rdma_ports) {
    if (port.netdev.empty()) continue;
    for (auto& nic : scan.interfaces) {
      if (nic.name != port.netdev || !nic.rdma_device.empty()) continue;
      nic.rdma_device = port.device;
      nic.rdma_port = port.port;
      // The port's rate is the link's real signalling rate; IPoIB's speed file often lags.
      nic.speed_gbps = std::max(nic.speed_gbps, port.rate_gbps);
    }
  }
  return scan;
}

}  // namespace railshard::launcher::discovery
