#include "transport/shm/machine_load.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace railshard::transport::shm {
namespace {

const std::string kCgroupRoot = "/sys/fs/cgroup";

// Quota over period of one cgroup directory in cores; 0 when unlimited or unreadable.
double quotaOf(const std::string& dir, bool v2) {
  if (v2) {
    std::ifstream in(dir + "/cpu.max");
    std::string quota;
    double period = 0;
    if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
    return std::stod(quota) / period;
  }
  std::ifstream quota_in(dir + "/cpu.cfs_quota_us");
  std::ifstream period_in(dir + "/cpu.cfs_period_us");
  double quota = -1;
  double period = 0;
  if (!(quota_in >> quota) || !(period_in >> period) || quota <= 0 || period <= 0) return 0;
  return quota / period;
}

// The smallest quota from `path` up to the hierarchy's root (a parent's quota binds too).
double smallestQuota(const std::string& mount, std::string path, bool v2) {
  double smallest = 0;
  while (true) {
    const double quota = quotaOf(mount + (path == "/" ? "" : path), v2);
    if (quota > 0 && (smallest == 0 || quota < smallest)) smallest = quota;
    if (path.empty() || path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return smallest;
}

}  // namespace

unsigned runnableThreads() {
  // "0.52 0.58 0.59 3/412 12345": runnable/total scheduling entities.
  FILE* file = std::fopen("/proc/loadavg", "r");
  if (file == nullptr) return 0;
  double loads[3];
  unsigned runnable = 0;
  unsigned total = 0;
  const int read =
      std::fscanf(file, "%lf %lf %lf %u/%u", &loads[0], &loads[1], &loads[2], &runnable, &total);
  std::fclose(file);
  return read == 5 ? runnable : 0;
}

unsigned allowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

double cpuQuotaCores() {
  // "4:cpu,cpuacct:/jobs/rank0" (v1) or "0::/jobs/rank0" (v2), one line per hierarchy.
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {
      if (const double quota = smallestQuota(kCgroupRoot, path, true); quota > 0) return quota;
      continue;
    }
    std::stringstream names(controllers);
    std::string name;
    bool cpu = false;
    while (std::getline(names, name, ',')) cpu = cpu || name == "cpu";
    if (!cpu) continue;
    for (const std::string& mount :
         {kCgroupRoot + "/cpu", kCgroupRoot + "/" + controllers, kCgroupRoot + "/cpu,cpuacct"}) {
      if (const double quota = smallestQuota(mount, path, false); quota > 0) return quota;
    }
  }
  return 0;
}

}  // namespace railshard::transport::shm
