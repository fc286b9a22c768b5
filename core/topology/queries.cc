// The questions the rest of railshard asks the graph: which way between two ranks, which
// rails between two hosts, what is near a rank.
#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "base/error.h"
#include "core/topology/topology.h"

namespace railshard::topology {

namespace {

double effective(const Link& l) {
  return l.measured_gbps > 0 ? l.measured_gbps : l.nominal_gbps;
}

// Bandwidth used for comparing paths: unknown speeds count as unlimited, so a path is never
// preferred just because one of its links happens to have a number on it.
double comparable(double gbps) {
  return gbps > 0 ? gbps : std::numeric_limits<double>::infinity();
}

std::string addressOnly(const std::string& cidr) {
  return cidr.substr(0, cidr.find('/'));
}

struct HostPath {
  std::vector<std::string> vertices;
  std::vector<const Link*> links;
  double width = 0;  // comparable() bottleneck
  bool found = false;
};

// Widest, then shortest path from `from` to `to` inside one host. Only NUMA nodes and PCIe
// switches are transit vertices: data does not route through a GPU or a NIC. Vertices are
// visited in canonical order and only strictly better labels replace, so ties break the same
// way on every rank.
HostPath widestInHost(const Topology& t, const std::string& from, const std::string& to) {
  HostPath result;
  if (from == to) {
    result.vertices = {from};
    result.width = std::numeric_limits<double>::infinity();
    result.found = true;
    return result;
  }
  const std::string host = t.vertex(from).host;
  struct Label {
    double width = -1;
    size_t hops = 0;
    std::string previous;
    const Link* via = nullptr;
  };
  std::map<std::string, Label> labels;
  labels[from] = {std::numeric_limits<double>::infinity(), 0, "", nullptr};
  std::set<std::string> done;
  while (true) {
    // Pick the best unfinished vertex (graphs inside one host are small).
    std::string current;
    for (const auto& [id, label] : labels) {
      if (done.count(id) != 0) continue;
      if (current.empty()) {
        current = id;
        continue;
      }
      const Label& best = labels[current];
      if (label.width > best.width || (label.width == best.width && label.hops < best.hops) ||
          (label.width == best.width && label.hops == best.hops && naturalLess(id, current))) {
        current = id;
      }
    }
    if (current.empty() || current == to) break;
    done.insert(current);
    const Vertex& cv = t.vertex(current);
    const bool transit = cv.kind == VertexKind::kNuma || cv.kind == VertexKind::kPciSwitch;
    if (current != from && !transit) continue;
    for (const Link* link : t.linksOf(current)) {
      const std::string& next = link->a == current ? link->b : link->a;
      const Vertex& nv = t.vertex(next);
      if (nv.host != host || done.count(next) != 0) continue;
      if (nv.kind == VertexKind::kNic && !nv.excluded.empty() && next != to) continue;
      const double width = std::min(labels[current].width, comparable(effective(*link)));
      const size_t hops = labels[current].hops + 1;
      auto it = labels.find(next);
      if (it == labels.end() || width > it->second.width ||
          (width == it->second.width && hops < it->second.hops)) {
        labels[next] = {width, hops, current, link};
      }
    }
  }
  const auto it = labels.find(to);
  if (it == labels.end()) return result;
  result.found = true;
  result.width = it->second.width;
  for (std::string v = to; !v.empty(); v = labels[v].previous) {
    result.vertices.insert(result.vertices.begin(), v);
    if (labels[v].via != nullptr) result.links.insert(result.links.begin(), labels[v].via);
  }
  return result;
}

std::string anchorOf(const RankPlacement& p) {
  return !p.gpu.empty() ? p.gpu : p.numa;
}

void appendHops(Path& path, const HostPath& hops, bool skip_first) {
  for (size_t i = skip_first ? 1 : 0; i < hops.vertices.size(); ++i) {
    path.vertices.push_back(hops.vertices[i]);
  }
  for (const Link* l : hops.links) {
    path.links.push_back(l->kind);
    const double bw = effective(*l);
    if (bw > 0 && (path.bandwidth_gbps == 0 || bw < path.bandwidth_gbps)) path.bandwidth_gbps = bw;
  }
}

// The NUMA node (or switch) a device hangs off: the other end of its PCIe/virtual link.
std::string attachmentOf(const Topology& t, const std::string& id) {
  for (const Link* l : t.linksOf(id)) {
    if (l->kind != LinkKind::kPcie && l->kind != LinkKind::kVirtual &&
        l->kind != LinkKind::kLoopback) {
      continue;
    }
    const std::string& other = l->a == id ? l->b : l->a;
    const VertexKind kind = t.vertex(other).kind;
    if (kind == VertexKind::kNuma || kind == VertexKind::kPciSwitch) return other;
  }
  return "";
}

std::string numaOfVertex(const Topology& t, const std::string& id) {
  std::string current = id;
  for (int depth = 0; depth < 16 && !current.empty(); ++depth) {
    if (t.vertex(current).kind == VertexKind::kNuma) return current;
    // A switch's attachment is its parent switch or NUMA node.
    std::string parent;
    for (const Link* l : t.linksOf(current)) {
      if (l->kind != LinkKind::kPcie && l->kind != LinkKind::kVirtual &&
          l->kind != LinkKind::kLoopback) {
        continue;
      }
      const std::string& other = l->a == current ? l->b : l->a;
      const Vertex& ov = t.vertex(other);
      if (ov.kind == VertexKind::kNuma) return other;
      if (ov.kind == VertexKind::kPciSwitch && t.vertex(current).kind != VertexKind::kPciSwitch) {
        parent = other;
      } else if (ov.kind == VertexKind::kPciSwitch && naturalLess(other, current)) {
        parent = other;  // nested switches: the upstream one has the smaller bus id
      }
    }
    current = parent;
  }
  return "";
}

bool usableNic(const Vertex& v) {
  return v.kind == VertexKind::kNic && v.excluded.empty() && v.up;
}

}  // namespace

std::vector<Rail> Topology::rails(const std::string& host_a, const std::string& host_b) const {
  for (const auto* h : {&host_a, &host_b}) {
    const Vertex* v = find(*h);
    if (v == nullptr || v->kind != VertexKind::kHost) {
      throw InvalidArgument("topology: '" + *h + "' is not a host");
    }
  }
  // network id -> the kind of the link that attaches `nic` to it.
  const auto networksOf = [&](const Vertex& nic) {
    std::map<std::string, LinkKind> result;
    for (const Link* l : linksOf(nic.id)) {
      const Vertex& other = vertex(l->a == nic.id ? l->b : l->a);
      if (other.kind == VertexKind::kNetwork) result.emplace(other.id, l->kind);
    }
    return result;
  };
  std::vector<Rail> candidates;
  for (const Vertex* na : vertices(VertexKind::kNic, host_a)) {
    if (!usableNic(*na)) continue;
    const auto nets_a = networksOf(*na);
    for (const Vertex* nb : vertices(VertexKind::kNic, host_b)) {
      if (!usableNic(*nb) || na == nb) continue;
      const auto nets_b = networksOf(*nb);
      std::string ip_network;
      std::string fabric;
      bool roce = false;
      LinkKind ip_kind = LinkKind::kEthernet;
      for (const auto& [id, kind_a] : nets_a) {
        const auto it = nets_b.find(id);
        if (it == nets_b.end()) continue;
        if (id.rfind("ib:", 0) == 0) {
          if (fabric.empty()) fabric = id;
        } else if (ip_network.empty()) {
          ip_network = id;  // canonical (map) order: the same choice on every rank
          ip_kind = kind_a == LinkKind::kRoce ? LinkKind::kEthernet : kind_a;
          roce = kind_a == LinkKind::kRoce && it->second == LinkKind::kRoce;
        }
      }
      if (ip_network.empty() && fabric.empty()) continue;
      Rail rail;
      rail.nic_a = na->id;
      rail.nic_b = nb->id;
      const bool both_rdma = !na->rdma_device.empty() && !nb->rdma_device.empty();
      if (both_rdma && !fabric.empty()) {
        rail.rdma = true;
        rail.kind = LinkKind::kInfiniBand;
        rail.network = fabric;
      } else if (both_rdma && roce) {
        rail.rdma = true;
        rail.kind = LinkKind::kRoce;
        rail.network = ip_network;
      } else if (!ip_network.empty()) {
        rail.kind = ip_kind;
        rail.network = ip_network;
      } else {
        continue;  // a fabric but no RDMA on one side and no IP: nothing can use it
      }
      if (!ip_network.empty()) {
        for (const auto& cidr : na->addresses) {
          if (networkIdOf(cidr) == ip_network) rail.address_a = addressOnly(cidr);
        }
        for (const auto& cidr : nb->addresses) {
          if (networkIdOf(cidr) == ip_network) rail.address_b = addressOnly(cidr);
        }
      }
      const double sa = na->speed_gbps;
      const double sb = nb->speed_gbps;
      rail.nominal_gbps = sa > 0 && sb > 0 ? std::min(sa, sb) : std::max(sa, sb);
      // A probe measurement lives on a direct NIC -- NIC link of the rail's kind.
      const auto measured = links_.find(keyOf(rail.nic_a, rail.nic_b, rail.kind));
      if (measured != links_.end()) {
        rail.measured_gbps = measured->second.measured_gbps;
        rail.latency_us = measured->second.latency_us;
      }
      candidates.push_back(rail);
    }
  }
  const auto better = [](const Rail& x, const Rail& y) {
    if (x.rdma != y.rdma) return x.rdma;
    if (x.gbps() != y.gbps()) return x.gbps() > y.gbps();
    if (x.nic_a != y.nic_a) return naturalLess(x.nic_a, y.nic_a);
    return naturalLess(x.nic_b, y.nic_b);
  };
  std::stable_sort(candidates.begin(), candidates.end(), better);
  // Each NIC in one rail at most: two NICs on one subnet on each side make two rails, not
  // four crossing ones.
  std::set<std::string> used;
  std::vector<Rail> result;
  for (const Rail& rail : candidates) {
    if (used.count(rail.nic_a) != 0 || used.count(rail.nic_b) != 0) continue;
    used.insert(rail.nic_a);
    used.insert(rail.nic_b);
    result.push_back(rail);
  }
  return result;
}

Affinity Topology::affinity(int r) const {
  const RankPlacement& p = rank(r);
  Affinity result;
  result.host = p.host;
  result.numa = p.numa;
  result.gpu = p.gpu;
  const std::string gpu_switch = p.gpu.empty() ? "" : attachmentOf(*this, p.gpu);
  const std::string rank_numa = !p.numa.empty() ? p.numa : numaOfVertex(*this, p.gpu);
  struct Entry {
    int group;
    double speed;
    std::string id;
  };
  std::vector<Entry> entries;
  for (const Vertex* nic : vertices(VertexKind::kNic, p.host)) {
    if (!usableNic(*nic)) continue;
    const std::string attach = attachmentOf(*this, nic->id);
    int group = 2;
    if (!gpu_switch.empty() && attach == gpu_switch &&
        vertex(gpu_switch).kind == VertexKind::kPciSwitch) {
      group = 0;
    } else if (!rank_numa.empty() && numaOfVertex(*this, nic->id) == rank_numa) {
      group = 1;
    }
    entries.push_back({group, nic->speed_gbps, nic->id});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
    if (x.group != y.group) return x.group < y.group;
    if (x.speed != y.speed) return x.speed > y.speed;
    return naturalLess(x.id, y.id);
  });
  for (const auto& e : entries) result.nics.push_back(e.id);
  return result;
}

