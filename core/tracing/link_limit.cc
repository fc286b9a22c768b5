#include "core/tracing/link_limit.h"

#include <cstdio>

#include "base/error.h"

namespace railshard::tracing {

namespace {

std::string gbpsText(double gbps) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g Gbit/s", gbps);
  return text;
}

std::string rankText(const topology::Topology& topology, int rank) {
  return "rank " + std::to_string(rank) + " (" + topology.rank(rank).host + ")";
}

}  // namespace

LinkLimit hopLimit(const topology::Topology& topology, int a, int b) {
  LinkLimit limit;
  limit.from = a;
  limit.to = b;
  const std::string& host_a = topology.rank(a).host;
  const std::string& host_b = topology.rank(b).host;
  std::string how;
  if (host_a == host_b) {
    limit.gbps = topology.path(a, b).bandwidth_gbps;
    how = limit.gbps > 0 ? "same host, " + gbpsText(limit.gbps)
                         : "same host, speed unknown (no measured shared-memory bandwidth)";
  } else {
    const auto rails = topology.rails(host_a, host_b);
    bool unknown = rails.empty();
    std::string parts;
    for (const auto& rail : rails) {
      if (rail.gbps() <= 0) unknown = true;
      limit.gbps += rail.gbps();
      if (!parts.empty()) parts += " + ";
      char text[32];
      std::snprintf(text, sizeof(text), "%.3g", rail.gbps());
      parts += text;
    }
    if (unknown) limit.gbps = 0;
    how = rails.empty()
              ? "no rail between the hosts"
              : std::to_string(rails.size()) + (rails.size() == 1 ? " rail, " : " rails, ") +
                    parts + " Gbit/s" + (unknown ? " (a rail's speed is unknown)" : "");
  }
  limit.description = rankText(topology, a) + " -> " + rankText(topology, b) + ": " + how;
  return limit;
}

LinkLimit ringLimit(const topology::Topology& topology, const std::vector<int>& ring) {
  if (ring.size() < 2) {
    throw InvalidArgument("ringLimit: a ring needs at least two ranks, got " +
                          std::to_string(ring.size()));
  }
  LinkLimit worst;
  LinkLimit unknown_inside;  // the first same-host hop of unknown speed
  bool found = false;
  for (size_t i = 0; i < ring.size(); ++i) {
    const LinkLimit hop = hopLimit(topology, ring[i], ring[(i + 1) % ring.size()]);
    const bool same_host = topology.rank(hop.from).host == topology.rank(hop.to).host;
    if (hop.gbps <= 0) {
      // Shared memory inside a host is an order of magnitude faster than any network link,
      // and discovery rarely knows its speed: such a hop does not decide the limit when the
      // ring also crosses hosts. An unknown network hop makes the whole limit unknown.
      if (!same_host) return hop;
      if (unknown_inside.from < 0) unknown_inside = hop;
      continue;
    }
    if (!found || hop.gbps < worst.gbps) worst = hop;
    found = true;
  }
  if (!found) return unknown_inside;  // one host, speed unknown
  return worst;
}

LinkLimit ringLimit(const topology::Topology& topology) {
  std::vector<int> ring;
  for (int r = 0; r < topology.worldSize(); ++r) ring.push_back(r);
  return ringLimit(topology, ring);
}

}  // namespace railshard::tracing
