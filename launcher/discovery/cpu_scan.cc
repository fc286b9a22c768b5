#include "launcher/discovery/cpu_scan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>

#include "base/logging.h"
#include "launcher/discovery/sysfs_files.h"

#if defined(RAILSHARD_HAVE_HWLOC)
#include <hwloc.h>
#endif

namespace railshard::launcher::discovery {
namespace {

// The key that groups hardware threads into cores. core_cpus_list (Linux >= 5.x) and its older
// name thread_siblings_list list a core's threads; hwloc groups PUs the same way, so both
// sources agree on the core count. Without either, each CPU counts as its own core.
std::string coreKey(const std::string& cpu_dir, int cpu) {
  for (const char* file : {"core_cpus_list", "thread_siblings_list"}) {
    if (auto list = readLine(cpu_dir + "/cpu" + std::to_string(cpu) + "/topology/" + file)) {
      if (!list->empty()) return *list;
    }
  }
  return "cpu" + std::to_string(cpu);
}

int countCores(const std::string& cpu_dir, const std::set<int>& cpus) {
  std::set<std::string> keys;
  for (int cpu : cpus) keys.insert(coreKey(cpu_dir, cpu));
  return static_cast<int>(keys.size());
}

// "Node 0 MemTotal:       16384 kB" from node<N>/meminfo.
uint64_t nodeMemory(const std::string& node_dir) {
  const auto text = readText(node_dir + "/meminfo");
  if (!text) return 0;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("MemTotal:");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + 9));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return 0;
}

uint64_t sysconfMemory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * page_size : 0;
}

CpuInfo scanSysfs(const std::string& sysfs_root) {
  const std::string node_root = sysfs_root + "/devices/system/node";
  const std::string cpu_dir = sysfs_root + "/devices/system/cpu";
  CpuInfo info;
  info.source = "sysfs";

  std::set<int> all_cpus;
  for (const auto& entry : listDirectory(node_root)) {
    if (entry.rfind("node", 0) != 0 || entry.size() == 4) continue;
    int index = 0;
    try {
      size_t used = 0;
      index = std::stoi(entry.substr(4), &used);
      if (used != entry.size() - 4) continue;
    } catch (const std::exception&) {
      continue;
    }
    const std::string dir = node_root + "/" + entry;
    const std::set<int> cpus = parseCpuList(readLine(dir + "/cpulist").value_or(""));
    NumaNodeInfo node;
    node.index = index;
    node.cpus = formatCpuList(cpus);
    node.threads = static_cast<int>(cpus.size());
    node.cores = countCores(cpu_dir, cpus);
    node.memory_bytes = nodeMemory(dir);
    info.numa.push_back(node);
    all_cpus.insert(cpus.begin(), cpus.end());
  }
  std::sort(info.numa.begin(), info.numa.end(),
            [](const NumaNodeInfo& a, const NumaNodeInfo& b) { return a.index < b.index; });

  if (all_cpus.empty()) {
    // No NUMA information (kernel without CONFIG_NUMA, some containers): the online CPUs.
    all_cpus = parseCpuList(readLine(cpu_dir + "/online").value_or(""));
    if (all_cpus.empty()) {
      const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
      for (long cpu = 0; cpu < std::max(online, 1L); ++cpu) all_cpus.insert(static_cast<int>(cpu));
    }
  }
  info.threads = static_cast<int>(all_cpus.size());
  info.cores = countCores(cpu_dir, all_cpus);
  for (const auto& node : info.numa) info.memory_bytes += node.memory_bytes;
  if (info.memory_bytes == 0) info.memory_bytes = sysconfMemory();

  if (info.numa.empty()) {
    NumaNodeInfo node;
    node.index = 0;
    node.cpus = formatCpuList(all_cpus);
    node.threads = info.threads;
    node.cores = info.cores;
    node.memory_bytes = info.memory_bytes;
    info.numa.push_back(node);
  }
  return info;
}

#if defined(RAILSHARD_HAVE_HWLOC)

std::string cpuListOf(hwloc_const_bitmap_t set) {
  // hwloc's list format is sysfs's ("0-15,32-47").
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string result(text);
  std::free(text);
  return result;
}

std::optional<CpuInfo> scanHwloc() {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) return std::nullopt;
  // The whole machine, not just the CPUs this process may run on (a cgroup or taskset would
  // otherwise shrink the host), so that hwloc and sysfs describe the same thing.
  hwloc_topology_set_flags(topology, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  if (hwloc_topology_load(topology) != 0) {
    hwloc_topology_destroy(topology);
    return std::nullopt;
  }
  CpuInfo info;
  info.source = "hwloc";
  info.cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
  info.threads = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_PU);
  info.memory_bytes = hwloc_get_root_obj(topology)->total_memory;
  const std::string all_cpus = cpuListOf(hwloc_get_root_obj(topology)->cpuset);
  const int nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, i);
    NumaNodeInfo node;
    node.index = static_cast<int>(numa->os_index);
    node.cpus = cpuListOf(numa->cpuset);
    node.cores = hwloc_get_nbobjs_inside_cpuset_by_type(topology, numa->cpuset, HWLOC_OBJ_CORE);
    node.threads = hwloc_get_nbobjs_inside_cpuset_by_type(topology, numa->cpuset, HWLOC_OBJ_PU);
    node.memory_bytes = numa->attr->numanode.local_memory;
    info.numa.push_back(node);
  }
  hwloc_topology_destroy(topology);
  std::sort(info.numa.begin(), info.numa.end(),
            [](const NumaNodeInfo& a, const NumaNodeInfo& b) { return a.index < b.index; });
  if (info.threads <= 0) return std::nullopt;
  if (info.numa.empty()) {
    NumaNodeInfo node;
    node.cpus = all_cpus;
    node.cores = info.cores;
    node.threads = info.threads;
    node.memory_bytes = info.memory_bytes;
    info.numa.push_back(node);
  }
  return info;
}

#endif

}  // namespace

namespace {

CpuInfo scanAny(const std::string& sysfs_root, bool use_hwloc) {
#if defined(RAILSHARD_HAVE_HWLOC)
  if (use_hwloc && sysfs_root == "/sys") {
    if (auto info = scanHwloc()) return *info;
    RS_LOG_INFO("discovery: hwloc could not load the topology; using sysfs");
  } else if (use_hwloc) {
    RS_LOG_DEBUG("discovery: sysfs root is {}, not /sys; hwloc skipped, using sysfs", sysfs_root);
  }
#else
  if (use_hwloc) RS_LOG_INFO("discovery: built without hwloc; using sysfs for CPUs and NUMA");
#endif
  return scanSysfs(sysfs_root);
}

}  // namespace

CpuInfo scanCpus(const std::string& sysfs_root, bool use_hwloc) {
  CpuInfo info = scanAny(sysfs_root, use_hwloc);
  // Some VMs (this project's build machine among them: 24 GiB, node0 says 6.6) leave memory
  // that was added at run time out of every NUMA node's meminfo. The host's memory is what the
  // kernel has: take the larger of the two on the running machine.
  if (sysfs_root == "/sys") info.memory_bytes = std::max(info.memory_bytes, sysconfMemory());
  return info;
}

}  // namespace railshard::launcher::discovery
