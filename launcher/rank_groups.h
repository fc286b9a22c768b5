#pragma once

// railshard-launch --emulate-speeds and --emulate-memory: real heterogeneity on one machine.
// Each rank runs in control groups of its own: a CPU quota lets it compute at its speed -- a
// rank of speed 2 gets twice the CPU time of a rank of speed 1, all its threads together -- and
// a memory limit gives it the memory of a smaller server, which the kernel enforces.
#include <functional>
#include <string>
#include <vector>

#include "launcher/cgroup.h"

namespace railshard::launcher {

// The cores each rank gets: speed x unit, the unit as large as allows both the fastest rank at
// most one core and all of them together at most 40 % of `cpus`: the rest is for the
// launcher, the collectives' threads, the system and whatever else runs there, so that the
// ranks keep their speed ratios when another job takes a core (if the quotas filled the
// machine, the fast rank would lose most to it). InvalidArgument for an empty list, a speed
// that is not > 0, or cpus < 1.
std::vector<double> coresForSpeeds(const std::vector<double>& speeds, int cpus);

class RankGroups {
 public:
  // Makes <this process's `controller` group>/railshard-<pid>/rank<r> for `ranks` ranks and
  // calls `configure` on each. ConfigError naming the path and why when the controller is
  // missing or not writable (it needs root, or a delegated group).
  RankGroups(const std::string& controller, size_t ranks,
             const std::function<void(const cgroup::Location&, size_t rank)>& configure);
  ~RankGroups();  // removes the groups (their processes have exited by then)
  RankGroups(const RankGroups&) = delete;
  RankGroups& operator=(const RankGroups&) = delete;

  // The cgroup.procs a rank's process writes its pid to (ChildSpec::cgroup_procs).
  std::string procsFile(size_t rank) const { return groups_[rank].dir + "/cgroup.procs"; }
  const std::string& parentDir() const { return parent_; }

  // CPU quotas are set per 10 ms period: short, so a slow rank is held back evenly rather
  // than in long stalls.
  static constexpr int kPeriodUs = 10000;

 private:
  std::string parent_;
  std::vector<cgroup::Location> groups_;
};

}  // namespace railshard::launcher
