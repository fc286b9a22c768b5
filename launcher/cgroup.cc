#include "launcher/cgroup.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "base/logging.h"

namespace railshard::launcher::cgroup {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

bool readWord(const std::string& path, std::string& word) {
  std::ifstream in(path);
  return static_cast<bool>(in >> word);
}

// The group's directory and each parent up to the mount point, innermost first.
std::vector<std::string> upToMount(const Location& location) {
  std::vector<std::string> dirs;
  std::string dir = location.dir;
  while (true) {
    dirs.push_back(dir);
    if (dir.size() <= location.mount.size()) break;
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash < location.mount.size()) break;
    dir = dir.substr(0, slash);
  }
  return dirs;
}

void writeFile(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.flush();
  if (!out) {
    throw ConfigError("cannot write '" + value + "' to " + path + ": " + std::strerror(errno));
  }
}

}  // namespace

Location locate(const std::string& controller, const std::string& proc) {
  // This process's path in each hierarchy: "<id>:<controllers>:<path>" (v2: "0::<path>").
  std::string v1_path;
  std::string v2_path;
  bool have_v2 = false;
  {
    std::ifstream in(proc + "/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      const auto parts = split(line, ':');
      if (parts.size() < 3) continue;
      const std::string path = line.substr(parts[0].size() + parts[1].size() + 2);
      if (parts[0] == "0" && parts[1].empty()) {
        v2_path = path;
        have_v2 = true;
        continue;
      }
      for (const auto& name : split(parts[1], ',')) {
        if (name == controller) v1_path = path;
      }
    }
  }
  // Mount points: "<id> <parent> <dev> <root> <mount point> <options> [optional...] - <fs type>
  // <source> <super options>".
  std::ifstream in(proc + "/self/mountinfo");
  std::string line;
  Location v2;
  while (std::getline(in, line)) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    const auto head = split(line.substr(0, dash), ' ');
    const auto tail = split(line.substr(dash + 3), ' ');
    if (head.size() < 5 || tail.size() < 3) continue;
    const std::string& root = head[3];
    const std::string& mount = head[4];
    // The group's path relative to this mount's root (a container sees its own group as /).
    const auto inside = [&](const std::string& path) {
      if (root == "/") return mount + (path == "/" ? "" : path);
      if (path.rfind(root, 0) != 0) return std::string();
      return mount + path.substr(root.size());
    };
    if (tail[0] == "cgroup" && !v1_path.empty()) {
      for (const auto& option : split(tail[2], ',')) {
        if (option == controller) {
          Location found{inside(v1_path), mount, false};
          if (found.found()) return found;
        }
      }
    } else if (tail[0] == "cgroup2" && have_v2 && !v2.found()) {
      v2 = Location{inside(v2_path), mount, true};
    }
  }
  if (v2.found()) {
    // A v2 group has the controller when its parent enabled it for its children (or it is the
    // root, whose cgroup.controllers lists what the kernel offers).
    std::ifstream controllers(v2.dir + "/cgroup.controllers");
    std::string name;
    while (controllers >> name) {
      if (name == controller) return v2;
    }
  }
  return Location{};
}

double cpuQuotaCores(const Location& location) {
  if (!location.found()) return -1;
  double cores = 0;
  bool read_any = false;
  for (const auto& dir : upToMount(location)) {
    double quota = 0;
    double period = 0;
    if (location.v2) {
      std::ifstream in(dir + "/cpu.max");
      std::string max;
      if (!(in >> max >> period)) continue;
      read_any = true;
      if (max == "max") continue;
      quota = std::stod(max);
    } else {
      std::string q;
      std::string p;
      if (!readWord(dir + "/cpu.cfs_quota_us", q) || !readWord(dir + "/cpu.cfs_period_us", p)) {
        continue;
      }
      read_any = true;
      quota = std::stod(q);
      period = std::stod(p);
      if (quota < 0) continue;  // -1: no quota
    }
    if (period > 0 && quota > 0) {
      const double here = quota / period;
      cores = cores == 0 ? here : std::min(cores, here);
    }
  }
  return read_any ? cores : -1;
}

double throttledSeconds(const Location& location) {
  if (!location.found()) return -1;
  std::ifstream in(location.dir + "/cpu.stat");
  std::string key;
  double value = 0;
  while (in >> key >> value) {
    if (!location.v2 && key == "throttled_time") return value / 1e9;  // ns
    if (location.v2 && key == "throttled_usec") return value / 1e6;
  }
  return -1;
}

double memoryLimitBytes(const Location& location) {
  if (!location.found()) return -1;
  double limit = 0;
  bool read_any = false;
  for (const auto& dir : upToMount(location)) {
    std::string word;
    if (!readWord(dir + (location.v2 ? "/memory.max" : "/memory.limit_in_bytes"), word)) {
      continue;
    }
    read_any = true;
    if (word == "max") continue;
    const double bytes = std::stod(word);
    // v1 says "unlimited" with the largest page-aligned 64-bit value.
    if (bytes >= 0x7ffffffffffff000ULL / 2) continue;
    limit = limit == 0 ? bytes : std::min(limit, bytes);
  }
  return read_any ? limit : -1;
}

void setCpuQuota(const Location& location, double cores, int period_us) {
  if (!(cores > 0) || !std::isfinite(cores) || period_us <= 0) {
    throw InvalidArgument("cgroup: a CPU quota must be > 0 cores with a positive period, got " +
                          std::to_string(cores) + " cores, " + std::to_string(period_us) + " us");
  }
  // At least 1 ms a period: the kernel refuses less.
  const long quota = std::max(1000L, std::lround(cores * period_us));
  if (location.v2) {
    writeFile(location.dir + "/cpu.max", std::to_string(quota) + " " + std::to_string(period_us));
    return;
  }
  // The period first would be refused when the old quota exceeds what a child may have; the
  // quota first can be refused for the same reason with the old period: reset, then set.
  writeFile(location.dir + "/cpu.cfs_quota_us", "-1");
  writeFile(location.dir + "/cpu.cfs_period_us", std::to_string(period_us));
  writeFile(location.dir + "/cpu.cfs_quota_us", std::to_string(quota));
}

void setMemoryLimit(const Location& location, double bytes) {
  if (!(bytes > 0) || !std::isfinite(bytes)) {
    throw InvalidArgument("cgroup: a memory limit must be > 0 bytes, got " + std::to_string(bytes));
  }
  const auto value = std::to_string(static_cast<long long>(bytes));
  writeFile(location.dir + (location.v2 ? "/memory.max" : "/memory.limit_in_bytes"), value);
}

void fitWaitsToQuota(Config& config, bool spin_set) {
  if (spin_set || config.wait.spin.count() == 0) return;
  const double cores = cpuQuotaCores(locate("cpu"));
  if (cores > 0 && cores < 1) {
    RS_LOG_DEBUG("CPU quota of {:.3f} cores: waits sleep at once instead of spinning for {} us",
                 cores, config.wait.spin.count());
    config.wait.spin = std::chrono::microseconds(0);
  }
}

}  // namespace railshard::launcher::cgroup