std::string Topology::numaOf(const std::string& id) const {
  return numaOfVertex(*this, id);
}

Path Topology::path(int a, int b) const {
  const RankPlacement& pa = rank(a);
  const RankPlacement& pb = rank(b);
  Path path;
  const std::string from = anchorOf(pa);
  const std::string to = anchorOf(pb);
  if (a == b) {
    path.transport = PathTransport::kSelf;
    if (!from.empty()) path.vertices = {from};
    return path;
  }
  if (pa.host == pb.host) {
    path.transport = PathTransport::kShm;
    if (from.empty() || to.empty()) return path;  // placement without NUMA/GPU: shm, unknown
    if (!pa.gpu.empty() && !pb.gpu.empty()) {
      const auto nv = links_.find(keyOf(pa.gpu, pb.gpu, LinkKind::kNvLink));
      if (nv != links_.end()) {
        path.transport = PathTransport::kNvLink;
        path.vertices = {pa.gpu, pb.gpu};
        path.links = {LinkKind::kNvLink};
        path.bandwidth_gbps = effective(nv->second);
        return path;
      }
    }
    if (from == to) {
      path.vertices = {from};
      path.links = {LinkKind::kShm};
      return path;
    }
    const HostPath hops = widestInHost(*this, from, to);
    if (!hops.found) {
      path.vertices = {from, to};
      path.links = {LinkKind::kShm};
      return path;
    }
    appendHops(path, hops, false);
    return path;
  }
  const std::vector<Rail> candidates = rails(pa.host, pb.host);
  if (candidates.empty()) {
    throw InvalidArgument("topology: no rail between host '" + pa.host + "' (rank " +
                          std::to_string(a) + ") and host '" + pb.host + "' (rank " +
                          std::to_string(b) + "): no usable NICs on a shared network");
  }
  // Among the rails as good as the best (RDMA-ness and speed), take the one nearest rank a.
  const Rail* chosen = &candidates.front();
  const Affinity near = affinity(a);
  for (const std::string& nic : near.nics) {
    const auto it = std::find_if(candidates.begin(), candidates.end(), [&](const Rail& rail) {
      return rail.nic_a == nic && rail.rdma == candidates.front().rdma &&
             rail.gbps() == candidates.front().gbps();
    });
    if (it != candidates.end()) {
      chosen = &*it;
      break;
    }
  }
  path.transport = chosen->rdma ? PathTransport::kRdma : PathTransport::kTcp;
  path.rail = *chosen;
  if (!from.empty()) appendHops(path, widestInHost(*this, from, chosen->nic_a), false);
  if (path.vertices.empty()) path.vertices.push_back(chosen->nic_a);
  path.vertices.push_back(chosen->network);
  path.links.push_back(chosen->kind);
  path.vertices.push_back(chosen->nic_b);
  path.links.push_back(chosen->kind);
  if (chosen->gbps() > 0 && (path.bandwidth_gbps == 0 || chosen->gbps() < path.bandwidth_gbps)) {
    path.bandwidth_gbps = chosen->gbps();
  }
  if (!to.empty()) {
    HostPath back = widestInHost(*this, to, chosen->nic_b);
    std::reverse(back.vertices.begin(), back.vertices.end());
    std::reverse(back.links.begin(), back.links.end());
    appendHops(path, back, true);
  }
  return path;
}

}  // namespace railshard::topology
