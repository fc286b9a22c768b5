#include "launcher/rank_environment.h"

#include <algorithm>
#include <iterator>

namespace railshard::launcher {

namespace {

// Set by the launcher for each rank; an enclosing job's values are dropped, never mixed in.
constexpr const char* kLaunchVariables[] = {
    "RAILSHARD_RANK",           "RAILSHARD_WORLD_SIZE", "RAILSHARD_LOCAL_RANK",
    "RAILSHARD_STORE_ADDR",     "RAILSHARD_STORE_FD",   "RAILSHARD_TOKEN",
    "RAILSHARD_STORE_EXTERNAL", "RAILSHARD_JOIN",       "RAILSHARD_ELASTIC",
};

}  // namespace

std::vector<std::string> rankEnvironment(const std::vector<std::string>& base,
                                         const RankPlace& place, const std::string& store_addr,
                                         const std::string& token, int store_fd,
                                         bool store_external, bool elastic) {
  std::vector<std::string> env;
  env.reserve(base.size() + 7);
  for (const auto& entry : base) {
    const std::string name = entry.substr(0, entry.find('='));
    const bool launch_variable =
        std::any_of(std::begin(kLaunchVariables), std::end(kLaunchVariables),
                    [&](const char* variable) { return name == variable; });
    if (!launch_variable) env.push_back(entry);
  }
  env.push_back("RAILSHARD_RANK=" + std::to_string(place.rank));
  env.push_back("RAILSHARD_WORLD_SIZE=" + std::to_string(place.world_size));
  env.push_back("RAILSHARD_LOCAL_RANK=" + std::to_string(place.local_rank));
  env.push_back("RAILSHARD_STORE_ADDR=" + store_addr);
  env.push_back("RAILSHARD_TOKEN=" + token);
  if (store_fd >= 0) env.push_back("RAILSHARD_STORE_FD=" + std::to_string(store_fd));
  if (store_external) env.push_back("RAILSHARD_STORE_EXTERNAL=1");
  if (elastic) env.push_back("RAILSHARD_ELASTIC=1");
  return env;
}

std::vector<std::string> torchEnvironment(const std::vector<std::string>& base,
                                          const RankPlace& place, const std::string& master_addr,
                                          int master_port) {
  auto has = [&](const std::string& name) {
    return std::any_of(base.begin(), base.end(),
                       [&](const std::string& entry) { return entry.rfind(name + "=", 0) == 0; });
  };
  std::vector<std::string> env = {"RANK=" + std::to_string(place.rank),
                                  "WORLD_SIZE=" + std::to_string(place.world_size),
                                  "LOCAL_RANK=" + std::to_string(place.local_rank),
                                  "LOCAL_WORLD_SIZE=" + std::to_string(place.local_world_size)};
  if (!has("MASTER_ADDR")) env.push_back("MASTER_ADDR=" + master_addr);
  if (!has("MASTER_PORT")) env.push_back("MASTER_PORT=" + std::to_string(master_port));
  // As torchrun does: torch's intra-op pool would otherwise take every core in each of the
  // host's ranks, and oversubscribed OpenMP threads spin against each other (4 ranks on 2 cores
  // here). A user's value is kept.
  if (!has("OMP_NUM_THREADS") && place.local_world_size > 1) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

}  // namespace railshard::launcher
