// Topology -> Graphviz. One cluster per host (its NUMA nodes, switches, GPUs, NICs and the
// ranks placed on it), networks as ellipses between the clusters. Excluded NICs are drawn
// grey and dashed so a user sees at a glance why an interface carries no traffic.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/topology/topology.h"

namespace railshard::topology {

namespace {

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string gbps(double value) {
  char text[32];
  if (value >= 10 || value == std::floor(value)) {
    std::snprintf(text, sizeof(text), "%.0f", value);
  } else {
    std::snprintf(text, sizeof(text), "%.2g", value);
  }
  return text;
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1ULL << 30));
  return text;
}

std::string label(const Vertex& v) {
  std::string text = v.name.empty() ? v.id : v.name;
  switch (v.kind) {
    case VertexKind::kNuma:
      if (v.cores != 0) text.append("\n").append(std::to_string(v.cores) + " cores");
      if (!v.cpus.empty()) text.append(" (cpus ").append(v.cpus + ")");
      if (v.memory_bytes != 0) text.append("\n").append(gib(v.memory_bytes));
      break;
    case VertexKind::kGpu:
      text = v.id.substr(v.id.rfind('/') + 1) + "\n" + v.name;
      if (v.memory_bytes != 0) text.append("\n").append(gib(v.memory_bytes));
      break;
    case VertexKind::kNic:
      if (v.speed_gbps != 0) text.append("\n").append(gbps(v.speed_gbps) + " Gb/s");
      if (!v.rdma_device.empty())
        text.append("\n").append(v.rdma_device + ":" + std::to_string(v.rdma_port));
      for (const auto& address : v.addresses) text.append("\n").append(address);
      if (!v.excluded.empty()) text.append("\n(").append(v.excluded + ")");
      break;
    case VertexKind::kPciSwitch:
      text = "PCIe switch\n" + v.pci;
      break;
    default:
      break;
  }
  return text;
}

std::string shape(VertexKind kind) {
  switch (kind) {
    case VertexKind::kNuma:
      return "box3d";
    case VertexKind::kGpu:
      return "box";
    case VertexKind::kNic:
      return "component";
    case VertexKind::kPciSwitch:
      return "diamond";
    case VertexKind::kNetwork:
      return "ellipse";
    default:
      return "box";
  }
}

std::string linkLabel(const Link& l) {
  std::string text(name(l.kind));
  if (l.lanes != 0 && l.kind == LinkKind::kNvLink)
    text.append(" x").append(std::to_string(l.lanes));
  if (l.nominal_gbps != 0) text.append("\n").append(gbps(l.nominal_gbps) + " Gb/s");
  if (l.measured_gbps != 0) text.append("\nmeasured ").append(gbps(l.measured_gbps) + " Gb/s");
  if (l.latency_us != 0) text.append("\n").append(gbps(l.latency_us) + " us");
  return text;
}

}  // namespace

std::string Topology::toDot() const {
  std::ostringstream out;
  out << "graph railshard {\n"
      << "  graph [fontname=\"Helvetica\", fontsize=11, compound=true];\n"
      << "  node [fontname=\"Helvetica\", fontsize=10];\n"
      << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  int cluster = 0;
  for (const std::string& host : hosts()) {
    const Vertex& h = vertex(host);
    std::string title = h.name.empty() ? h.id : h.name;
    if (h.cores != 0) title.append("\n").append(std::to_string(h.cores) + " cores");
    if (h.threads != 0) title.append(", ").append(std::to_string(h.threads) + " threads");
    if (h.memory_bytes != 0) title.append(", ").append(gib(h.memory_bytes));
    out << "  subgraph cluster_" << cluster++ << " {\n"
        << "    label=" << quote(title) << "; style=rounded;\n";
    for (const Vertex* v : vertices()) {
      if (v->host != host || v->kind == VertexKind::kHost) continue;
      out << "    " << quote(v->id) << " [shape=" << shape(v->kind)
          << ", label=" << quote(label(*v));
      if (!v->excluded.empty()) out << ", style=dashed, color=grey50, fontcolor=grey50";
      out << "];\n";
    }
    for (const int r : ranksOn(host)) {
      const RankPlacement& p = rank(r);
      const std::string id = "rank " + std::to_string(r);
      out << "    " << quote(id) << " [shape=circle, style=filled, fillcolor=lightyellow];\n";
      const std::string& anchor = !p.gpu.empty() ? p.gpu : p.numa;
      if (!anchor.empty())
        out << "    " << quote(id) << " -- " << quote(anchor) << " [style=dotted];\n";
    }
    out << "  }\n";
  }
  for (const Vertex* v : vertices(VertexKind::kNetwork)) {
    out << "  " << quote(v->id) << " [shape=ellipse, label=" << quote(label(*v)) << "];\n";
  }
  for (const Link* l : links()) {
    out << "  " << quote(l->a) << " -- " << quote(l->b) << " [label=" << quote(linkLabel(*l));
    if (l->kind == LinkKind::kNvLink) out << ", color=darkgreen, penwidth=2";
    if (l->measured_gbps != 0) out << ", color=blue";
    out << "];\n";
  }
  out << "}\n";
  return out.str();
}

}  // namespace railshard::topology
