#include "launcher/rank_groups.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>

#include "base/error.h"
#include "base/logging.h"

namespace railshard::launcher {

namespace {

void makeDir(const std::string& dir, const std::string& controller) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw ConfigError("cannot make the " + controller + " control group " + dir + ": " +
                      std::strerror(errno) +
                      " (limits per rank need root, or a cgroup delegated to you)");
  }
}

}  // namespace

std::vector<double> coresForSpeeds(const std::vector<double>& speeds, int cpus) {
  if (speeds.empty()) throw InvalidArgument("--emulate-speeds: no speeds given");
  if (cpus < 1) throw InvalidArgument("--emulate-speeds: " + std::to_string(cpus) + " CPUs");
  for (const double speed : speeds) {
    if (!(speed > 0) || !std::isfinite(speed)) {
      throw InvalidArgument("--emulate-speeds: every speed must be > 0, got " +
                            std::to_string(speed));
    }
  }
  const double fastest = *std::max_element(speeds.begin(), speeds.end());
  const double total = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  const double unit = std::min(1.0 / fastest, 0.4 * cpus / total);
  std::vector<double> cores;
  for (const double speed : speeds) cores.push_back(speed * unit);
  return cores;
}

RankGroups::RankGroups(const std::string& controller, size_t ranks,
                       const std::function<void(const cgroup::Location&, size_t)>& configure) {
  const cgroup::Location mine = cgroup::locate(controller);
  if (!mine.found()) {
    throw ConfigError("no cgroup hierarchy with the " + controller +
                      " controller is mounted (cgroup v1 /sys/fs/cgroup/" + controller +
                      ", or v2 with " + controller + " enabled)");
  }
  parent_ = mine.dir + "/railshard-" + std::to_string(::getpid());
  makeDir(parent_, controller);
  try {
    if (mine.v2) {
      // v2 hands controllers to children explicitly.
      std::ofstream(parent_ + "/cgroup.subtree_control") << "+" << controller;
    }
    for (size_t r = 0; r < ranks; ++r) {
      cgroup::Location group{parent_ + "/rank" + std::to_string(r), mine.mount, mine.v2};
      makeDir(group.dir, controller);
      groups_.push_back(group);
      configure(group, r);
    }
  } catch (...) {
    for (auto it = groups_.rbegin(); it != groups_.rend(); ++it) ::rmdir(it->dir.c_str());
    ::rmdir(parent_.c_str());
    throw;
  }
}

RankGroups::~RankGroups() {
  for (auto it = groups_.rbegin(); it != groups_.rend(); ++it) {
    if (::rmdir(it->dir.c_str()) != 0) {
      // A rank's own child process may outlive it; the group stays until that one exits.
      RS_LOG_WARN("cannot remove the control group {}: {}", it->dir, std::strerror(errno));
    }
  }
  ::rmdir(parent_.c_str());
}

}  // namespace railshard::launcher
