#include "plugins/nccl/net_devices.h"

#include <cstdlib>
#include <sstream>

#include "base/error.h"
#include "launcher/discovery/sysfs_files.h"
#include "launcher/interfaces.h"

namespace railshard::plugins::nccl {
namespace {

namespace discovery = launcher::discovery;

uint64_t guidOfMac(const std::string& mac) {
  // "52:54:00:12:34:56" -> its 48 bits; NICs that share one (ports of one card) are one to NCCL.
  uint64_t guid = 0;
  std::istringstream in(mac);
  std::string byte;
  while (std::getline(in, byte, ':')) {
    guid = (guid << 8) | (std::strtoull(byte.c_str(), nullptr, 16) & 0xff);
  }
  return guid;
}

}  // namespace

std::vector<Rail> findRails(const DeviceOptions& options) {
  std::vector<Rail> rails;
  for (const auto& address : launcher::listInterfaceAddresses()) {
    // Loopback only when the spec names it (tests, and one host trying the plugin out).
    if (address.ipv6 || !address.up || (address.loopback && options.interfaces.empty())) continue;
    if (!launcher::interfaceMatches(address.name, options.interfaces)) continue;
    bool seen = false;
    for (const auto& rail : rails) seen = seen || rail.name == address.name;
    if (seen) continue;  // its first IPv4 address only
    Rail rail;
    rail.name = address.name;
    rail.address = address.address;
    rail.prefix_length = address.prefix_length;
    const std::string dir = options.sysfs_root + "/class/net/" + address.name;
    // sysfs speed is in Mbit/s; -1 or unreadable (a virtual interface) is unknown.
    if (auto mbps = discovery::readInteger(dir + "/speed"); mbps && *mbps > 0) {
      rail.gbps = static_cast<double>(*mbps) / 1000.0;
    }
    if (discovery::pathExists(dir + "/device")) {
      rail.pci_path = discovery::resolvePath(dir + "/device");
    }
    if (auto mac = discovery::readLine(dir + "/address")) rail.guid = guidOfMac(*mac);
    rails.push_back(std::move(rail));
  }
  for (size_t i = 0; i < rails.size() && i < options.gbps.size(); ++i) {
    if (options.gbps[i] > 0) rails[i].gbps = options.gbps[i];
  }
  return rails;
}

std::vector<NetDevice> makeDevices(const std::vector<Rail>& rails, DeviceSet set) {
  std::vector<NetDevice> devices;
  std::vector<int> tcp;
  for (size_t i = 0; i < rails.size(); ++i) {
    if (!rails[i].rdma) tcp.push_back(static_cast<int>(i));
  }
  if (tcp.empty()) return devices;  // nothing to carry an RDMA rail's records
  const bool alone = rails.size() == 1;
  if (set != DeviceSet::kFused || alone) {
    for (size_t i = 0; i < rails.size(); ++i) {
      NetDevice device{"railshard-" + rails[i].name, {static_cast<int>(i)}, false, true};
      if (rails[i].rdma) {
        device.rails.insert(device.rails.end(), tcp.begin(), tcp.end());
        device.tcp_data = false;
      }
      devices.push_back(std::move(device));
    }
  }
  if (set != DeviceSet::kRails && !alone) {
    NetDevice fused;
    fused.fused = true;
    fused.name = "railshard-fused(";
    for (size_t i = 0; i < rails.size(); ++i) {
      fused.rails.push_back(static_cast<int>(i));
      fused.name += (i > 0 ? "+" : "") + rails[i].name;
    }
    fused.name += ")";
    devices.push_back(std::move(fused));
  }
  return devices;
}

std::string rdmaLayers(const std::vector<Rail>& rails) {
  std::string layers;
  for (const Rail& rail : rails) {
    if (rail.rdma) layers += rail.layer;
  }
  return layers;
}

DeviceOptions deviceOptionsFromEnvironment() {
  DeviceOptions options;
  if (const char* rails = std::getenv("RAILSHARD_NCCL_RAILS")) options.interfaces = rails;
  if (const char* set = std::getenv("RAILSHARD_NCCL_DEVICES")) {
    const std::string value = set;
    if (value == "fused") {
      options.set = DeviceSet::kFused;
    } else if (value == "rails") {
      options.set = DeviceSet::kRails;
    } else if (value == "all") {
      options.set = DeviceSet::kAll;
    } else {
      throw ConfigError("RAILSHARD_NCCL_DEVICES='" + value + "': expected fused, rails or all");
    }
  }
  if (const char* rdma = std::getenv("RAILSHARD_NCCL_RDMA")) {
    const std::string value = rdma;
    if (value != "0" && value != "1") {
      throw ConfigError("RAILSHARD_NCCL_RDMA='" + value + "': expected 1 (offer HCA ports) or 0");
    }
    options.rdma = value == "1";
  }
  if (const char* gbps = std::getenv("RAILSHARD_NCCL_RAIL_GBPS")) {
    std::istringstream in(gbps);
    std::string item;
    while (std::getline(in, item, ',')) {
      char* end = nullptr;
      const double value = std::strtod(item.c_str(), &end);
      if (item.empty() || end == nullptr || *end != '\0' || !(value > 0)) {
        throw ConfigError("RAILSHARD_NCCL_RAIL_GBPS='" + std::string(gbps) +
                          "': expected positive Gbit/s per rail, comma-separated (\"1,0.25\")");
      }
      options.gbps.push_back(value);
    }
  }
  return options;
}

}  // namespace railshard::plugins::nccl
