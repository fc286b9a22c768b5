#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace railshard::launcher::discovery {

// One PCI function as sysfs shows it.
struct PciDevice {
  std::string bus_id;       // "0000:17:00.0"
  uint32_t class_code = 0;  // 24 bits: 0x030200 = 3D controller
  uint32_t vendor = 0;      // 0x10de NVIDIA, 0x1002 AMD, 0x15b3 Mellanox
  uint32_t device = 0;
  int numa_node = -1;                // -1 = the firmware did not say
  double link_gbps = 0;              // usable PCIe bandwidth per direction; 0 = unknown
  int link_width = 0;                // lanes; 0 = unknown
  uint64_t memory_bytes = 0;         // GPU memory when sysfs tells it (amdgpu); 0 = unknown
  std::vector<std::string> bridges;  // PCI ancestors, root port first

  bool isGpu() const;
};

// A PCIe switch: its upstream port and the switch it hangs below (nested switches).
struct PciSwitch {
  std::string upstream;  // bus id of the upstream port; names the switch
  std::string parent;    // upstream port of the switch above; "" when below a root port
  int numa_node = -1;
};

// Gbit/s per direction of a PCIe link: GT/s x lanes x line-code efficiency (8b/10b up to
// 5 GT/s, 128b/130b for 8-32 GT/s, FLIT 242/256 from 64 GT/s). 0 when either is unknown.
double pcieGbps(double gt_per_s, int lanes);
// "16.0 GT/s PCIe" -> 16; 0 when unknown.
double parseLinkSpeed(const std::string& text);

// The PCI devices under <root>/bus/pci/devices, with the bridge chain of each taken from the
// directory nesting of <root>/devices/pci*/ that the bus links resolve to. One code path for the
// real /sys and for a fake tree, so tests cover it.
class PciTree {
 public:
  static PciTree scan(const std::string& sysfs_root);

  // nullptr when the bus id is not a PCI device here.
  const PciDevice* find(const std::string& bus_id) const;
  // GPUs (display/3D class, NVIDIA or AMD) in bus-id order: the order CUDA uses with
  // CUDA_DEVICE_ORDER=PCI_BUS_ID, and NVML uses.
  std::vector<const PciDevice*> gpus() const;
  // Upstream port of the switch directly above `bus_id`; "" when it hangs off a root port.
  std::string switchAbove(const std::string& bus_id) const;
  // Every switch above any of `bus_ids` (and the switches above those), in bus-id order.
  std::vector<PciSwitch> switchesAbove(const std::vector<std::string>& bus_ids) const;

  // Adds a device directly (tests; devices the bus listing lacks).
  void add(PciDevice device);

 private:
  // Index in `bridges` of the upstream port of the nearest switch above; -1 for none.
  static int switchIndex(const std::vector<std::string>& bridges, size_t end);

  std::map<std::string, PciDevice> devices_;
};

// Reads one PCI device from its sysfs directory (symlinks resolved); bus_id empty when the
// path is not a PCI device.
PciDevice readPciDevice(const std::string& resolved_dir);

}  // namespace railshard::launcher::discovery
