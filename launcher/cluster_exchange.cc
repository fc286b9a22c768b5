#include "launcher/cluster_exchange.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/fnv.h"
#include "base/logging.h"
#include "launcher/discovery/host_discovery.h"
#include "launcher/link_probe.h"
#include "transport/links/shm/host_identity.h"

namespace railshard::launcher::exchange {

using topology::Topology;

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

namespace {

std::string thisHostname() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

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

// Each rank reports whether the graph it parsed hashes to what rank 0 published; rank 0
// turns the reports into one verdict that everyone raises.
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

}  // namespace

RankInfo thisRank(const ClusterTopologyOptions& options) {
  RankInfo mine;
  mine.hostname = options.hostname.empty() ? thisHostname() : options.hostname;
  mine.host_key = transport::links::shm::hostIdentity();
  if (!options.hostname.empty()) mine.host_key = options.hostname + "/" + mine.host_key;
  mine.bound_numa = boundNumaNode(options.sysfs_root);
  return mine;
}

void publishRank(Store& store, const std::string& base, int rank, const RankInfo& info,
                 Duration timeout) {
  store.setString(base + "/rank/" + std::to_string(rank), encode(info), timeout);
}

std::vector<RankInfo> gatherRanks(Store& store, const std::string& base, int size,
                                  Duration timeout) {
  // One deadline for all of them: the error names the first rank missing.
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(base + "/rank/" + std::to_string(r));
  store.wait(keys, timeout);
  std::vector<RankInfo> infos;
  for (int r = 0; r < size; ++r) {
    infos.push_back(decode(store.getString(keys[static_cast<size_t>(r)], timeout), r));
  }
  return infos;
}

std::string hostSlot(const std::string& host_key) {
  // Store keys stay printable and short: the host key hashed.
  std::ostringstream out;
  out << std::hex << Fnv1a().add(host_key).value();
  return out.str();
}

void discoverOncePerHost(Store& store, const std::string& base, const RankInfo& info,
                         const ClusterTopologyOptions& options, Duration timeout) {
  const std::string slot = hostSlot(info.host_key);
  if (store.add(base + "/leader/" + slot, 1, timeout) != 1) return;
  std::string value;
  try {
    discovery::DiscoveryOptions discover;
    discover.sysfs_root = options.sysfs_root;
    discover.socket_ifname = options.config.socket_ifname;
    discover.hostname = info.hostname;
    value = okValue(discovery::discoverHost(discover).toJson());
  } catch (const std::exception& e) {
    value = errorValue(e);
  }
  store.setString(base + "/host/" + slot, value, timeout);
}

Topology hostGraph(Store& store, const std::string& base, const std::string& host_key,
                   Duration timeout) {
  Topology host =
      Topology::fromJson(openValue(store.getString(base + "/host/" + hostSlot(host_key), timeout)),
                         "host description " + host_key);
  if (host.hosts().size() != 1) {
    throw ProtocolError("topology exchange: host description " + host_key + " has " +
                        std::to_string(host.hosts().size()) + " hosts");
  }
  return host;
}

std::string mergeHost(Topology& cluster, Topology host, const std::string& what) {
  std::string id = host.hosts().front();
  if (cluster.find(id) != nullptr) {
    // Two machines (or containers) with one host name: keep both, apart.
    int n = 2;
    while (cluster.find(id + "~" + std::to_string(n)) != nullptr) ++n;
    const std::string renamed = id + "~" + std::to_string(n);
    RS_LOG_WARN("two hosts are both called '{}' ({}); the second becomes '{}' in the topology", id,
                what, renamed);
    host.renameHost(id, renamed);
    id = renamed;
  }
  cluster.merge(host);
  return id;
}

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
  // Rank 0 may wait a timeout for the ranks, then for a host's description: the others wait
  // long enough to be told why it failed rather than time out beside it.
  const std::string payload =
      openValue(store.getString(key, options.rank == 0 ? timeout : 2 * timeout));
  const size_t newline = payload.find('\n');
  const std::string published = payload.substr(0, newline);
  Topology graph = Topology::fromJson(payload.substr(newline + 1), "cluster topology from rank 0");
  agree(store, options, round, graph.hash(), published, timeout);
  return graph;
}

Topology probeRails(Store& store, const ClusterTopologyOptions& options, const Topology& graph,
                    const std::string& round, Duration timeout) {
  const std::string my_host = graph.rank(options.rank).host;
  const bool leader = graph.ranksOn(my_host).front() == options.rank;
  ProbeOptions probe;
  probe.key_prefix = options.key_prefix + "/topo/" + round + "/probe";
  probe.bulk_time = options.config.probe_time;
  probe.timeout = timeout;
  probe.token = options.config.token;
  if (leader) runLinkProbe(store, graph, my_host, probe);
  return distribute(
      store, options, round,
      [&] {
        Topology measured = graph;
        collectProbeResults(store, measured, probe);
        return measured;
      },
      timeout);
}

}  // namespace railshard::launcher::exchange
