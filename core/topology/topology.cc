#include "core/topology/topology.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "base/error.h"

namespace railshard::topology {

bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      // Compare the digit runs as numbers: first by length without leading zeros.
      size_t ei = i;
      size_t ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      size_t si = i;
      size_t sj = j;
      while (si + 1 < ei && a[si] == '0') ++si;
      while (sj + 1 < ej && b[sj] == '0') ++sj;
      if (ei - si != ej - sj) return ei - si < ej - sj;
      const int c = a.compare(si, ei - si, b, sj, ej - sj);
      if (c != 0) return c < 0;
      if (ei - i != ej - j) return ei - i < ej - j;  // "01" after "1": deterministic
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

namespace {

int kindOrder(VertexKind kind) {
  return static_cast<int>(kind);
}

// Canonical vertex order: hosts' contents grouped by host (natural order), host first, then
// NUMA, switches, GPUs, NICs; networks last.
bool canonicalLess(const Vertex& x, const Vertex& y) {
  const bool nx = x.kind == VertexKind::kNetwork;
  const bool ny = y.kind == VertexKind::kNetwork;
  if (nx != ny) return ny;
  if (x.host != y.host) return naturalLess(x.host, y.host);
  if (x.kind != y.kind) return kindOrder(x.kind) < kindOrder(y.kind);
  return naturalLess(x.id, y.id);
}

}  // namespace

Topology::LinkKey Topology::keyOf(const std::string& a, const std::string& b, LinkKind kind) {
  if (naturalLess(b, a)) return {b, a, kind};
  return {a, b, kind};
}

void Topology::addVertex(Vertex vertex) {
  if (vertex.id.empty()) throw InvalidArgument("topology: a vertex has an empty id");
  if (vertex.kind != VertexKind::kNetwork && vertex.host.empty()) {
    throw InvalidArgument("topology: vertex '" + vertex.id + "' (" +
                          std::string(name(vertex.kind)) + ") names no host");
  }
  if (vertex.kind == VertexKind::kHost && vertex.host != vertex.id) {
    throw InvalidArgument("topology: host vertex '" + vertex.id + "' must have host == id");
  }
  std::sort(vertex.addresses.begin(), vertex.addresses.end());
  const std::string id = vertex.id;
  const auto [it, added] = vertices_.emplace(id, std::move(vertex));
  if (!added) throw InvalidArgument("topology: duplicate vertex id '" + id + "'");
  index(it->second);
}

void Topology::index(const Vertex& vertex) {
  members_[vertex.kind == VertexKind::kNetwork ? "" : vertex.host].push_back(vertex.id);
}

void Topology::index(const LinkKey& key) {
  adjacency_[std::get<0>(key)].push_back(key);
  adjacency_[std::get<1>(key)].push_back(key);
}

void Topology::reindex() {
  members_.clear();
  adjacency_.clear();
  for (const auto& [id, vertex] : vertices_) index(vertex);
  for (const auto& [key, link] : links_) index(key);
}

void Topology::addLink(Link link) {
  if (link.a == link.b) throw InvalidArgument("topology: link from '" + link.a + "' to itself");
  for (const auto* end : {&link.a, &link.b}) {
    if (vertices_.count(*end) == 0) {
      throw InvalidArgument("topology: link " + link.a + " -- " + link.b + " (" +
                            std::string(name(link.kind)) + ") names unknown vertex '" + *end + "'");
    }
  }
  LinkKey key = keyOf(link.a, link.b, link.kind);
  link.a = std::get<0>(key);
  link.b = std::get<1>(key);
  if (links_.count(key) != 0) {
    throw InvalidArgument("topology: duplicate " + std::string(name(link.kind)) + " link " +
                          link.a + " -- " + link.b);
  }
  index(key);
  links_.emplace(std::move(key), std::move(link));
}

void Topology::setMeasurement(const std::string& a, const std::string& b, LinkKind kind,
                              double measured_gbps, double latency_us) {
  const auto it = links_.find(keyOf(a, b, kind));
  if (it == links_.end()) {
    throw InvalidArgument("topology: no " + std::string(name(kind)) + " link " + a + " -- " + b +
                          " to record a measurement on");
  }
  it->second.measured_gbps = measured_gbps;
  it->second.latency_us = latency_us;
}

void Topology::setRanks(std::vector<RankPlacement> ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankPlacement& x, const RankPlacement& y) { return x.rank < y.rank; });
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankPlacement& placement = ranks[i];
    const std::string who = "topology: rank " + std::to_string(placement.rank);
    if (placement.rank != static_cast<int>(i)) {
      throw InvalidArgument(i < static_cast<size_t>(placement.rank)
                                ? "topology: rank " + std::to_string(i) + " has no placement"
                                : who + " is placed twice");
    }
    const Vertex* host = find(placement.host);
    if (host == nullptr || host->kind != VertexKind::kHost) {
      throw InvalidArgument(who + " is on '" + placement.host + "', which is not a host");
    }
    const auto check = [&](const std::string& id, VertexKind kind) {
      if (id.empty()) return;
      const Vertex* v = find(id);
      if (v == nullptr || v->kind != kind || v->host != placement.host) {
        throw InvalidArgument(who + ": '" + id + "' is not a " + std::string(name(kind)) +
                              " of host '" + placement.host + "'");
      }
    };
    check(placement.numa, VertexKind::kNuma);
    check(placement.gpu, VertexKind::kGpu);
  }
  ranks_ = std::move(ranks);
}

