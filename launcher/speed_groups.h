#pragma once

// railshard-launch --emulate-speeds: real heterogeneity on one machine. Each rank runs in a
// control group of its own whose CPU quota lets it compute at its speed -- a rank of speed 2
// gets twice the CPU time of a rank of speed 1, all its threads together -- so ranks really
// compute at different rates (no sleeps), as unequal or unequally loaded servers do.
#include <string>
#include <vector>

#include "launcher/cgroup.h"

namespace railshard::launcher {

// The cores each rank gets: speed x unit, the unit as large as allows both the fastest rank at
// most one core and all of them together at most 40 % of `cpus`: the rest is for the
// launcher, the collectives' threads, the system and whatever else runs there, so that the
// ranks keep their speed ratios when another job takes a core (if the quotas filled the
// machine, the fast rank would lose most to it). InvalidArgument for an empty
// list, a speed that is not > 0, or cpus < 1.
std::vector<double> coresForSpeeds(const std::vector<double>& speeds, int cpus);

class SpeedGroups {
 public:
  // Makes <this process's cpu group>/railshard-<pid>/rank<r> with a quota of cores[r] per
  // 10 ms period (short, so a slow rank is held back evenly rather than in long stalls).
  // ConfigError naming the path and why when the cpu controller is missing or not writable
  // (it needs root, or a delegated group).
  explicit SpeedGroups(const std::vector<double>& cores);
  ~SpeedGroups();  // removes the groups (their processes have exited by then)
  SpeedGroups(const SpeedGroups&) = delete;
  SpeedGroups& operator=(const SpeedGroups&) = delete;

  // The cgroup.procs a rank's process writes its pid to (ChildSpec::cgroup_procs).
  std::string procsFile(size_t rank) const { return groups_[rank].dir + "/cgroup.procs"; }
  double cores(size_t rank) const { return cores_[rank]; }
  const std::string& parentDir() const { return parent_; }

  static constexpr int kPeriodUs = 10000;

 private:
  std::string parent_;
  std::vector<cgroup::Location> groups_;
  std::vector<double> cores_;
};

}  // namespace railshard::launcher
