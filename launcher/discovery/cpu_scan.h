#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace railshard::launcher::discovery {

struct NumaNodeInfo {
  int index = 0;              // OS index: node<N> in sysfs
  int cores = 0;              // physical cores
  int threads = 0;            // hardware threads (PUs)
  std::string cpus;           // "0-15,32-47"
  uint64_t memory_bytes = 0;  // 0 = unknown
};

struct CpuInfo {
  int cores = 0;
  int threads = 0;
  uint64_t memory_bytes = 0;
  std::vector<NumaNodeInfo> numa;  // by index; never empty
  std::string source;              // "hwloc" or "sysfs", for the log and tests
};

// CPUs, cores, NUMA nodes and memory of the machine described by `sysfs_root`. hwloc (when
// compiled in and `use_hwloc`) describes the running machine, so it is only asked when
// sysfs_root is the real "/sys"; otherwise, or when hwloc fails, the answer comes from
// <root>/devices/system/{node,cpu} with sysconf for what a tree lacks. A machine without NUMA
// information gets one node 0 holding every CPU.
CpuInfo scanCpus(const std::string& sysfs_root, bool use_hwloc);

}  // namespace railshard::launcher::discovery