void Topology::merge(const Topology& other) {
  for (const auto& [id, vertex] : other.vertices_) {
    const auto it = vertices_.find(id);
    if (it == vertices_.end()) {
      index(vertices_.emplace(id, vertex).first->second);
    } else if (!(it->second == vertex)) {
      throw InvalidArgument("topology: vertex '" + id +
                            "' is described differently by two hosts (same host name on two "
                            "machines, or disagreeing networks?)");
    }
  }
  for (const auto& [key, link] : other.links_) {
    const auto it = links_.find(key);
    if (it == links_.end()) {
      links_.emplace(key, link);
      index(key);
    } else if (!(it->second == link)) {
      throw InvalidArgument("topology: link " + link.a + " -- " + link.b +
                            " is described differently by two hosts");
    }
  }
}

void Topology::renameHost(const std::string& from, const std::string& to) {
  if (find(to) != nullptr)
    throw InvalidArgument("topology: cannot rename host '" + from + "' to '" + to + "': taken");
  const auto rename = [&](const std::string& id) {
    if (id == from) return to;
    if (id.rfind(from + "/", 0) == 0) return to + id.substr(from.size());
    return id;
  };
  std::map<std::string, Vertex> vertices;
  for (auto& [id, v] : vertices_) {
    Vertex copy = v;
    copy.id = rename(v.id);
    if (!copy.host.empty()) copy.host = rename(v.host);
    vertices.emplace(copy.id, std::move(copy));
  }
  std::map<LinkKey, Link> links;
  for (auto& [key, l] : links_) {
    Link copy = l;
    LinkKey k = keyOf(rename(l.a), rename(l.b), l.kind);
    copy.a = std::get<0>(k);
    copy.b = std::get<1>(k);
    links.emplace(std::move(k), std::move(copy));
  }
  for (auto& r : ranks_) {
    r.host = rename(r.host);
    r.numa = rename(r.numa);
    r.gpu = rename(r.gpu);
  }
  vertices_ = std::move(vertices);
  links_ = std::move(links);
  reindex();
}

const Vertex* Topology::find(const std::string& id) const {
  const auto it = vertices_.find(id);
  return it == vertices_.end() ? nullptr : &it->second;
}

const Vertex& Topology::vertex(const std::string& id) const {
  const Vertex* v = find(id);
  if (v == nullptr) throw InvalidArgument("topology: no vertex '" + id + "'");
  return *v;
}

std::vector<const Vertex*> Topology::vertices() const {
  std::vector<const Vertex*> result;
  result.reserve(vertices_.size());
  for (const auto& [id, vertex] : vertices_) result.push_back(&vertex);
  std::sort(result.begin(), result.end(),
            [](const Vertex* x, const Vertex* y) { return canonicalLess(*x, *y); });
  return result;
}

std::vector<const Vertex*> Topology::vertices(VertexKind kind, const std::string& host) const {
  std::vector<const Vertex*> result;
  if (host.empty()) {
    for (const auto& [id, vertex] : vertices_) {
      if (vertex.kind == kind) result.push_back(&vertex);
    }
  } else if (const auto it = members_.find(host); it != members_.end()) {
    for (const std::string& id : it->second) {
      const Vertex& vertex = vertices_.at(id);
      if (vertex.kind == kind) result.push_back(&vertex);
    }
  }
  std::sort(result.begin(), result.end(),
            [](const Vertex* x, const Vertex* y) { return canonicalLess(*x, *y); });
  return result;
}

std::vector<const Link*> Topology::links() const {
  // Canonical link order follows the canonical order of the first, then second endpoint.
  std::map<std::string, size_t> position;
  size_t n = 0;
  for (const Vertex* v : vertices()) position[v->id] = n++;
  std::vector<const Link*> result;
  result.reserve(links_.size());
  for (const auto& [key, link] : links_) result.push_back(&link);
  std::sort(result.begin(), result.end(), [&](const Link* x, const Link* y) {
    const auto kx = std::minmax(position.at(x->a), position.at(x->b));
    const auto ky = std::minmax(position.at(y->a), position.at(y->b));
    if (kx != ky) return kx < ky;
    return static_cast<int>(x->kind) < static_cast<int>(y->kind);
  });
  return result;
}

std::vector<const Link*> Topology::linksOf(const std::string& id) const {
  std::vector<const Link*> result;
  const auto it = adjacency_.find(id);
  if (it == adjacency_.end()) return result;
  for (const LinkKey& key : it->second) result.push_back(&links_.at(key));
  // The order links were added in differs between graphs with equal content; queries that
  // break ties by visiting order must see the same order everywhere.
  std::sort(result.begin(), result.end(), [](const Link* x, const Link* y) {
    return std::tie(x->a, x->b, x->kind) < std::tie(y->a, y->b, y->kind);
  });
  return result;
}

const RankPlacement& Topology::rank(int r) const {
  if (r < 0 || r >= worldSize()) {
    throw InvalidArgument("topology: rank " + std::to_string(r) + " is not in 0.." +
                          std::to_string(worldSize() - 1));
  }
  return ranks_[static_cast<size_t>(r)];
}

std::vector<std::string> Topology::hosts() const {
  std::vector<std::string> result;
  for (const Vertex* v : vertices(VertexKind::kHost)) result.push_back(v->id);
  return result;
}

std::vector<int> Topology::ranksOn(const std::string& host) const {
  std::vector<int> result;
  for (const auto& placement : ranks_) {
    if (placement.host == host) result.push_back(placement.rank);
  }
  return result;
}

}  // namespace railshard::topology
