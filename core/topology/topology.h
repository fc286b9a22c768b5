#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/topology/elements.h"

namespace railshard::topology {

// The cluster as a graph: hosts with their NUMA nodes, PCIe switches, GPUs and NICs, the
// networks that join NICs, the links between all of these (nominal and, when probed, measured
// bandwidth), and where each rank runs. A plain value: copyable, comparable, with one
// canonical order, so the same cluster always serialises to the same bytes and hash.
//
// Discovery (launcher/discovery) fills one per host, merge() joins them, a user file can
// replace the whole thing (RAILSHARD_TOPO_FILE), and everything above only reads it.
class Topology {
 public:
  static constexpr int kSchemaVersion = 1;

  // ---- building ----
  // InvalidArgument when the id is empty, taken, or a non-network vertex has no host.
  void addVertex(Vertex vertex);
  // InvalidArgument when an endpoint is unknown, a == b, or the same pair already has a link
  // of this kind. The endpoints are stored in canonical order.
  void addLink(Link link);
  // Replaces a link's measurement (the pair and kind must exist).
  void setMeasurement(const std::string& a, const std::string& b, LinkKind kind,
                      double measured_gbps, double latency_us);
  // InvalidArgument unless ranks are 0..n-1 exactly once, each on an existing host, with
  // numa/gpu (when set) vertices of that host.
  void setRanks(std::vector<RankPlacement> ranks);
  // Renames host `from` (and the "<from>/..." ids of its vertices) to `to`; used when two
  // machines report the same host name. InvalidArgument when `to` is taken.
  void renameHost(const std::string& from, const std::string& to);
  // Adds every vertex and link of `other`. Vertices present in both must be equal (networks
  // are shared between hosts); links likewise. Ranks are not merged.
  void merge(const Topology& other);

  // ---- reading ----
  bool empty() const { return vertices_.empty(); }
  const Vertex* find(const std::string& id) const;
  // InvalidArgument naming the id when absent.
  const Vertex& vertex(const std::string& id) const;
  // All vertices / links / ranks in canonical order.
  std::vector<const Vertex*> vertices() const;
  std::vector<const Vertex*> vertices(VertexKind kind, const std::string& host = "") const;
  std::vector<const Link*> links() const;
  std::vector<const Link*> linksOf(const std::string& id) const;
  const std::vector<RankPlacement>& ranks() const { return ranks_; }
  int worldSize() const { return static_cast<int>(ranks_.size()); }
  // InvalidArgument when out of range.
  const RankPlacement& rank(int r) const;
  std::vector<std::string> hosts() const;
  std::vector<int> ranksOn(const std::string& host) const;

  // ---- queries (core/topology/queries.cc) ----
  // The best path between two ranks: the widest (largest narrowest-link bandwidth), then
  // the shortest; inside a host it never leaves the host, between hosts it crosses one rail.
  Path path(int a, int b) const;
  // Rails between two hosts: NIC pairs on a shared network, each NIC in at most one rail,
  // RDMA before IP, then fastest first. Excluded and down NICs take no part.
  std::vector<Rail> rails(const std::string& host_a, const std::string& host_b) const;
  Affinity affinity(int rank) const;
  // The NUMA node a vertex belongs to (a device through its PCIe attachment); "" if none.
  std::string numaOf(const std::string& id) const;

  // ---- serialisation (core/topology/topology_json.cc, topology_dot.cc) ----
  // Canonical JSON, two-space indented, newline-terminated. fromJson(toJson(t)) == t and
  // toJson(fromJson(s)) == s for any s that toJson produced.
  std::string toJson() const;
  // ConfigError naming `what` (a file name) and the offending field.
  static Topology fromJson(const std::string& text, const std::string& what);
  // Graphviz: one cluster per host, networks between them, link labels with speeds.
  std::string toDot() const;
  // 16 hex digits identifying the content (FNV-1a over the canonical JSON).
  std::string hash() const;

  // Equal content; the indexes below are derived and not compared.
  bool operator==(const Topology& other) const {
    return vertices_ == other.vertices_ && links_ == other.links_ && ranks_ == other.ranks_;
  }

 private:
  using LinkKey = std::tuple<std::string, std::string, LinkKind>;
  static LinkKey keyOf(const std::string& a, const std::string& b, LinkKind kind);

  void index(const Vertex& vertex);
  void index(const LinkKey& key);
  void reindex();

  std::map<std::string, Vertex> vertices_;
  std::map<LinkKey, Link> links_;
  std::vector<RankPlacement> ranks_;
  // Indexes kept by every mutator, so that queries on a cluster of hundreds of hosts look at
  // one host's vertices and one vertex's links instead of scanning the whole graph.
  std::map<std::string, std::vector<std::string>> members_;  // host ("" = networks) -> ids
  std::map<std::string, std::vector<LinkKey>> adjacency_;    // vertex id -> its links
};

// Natural order on ids: digit runs compare as numbers, so "gpu2" < "gpu10".
bool naturalLess(const std::string& a, const std::string& b);

}  // namespace railshard::topology
