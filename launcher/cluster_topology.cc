#include "launcher/cluster_topology.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/fnv.h"
#include "base/logging.h"
#include "launcher/discovery/host_discovery.h"
#include "launcher/link_probe.h"
#include "transport/shm/host_identity.h"

namespace railshard::launcher {

namespace {

using topology::Topology;
using topology::VertexKind;

// Values published through the store carry either a payload or an error, so a failure on
// one rank (bad interface spec, unreadable topology file) reaches every rank as the same
// typed error instead of as a timeout on the others.
std::string okValue(const std::string& payload) {
  return "ok\n" + payload;
}

std::string errorValue(const std::exception& error) {
  return "error " + std::to_string(static_cast<int>(kindOf(error))) + "\n" + error.what();
}

std::string openValue(const std::string& value) {
  const size_t newline = value.find('\n');
  const std::string head = value.substr(0, newline);
  const std::string body = newline == std::string::npos ? "" : value.substr(newline + 1);
  if (head == "ok") return body;
  if (head.rfind("error ", 0) == 0) {
    throwError(static_cast<ErrorKind>(std::stoi(head.substr(6))), body);
  }
  throw ProtocolError("topology exchange: malformed store value '" + head + "'");
}

std::string thisHostname() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

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

struct RankInfo {
  std::string host_key;  // hostname + boot id + /dev/shm: one per machine (or container)
  std::string hostname;
  int bound_numa = -1;
};

std::string encode(const RankInfo& info) {
  nlohmann::json j;
  j["host_key"] = info.host_key;
  j["hostname"] = info.hostname;
  j["bound_numa"] = info.bound_numa;
  return j.dump();
}

RankInfo decode(const std::string& text, int rank) {
  try {
    const auto j = nlohmann::json::parse(text);
    return RankInfo{j.at("host_key").get<std::string>(), j.at("hostname").get<std::string>(),
                    j.at("bound_numa").get<int>()};
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError("topology exchange: rank " + std::to_string(rank) +
                        " published a malformed description: " + e.what());
  }
}

std::string hostSlot(const std::string& host_key) {
  // Store keys stay printable and short: the host key hashed.
  std::ostringstream out;
  out << std::hex << Fnv1a().add(host_key).value();
  return out.str();
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
  std::set<std::string> taken;
  for (const auto& key : host_keys) {
    const std::string prefix = options.key_prefix + "/topo/host/" + hostSlot(key);
    Topology host =
        Topology::fromJson(openValue(store.getString(prefix, timeout)), "host description " + key);
    const auto hosts = host.hosts();
    if (hosts.size() != 1) {
      throw ProtocolError("topology exchange: host description " + key + " has " +
                          std::to_string(hosts.size()) + " hosts");
    }
    std::string id = hosts.front();
    if (taken.count(id) != 0) {
      // Two machines (or containers) with one host name: keep both, apart.
      int n = 2;
      while (taken.count(id + "~" + std::to_string(n)) != 0) ++n;
      const std::string renamed = id + "~" + std::to_string(n);
      RS_LOG_WARN("two hosts are both called '{}'; the second becomes '{}' in the topology", id,
                  renamed);
      host.renameHost(id, renamed);
      id = renamed;
    }
    taken.insert(id);
    host_id[key] = id;
    cluster.merge(host);
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

// Step 4: each rank reports whether the graph it parsed hashes to what rank 0 published;
// rank 0 turns the reports into one verdict that everyone raises.
void agree(Store& store, const ClusterTopologyOptions& options, const std::string& round,
           const std::string& mine, const std::string& published, Duration timeout) {
  const std::string base = options.key_prefix + "/topo/" + round;
  const std::string report = mine == published
                                 ? "ok"
                                 : "rank " + std::to_string(options.rank) +
                                       " computes topology hash " + mine + ", rank 0 published " +
                                       published + " (different railshard versions on the hosts?)";
  store.setString(base + "/report/" + std::to_string(options.rank), report, timeout);
  if (options.rank == 0) {
    std::string verdict = "ok";
    for (int r = 0; r < options.size; ++r) {
      const std::string text = store.getString(base + "/report/" + std::to_string(r), timeout);
      if (text != "ok" && verdict == "ok") verdict = text;
    }
    store.setString(base + "/verdict", verdict, timeout);
  }
  const std::string verdict = store.getString(base + "/verdict", timeout);
  if (verdict != "ok") throw MismatchError("ranks disagree on the cluster topology: " + verdict);
}

// Publishes `graph` (rank 0) and returns what every rank parsed, hash-checked.
Topology distribute(Store& store, const ClusterTopologyOptions& options, const std::string& round,
                    const std::function<Topology()>& make, Duration timeout) {
  const std::string key = options.key_prefix + "/topo/" + round + "/graph";
  if (options.rank == 0) {
    std::string value;
    try {
      const Topology graph = make();
      value = okValue(graph.hash() + "\n" + graph.toJson());
    } catch (const std::exception& e) {
      value = errorValue(e);
    }
    store.setString(key, value, timeout);
  }
  const std::string payload = openValue(store.getString(key, timeout));
  const size_t newline = payload.find('\n');
  const std::string published = payload.substr(0, newline);
  Topology graph = Topology::fromJson(payload.substr(newline + 1), "cluster topology from rank 0");
  agree(store, options, round, graph.hash(), published, timeout);
  return graph;
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
  RankInfo mine;
  mine.hostname = options.hostname.empty() ? thisHostname() : options.hostname;
  mine.host_key = transport::shm::hostIdentity();
  if (!options.hostname.empty()) mine.host_key = options.hostname + "/" + mine.host_key;
  mine.bound_numa = boundNumaNode(options.sysfs_root);
  if (!from_file) {
    const std::string slot = hostSlot(mine.host_key);
    if (store.add(base + "/leader/" + slot, 1, timeout) == 1) {
      std::string value;
      try {
        discovery::DiscoveryOptions discover;
        discover.sysfs_root = options.sysfs_root;
        discover.socket_ifname = options.config.socket_ifname;
        discover.hostname = mine.hostname;
        value = okValue(discovery::discoverHost(discover).toJson());
      } catch (const std::exception& e) {
        value = errorValue(e);
      }
      store.setString(base + "/host/" + slot, value, timeout);
    }
  }
  store.setString(base + "/rank/" + std::to_string(options.rank), encode(mine), timeout);

  // Step 2: rank 0 merges (or loads the file) and everyone receives the graph.
  const auto gatherInfos = [&] {
    std::vector<RankInfo> infos;
    for (int r = 0; r < options.size; ++r) {
      infos.push_back(decode(store.getString(base + "/rank/" + std::to_string(r), timeout), r));
    }
    return infos;
  };
  Topology graph = distribute(
      store, options, "initial",
      [&] {
        const auto infos = gatherInfos();
        return from_file ? loadFromFile(options, infos)
                         : mergeDiscovered(store, options, infos, timeout);
      },
      timeout);

  // Step 3: measure the rails between hosts.
  if (options.config.probe && graph.hosts().size() > 1) {
    const std::string my_host = graph.rank(options.rank).host;
    const bool leader = graph.ranksOn(my_host).front() == options.rank;
    ProbeOptions probe;
    probe.key_prefix = base + "/probe";
    probe.bulk_time = options.config.probe_time;
    probe.timeout = timeout;
    probe.token = options.config.token;
    if (leader) runLinkProbe(store, graph, my_host, probe);
    graph = distribute(
        store, options, "probed",
        [&] {
          Topology measured = graph;
          collectProbeResults(store, measured, probe);
          return measured;
        },
        timeout);
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
