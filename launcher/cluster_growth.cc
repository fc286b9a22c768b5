#include "launcher/cluster_growth.h"

#include <map>
#include <set>

#include "base/error.h"
#include "base/logging.h"
#include "launcher/cluster_exchange.h"

namespace railshard::launcher {

namespace {

using namespace exchange;
using topology::Topology;
using topology::VertexKind;

// Rank 0's step 2: the members' graph with the joiners (ranks `members`.. of `infos`) placed.
Topology placeJoiners(Store& store, const ClusterTopologyOptions& options, const Topology& known,
                      int members, const std::vector<RankInfo>& infos, Duration timeout) {
  const std::string base = options.key_prefix + "/topo";
  Topology graph = known;
  std::vector<topology::RankPlacement> placements = known.ranks();
  if (static_cast<int>(placements.size()) != members) {
    throw ProtocolError("topology exchange: the members' graph places " +
                        std::to_string(placements.size()) + " ranks, not the " +
                        std::to_string(members) + " members");
  }
  std::map<std::string, std::string> host_of;  // host key -> host vertex id
  std::map<std::string, std::set<int>> taken;  // host vertex id -> local ranks in use
  for (int r = 0; r < members; ++r) {
    const auto& placement = placements[static_cast<size_t>(r)];
    host_of[infos[static_cast<size_t>(r)].host_key] = placement.host;
    taken[placement.host].insert(placement.local_rank);
  }
  struct Joiner {
    int rank;
    std::string host;
    int local_rank;
  };
  std::vector<Joiner> joiners;
  for (int r = members; r < static_cast<int>(infos.size()); ++r) {
    const RankInfo& info = infos[static_cast<size_t>(r)];
    auto known_host = host_of.find(info.host_key);
    if (known_host == host_of.end()) {
      const topology::Vertex* by_name = graph.find(info.hostname);
      std::string host;
      if (by_name != nullptr && by_name->kind == VertexKind::kHost && taken[by_name->id].empty()) {
        host = by_name->id;  // the cluster knew it; its ranks were all lost
      } else if (options.config.topo_file.empty()) {
        host = mergeHost(graph, hostGraph(store, base, info.host_key, timeout),
                         "joining rank " + std::to_string(r));
        RS_LOG_INFO("grown cluster graph: rank {} joins from host '{}', new to the cluster", r,
                    host);
      } else {
        throw ConfigError("RAILSHARD_TOPO_FILE " + options.config.topo_file + " has no host '" +
                          info.hostname + "' (joining rank " + std::to_string(r) + " runs there)");
      }
      known_host = host_of.emplace(info.host_key, host).first;
    }
    const std::string& host = known_host->second;
    int local_rank = 0;
    while (taken[host].count(local_rank) != 0) ++local_rank;
    taken[host].insert(local_rank);
    joiners.push_back(Joiner{r, host, local_rank});
  }
  for (const auto& joiner : joiners) {
    placements.push_back(placeRank(graph, joiner.host, joiner.rank, joiner.local_rank,
                                   static_cast<int>(taken[joiner.host].size()),
                                   infos[static_cast<size_t>(joiner.rank)].bound_numa));
  }
  graph.setRanks(std::move(placements));
  return graph;
}

// True when some host's ranks all joined in this round: its rails were never measured.
bool hasHostOfJoinersOnly(const Topology& graph, int members) {
  for (const auto& host : graph.hosts()) {
    const auto ranks = graph.ranksOn(host);
    if (!ranks.empty() && ranks.front() >= members) return true;
  }
  return false;
}

}  // namespace

Topology extendClusterTopology(Store& store, const Communicator::GraphRound& round,
                               const ClusterTopologyOptions& options_in) {
  ClusterTopologyOptions options = options_in;
  options.rank = round.rank;
  options.size = round.size;
  options.key_prefix = round.key_prefix;
  const Duration timeout = std::chrono::duration_cast<Duration>(options.config.connect_timeout);
  const std::string base = options.key_prefix + "/topo";
  const bool joiner = round.rank >= round.members;

  const RankInfo mine = thisRank(options);
  if (joiner && options.config.topo_file.empty()) {
    // Whether this host is new to the cluster only rank 0 can tell; discovering it anyway
    // costs the joiner, who waits for the members in any case, not the members.
    discoverOncePerHost(store, base, mine, options, timeout);
  }
  publishRank(store, base, options.rank, mine, timeout);
  Topology graph = distribute(
      store, options, "grown",
      [&] {
        if (round.known == nullptr) {
          throw ProtocolError("topology exchange: rank 0 of the grown generation has no graph");
        }
        return placeJoiners(store, options, *round.known, round.members,
                            gatherRanks(store, base, options.size, timeout), timeout);
      },
      timeout);
  if (options.config.probe && hasHostOfJoinersOnly(graph, round.members)) {
    graph = probeRails(store, options, graph, "grown-probed", timeout);
  }
  RS_LOG_DEBUG("rank {}: grown cluster topology {} ({} hosts, {} ranks)", options.rank,
               graph.hash(), graph.hosts().size(), graph.worldSize());
  return graph;
}

Communicator::GraphExtender graphExtender(const Config& config) {
  return [config](Store& store, const Communicator::GraphRound& round) {
    ClusterTopologyOptions options;
    options.config = config;
    return std::make_shared<const topology::Topology>(extendClusterTopology(store, round, options));
  };
}

}  // namespace railshard::launcher
