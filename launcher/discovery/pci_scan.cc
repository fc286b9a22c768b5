#include "launcher/discovery/pci_scan.h"

#include <algorithm>
#include <filesystem>

#include "launcher/discovery/sysfs_files.h"

namespace railshard::launcher::discovery {

namespace {

constexpr uint32_t kVendorNvidia = 0x10de;
constexpr uint32_t kVendorAmd = 0x1002;

}  // namespace

bool PciDevice::isGpu() const {
  const uint32_t base_sub = class_code >> 8;  // 0x0300 VGA, 0x0302 3D controller
  return (base_sub == 0x0300 || base_sub == 0x0302) &&
         (vendor == kVendorNvidia || vendor == kVendorAmd);
}

double pcieGbps(double gt_per_s, int lanes) {
  if (gt_per_s <= 0 || lanes <= 0) return 0;
  double efficiency = 128.0 / 130.0;
  if (gt_per_s < 8) efficiency = 8.0 / 10.0;
  if (gt_per_s >= 64) efficiency = 242.0 / 256.0;
  return gt_per_s * lanes * efficiency;
}

double parseLinkSpeed(const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    return used > 0 && value > 0 ? value : 0;
  } catch (const std::exception&) {
    return 0;  // "Unknown", "Unknown speed"
  }
}

PciDevice readPciDevice(const std::string& resolved_dir) {
  PciDevice device;
  std::vector<std::string> pci_parts;
  for (const auto& part : std::filesystem::path(resolved_dir)) {
    if (looksLikePciAddress(part.string())) pci_parts.push_back(part.string());
  }
  const std::string own = std::filesystem::path(resolved_dir).filename().string();
  if (pci_parts.empty() || pci_parts.back() != own) return device;
  device.bus_id = own;
  device.bridges.assign(pci_parts.begin(), pci_parts.end() - 1);
  device.class_code = static_cast<uint32_t>(readInteger(resolved_dir + "/class").value_or(0));
  device.vendor = static_cast<uint32_t>(readInteger(resolved_dir + "/vendor").value_or(0));
  device.device = static_cast<uint32_t>(readInteger(resolved_dir + "/device").value_or(0));
  device.numa_node = static_cast<int>(readInteger(resolved_dir + "/numa_node").value_or(-1));
  device.memory_bytes =
      static_cast<uint64_t>(readInteger(resolved_dir + "/mem_info_vram_total").value_or(0));

  double speed = parseLinkSpeed(readLine(resolved_dir + "/current_link_speed").value_or(""));
  const int width = static_cast<int>(readInteger(resolved_dir + "/current_link_width").value_or(0));
  // GPUs train their link down to 2.5 GT/s while idle, so the current speed of an idle GPU
  // says nothing about what a transfer gets. When the device can go faster, take the speed
  // both it and the port above it support.
  const double max_speed = parseLinkSpeed(readLine(resolved_dir + "/max_link_speed").value_or(""));
  if (max_speed > speed) {
    double port_max = 0;
    if (!device.bridges.empty()) {
      const std::string parent = std::filesystem::path(resolved_dir).parent_path().string();
      port_max = parseLinkSpeed(readLine(parent + "/max_link_speed").value_or(""));
    }
    speed = port_max > 0 ? std::min(max_speed, port_max) : max_speed;
  }
  device.link_width = width;
  device.link_gbps = pcieGbps(speed, width);
  return device;
}

PciTree PciTree::scan(const std::string& sysfs_root) {
  PciTree tree;
  const std::string bus = sysfs_root + "/bus/pci/devices";
  for (const auto& entry : listDirectory(bus)) {
    const std::string resolved = resolvePath(bus + "/" + entry);
    if (resolved.empty()) continue;
    PciDevice device = readPciDevice(resolved);
    if (!device.bus_id.empty()) tree.add(std::move(device));
  }
  return tree;
}

void PciTree::add(PciDevice device) {
  const std::string id = device.bus_id;
  devices_[id] = std::move(device);
}

const PciDevice* PciTree::find(const std::string& bus_id) const {
  const auto it = devices_.find(bus_id);
  return it == devices_.end() ? nullptr : &it->second;
}

std::vector<const PciDevice*> PciTree::gpus() const {
  std::vector<const PciDevice*> result;
  // std::map keeps bus-id order; fixed-width lowercase hex sorts like the numbers.
  for (const auto& [id, device] : devices_) {
    if (device.isGpu()) result.push_back(&device);
  }
  return result;
}

// In a chain of bridges from the root port down, position 0 is the root port, and below it
// every switch contributes two levels: its upstream port, then one of its downstream ports. So
// odd positions are upstream ports and even positions (>= 2) downstream ports; the nearest
// switch above something below bridges[end - 1] is the one whose downstream port is the
// deepest even position. A lone PCI-to-PCI bridge under a root port (odd position, nothing
// below it but endpoints, as virtual machines have) is therefore not taken for a switch.
int PciTree::switchIndex(const std::vector<std::string>& bridges, size_t end) {
  for (size_t i = std::min(end, bridges.size()); i-- > 0;) {
    if (i >= 2 && i % 2 == 0) return static_cast<int>(i) - 1;
  }
  return -1;
}

std::string PciTree::switchAbove(const std::string& bus_id) const {
  const PciDevice* device = find(bus_id);
  if (device == nullptr) return "";
  const int index = switchIndex(device->bridges, device->bridges.size());
  return index < 0 ? "" : device->bridges[static_cast<size_t>(index)];
}

std::vector<PciSwitch> PciTree::switchesAbove(const std::vector<std::string>& bus_ids) const {
  std::map<std::string, PciSwitch> switches;
  for (const auto& bus_id : bus_ids) {
    const PciDevice* device = find(bus_id);
    if (device == nullptr) continue;
    const auto& chain = device->bridges;
    int index = switchIndex(chain, chain.size());
    while (index >= 0) {
      const int parent_index = switchIndex(chain, static_cast<size_t>(index));
      PciSwitch& sw = switches[chain[static_cast<size_t>(index)]];
      sw.upstream = chain[static_cast<size_t>(index)];
      sw.parent = parent_index < 0 ? "" : chain[static_cast<size_t>(parent_index)];
      if (sw.numa_node < 0) {
        const PciDevice* port = find(sw.upstream);
        sw.numa_node =
            port != nullptr && port->numa_node >= 0 ? port->numa_node : device->numa_node;
      }
      index = parent_index;
    }
  }
  std::vector<PciSwitch> result;
  for (auto& [id, sw] : switches) result.push_back(std::move(sw));
  return result;
}

}  // namespace railshard::launcher::discovery
