#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace railshard::launcher::discovery {

// What NVML says about one NVIDIA GPU.
struct NvmlGpu {
  std::string bus_id;  // "0000:17:00.0", as sysfs spells it
  std::string name;    // "NVIDIA H100 80GB HBM3"
  uint64_t memory_bytes = 0;
  double nvlink_gbps = 0;              // per link and direction; 0 = NVML did not say
  std::map<std::string, int> nvlinks;  // remote PCI bus id -> active NVLinks to it
};

// An NVLink connection between two GPUs, direct or through NVSwitches.
struct NvLinkPair {
  std::string a;  // bus ids, a < b
  std::string b;
  int lanes = 0;             // NVLinks that carry traffic between the two
  double gbps_per_lane = 0;  // per direction
};

// When NVML does not report link speed: 25 GB/s per direction per link (NVLink 2-4: V100,
// A100, H100), i.e. 200 Gbit/s. An assumption, and the reason the link probe exists.
constexpr double kAssumedNvLinkGbps = 200;

// NVIDIA GPUs from NVML, loaded with dlopen("libnvidia-ml.so.1") so the library needs no GPU
// driver to link or start. Empty (with an info log line) when built without nvml.h, when the
// library is absent (no driver), or when nvmlInit fails.
std::vector<NvmlGpu> scanNvml();

// "00000000:17:00.0" (NVML's 8-digit domain) or "0000:17:00.0" -> "0000:17:00.0", lowercase;
// "" when it is not a bus id.
std::string normalizePciBusId(const std::string& text);

// GPU pairs joined by NVLink. A remote end that is one of the GPUs is a direct link; a remote
// end that is not a GPU but is reached by two or more of them is an NVSwitch, through which
// every pair of its GPUs gets min(links of a, links of b) lanes.
std::vector<NvLinkPair> nvlinkPairs(const std::vector<NvmlGpu>& gpus);

}  // namespace railshard::launcher::discovery
