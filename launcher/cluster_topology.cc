#include "launcher/cluster_topology.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "launcher/cluster_exchange.h"

namespace railshard::launcher {

namespace {

using topology::Topology;
using topology::VertexKind;
using namespace exchange;

std::string readFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(what + ": cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}
std::set<int> parseCpuList(const std::string& text) {
  std::set<int> cpus;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty() || part == "\n") continue;
    const size_t dash = part.find('-');
    try {
      const int first = std::stoi(part.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
      for (int c = first; c <= last; ++c) cpus.insert(c);
    } catch (const std::exception&) {
      return {};
    }
  }
  return cpus;
}

// Rank 0's part of step 2 when discovering: merge the hosts' graphs and place the ranks.
Topology mergeDiscovered(Store& store, const ClusterTopologyOptions& options,
                         const std::vector<RankInfo>& infos, Duration timeout) {
  // Hosts in order of their lowest rank, so the first host is rank 0's.
  std::vector<std::string> host_keys;
  for (const auto& info : infos) {
    if (std::find(host_keys.begin(), host_keys.end(), info.host_key) == host_keys.end()) {
      host_keys.push_back(info.host_key);
    }
  }
  Topology cluster;
  std::map<std::string, std::string> host_id;  // host key -> host vertex id
  for (const auto& key : host_keys) {
    host_id[key] = mergeHost(cluster, hostGraph(store, options.key_prefix + "/topo", key, timeout),
                             "host key " + key);
  }
  std::map<std::string, int> local_size;
  for (const auto& info : infos) ++local_size[info.host_key];
  std::map<std::string, int> next_local;
  std::vector<topology::RankPlacement> placements;
  for (int r = 0; r < static_cast<int>(infos.size()); ++r) {
    const RankInfo& info = infos[static_cast<size_t>(r)];
    const int local_rank = next_local[info.host_key]++;
    placements.push_back(placeRank(cluster, host_id[info.host_key], r, local_rank,
                                   local_size[info.host_key], info.bound_numa));
  }
  cluster.setRanks(std::move(placements));
  return cluster;
}

// Rank 0's part of step 2 with RAILSHARD_TOPO_FILE.
Topology loadFromFile(const ClusterTopologyOptions& options, const std::vector<RankInfo>& infos) {
  const std::string what = "RAILSHARD_TOPO_FILE " + options.config.topo_file;
  Topology file =
      Topology::fromJson(readFile(options.config.topo_file, "RAILSHARD_TOPO_FILE"), what);
  const int size = static_cast<int>(infos.size());
  if (file.worldSize() == size) return file;
  if (file.worldSize() != 0) {
    throw ConfigError(what + " places " + std::to_string(file.worldSize()) +
                      " ranks, but the job has " + std::to_string(size));
  }
  // No placement in the file: put each rank on the host with its host name.
  const auto hosts = file.hosts();
  std::map<std::string, int> local_size;
  for (const auto& info : infos) ++local_size[info.hostname];
  std::map<std::string, int> next_local;
  std::vector<topology::RankPlacement> placements;
  for (int r = 0; r < size; ++r) {
    const RankInfo& info = infos[static_cast<size_t>(r)];
    const topology::Vertex* host = file.find(info.hostname);
    if (host == nullptr || host->kind != VertexKind::kHost) {
      std::string list;
      for (const auto& h : hosts) list += (list.empty() ? "" : ", ") + h;
      throw ConfigError(what + " has no host '" + info.hostname + "' (rank " + std::to_string(r) +
                        " runs there) and no 'ranks' list; hosts in the file: " + list);
    }
    placements.push_back(placeRank(file, info.hostname, r, next_local[info.hostname]++,
                                   local_size[info.hostname], info.bound_numa));
  }
  file.setRanks(std::move(placements));
  return file;
}

}  // namespace

int boundNumaNode(const std::string& sysfs_root) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof(mask), &mask) != 0) return -1;
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) allowed.insert(c);
  }
  int found = -1;
  for (int node = 0; node < 4096; ++node) {
    std::ifstream in(sysfs_root + "/devices/system/node/node" + std::to_string(node) + "/cpulist");
    if (!in) {
      if (node > 64) break;
      continue;
    }
    std::string text;
    std::getline(in, text);
    const std::set<int> cpus = parseCpuList(text);
    if (!allowed.empty() &&
        std::includes(cpus.begin(), cpus.end(), allowed.begin(), allowed.end())) {
      found = node;
      break;
    }
  }
  return found;
}

topology::RankPlacement placeRank(const Topology& graph, const std::string& host, int rank,
                                  int local_rank, int local_size, int bound_numa) {
  topology::RankPlacement placement;
  placement.rank = rank;
  placement.host = host;
  placement.local_rank = local_rank;
  const auto gpus = graph.vertices(VertexKind::kGpu, host);
  const auto numas = graph.vertices(VertexKind::kNuma, host);
  if (!gpus.empty()) {
    placement.gpu = gpus[static_cast<size_t>(local_rank) % gpus.size()]->id;
    placement.numa = graph.numaOf(placement.gpu);
  }
  if (placement.numa.empty() && !numas.empty()) {
    const topology::Vertex* chosen = nullptr;
    for (const auto* numa : numas) {
      if (bound_numa >= 0 && numa->index == bound_numa) chosen = numa;
    }
    if (chosen == nullptr) {
      const size_t block = static_cast<size_t>(local_rank) * numas.size() /
                           static_cast<size_t>(std::max(local_size, 1));
      chosen = numas[std::min(block, numas.size() - 1)];
    }
    placement.numa = chosen->id;
  }
  return placement;
}

Topology buildClusterTopology(Store& store, const ClusterTopologyOptions& options) {
  const Duration timeout = std::chrono::duration_cast<Duration>(options.config.connect_timeout);
  const std::string base = options.key_prefix + "/topo";
  const bool from_file = !options.config.topo_file.empty();

  // Step 1: where this rank runs; the first rank on each host discovers it.
  const RankInfo mine = thisRank(options);
  if (!from_file) discoverOncePerHost(store, base, mine, options, timeout);
  publishRank(store, base, options.rank, mine, timeout);

  // Step 2: rank 0 merges (or loads the file) and everyone receives the graph.
  Topology graph = distribute(
      store, options, "initial",
      [&] {
        const auto infos = gatherRanks(store, base, options.size, timeout);
        return from_file ? loadFromFile(options, infos)
                         : mergeDiscovered(store, options, infos, timeout);
      },
      timeout);

  // Step 3: measure the rails between hosts.
  if (options.config.probe && graph.hosts().size() > 1) {
    graph = probeRails(store, options, graph, "probed", timeout);
  }

  if (options.rank == 0 && !options.config.topo_dump.empty()) {
    std::ofstream out(options.config.topo_dump);
    out << graph.toJson();
    if (!out) {
      RS_LOG_WARN("cannot write the topology to RAILSHARD_TOPO_DUMP={}", options.config.topo_dump);
    }
  }
  RS_LOG_DEBUG("rank {}: cluster topology {} ({} hosts)", options.rank, graph.hash(),
               graph.hosts().size());
  return graph;
}

}  // namespace railshard::launcher
