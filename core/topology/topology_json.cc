// Topology <-> JSON. The schema is versioned ("version": 1) and strict: an unknown field is an
// error rather than silently ignored, so a typo in a hand-written RAILSHARD_TOPO_FILE is
// reported instead of quietly changing the rail plan. Fields at their default value are left
// out, which is what makes the output canonical: one graph, one byte string.
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/fnv.h"
#include "core/topology/topology.h"

namespace railshard::topology {

namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kFormat = "railshard-topology";

Json vertexToJson(const Vertex& v) {
  Json j;
  j["id"] = v.id;
  j["kind"] = std::string(name(v.kind));
  if (v.kind != VertexKind::kNetwork) j["host"] = v.host;
  j["name"] = v.name;
  if (v.index >= 0) j["index"] = v.index;
  if (v.cores != 0) j["cores"] = v.cores;
  if (v.threads != 0) j["threads"] = v.threads;
  if (!v.cpus.empty()) j["cpus"] = v.cpus;
  if (v.memory_bytes != 0) j["memory_bytes"] = v.memory_bytes;
  if (!v.pci.empty()) j["pci"] = v.pci;
  if (v.link_layer != LinkLayer::kUnknown) j["link_layer"] = std::string(name(v.link_layer));
  if (v.speed_gbps != 0) j["speed_gbps"] = v.speed_gbps;
  if (v.mtu != 0) j["mtu"] = v.mtu;
  if (v.kind == VertexKind::kNic) j["up"] = v.up;
  if (!v.addresses.empty()) j["addresses"] = v.addresses;
  if (!v.rdma_device.empty()) j["rdma_device"] = v.rdma_device;
  if (v.rdma_port != 0) j["rdma_port"] = v.rdma_port;
  if (!v.excluded.empty()) j["excluded"] = v.excluded;
  return j;
}

Json linkToJson(const Link& l) {
  Json j;
  j["a"] = l.a;
  j["b"] = l.b;
  j["kind"] = std::string(name(l.kind));
  if (l.nominal_gbps != 0) j["nominal_gbps"] = l.nominal_gbps;
  if (l.lanes != 0) j["lanes"] = l.lanes;
  if (l.measured_gbps != 0) j["measured_gbps"] = l.measured_gbps;
  if (l.latency_us != 0) j["latency_us"] = l.latency_us;
  return j;
}

Json rankToJson(const RankPlacement& r) {
  Json j;
  j["rank"] = r.rank;
  j["host"] = r.host;
  j["local_rank"] = r.local_rank;
  if (!r.numa.empty()) j["numa"] = r.numa;
  if (!r.gpu.empty()) j["gpu"] = r.gpu;
  return j;
}

// Reads one object's fields with errors that say where: "<what>: vertices[3] (gpu0): field
// 'speed_gbps' must be a number".
class FieldReader {
 public:
  FieldReader(const Json& object, std::string where) : object_(object), where_(std::move(where)) {
    if (!object_.is_object()) fail("must be an object");
  }

  [[noreturn]] void fail(const std::string& why) const { throw ConfigError(where_ + ": " + why); }

  const Json* field(const char* key) {
    seen_.insert(key);
    const auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }
  std::string string(const char* key, bool required) {
    const Json* value = field(key);
    if (value == nullptr) {
      if (required) fail(std::string("field '") + key + "' is missing");
      return {};
    }
    if (!value->is_string()) fail(std::string("field '") + key + "' must be a string");
    return value->get<std::string>();
  }
  int64_t integer(const char* key, int64_t fallback, int64_t min, int64_t max, bool required) {
    const Json* value = field(key);
    if (value == nullptr) {
      if (required) fail(std::string("field '") + key + "' is missing");
      return fallback;
    }
    if (!value->is_number_integer()) fail(std::string("field '") + key + "' must be an integer");
    const auto v = value->is_number_unsigned() ? static_cast<int64_t>(value->get<uint64_t>())
                                               : value->get<int64_t>();
    if (v < min || v > max) {
      fail(std::string("field '") + key + "' = " + std::to_string(v) + " is out of range");
    }
    return v;
  }
  uint64_t unsignedInteger(const char* key) {
    const Json* value = field(key);
    if (value == nullptr) return 0;
    if (!value->is_number_unsigned()) {
      fail(std::string("field '") + key + "' must be a non-negative integer");
    }
    return value->get<uint64_t>();
  }
  double number(const char* key) {
    const Json* value = field(key);
    if (value == nullptr) return 0;
    if (!value->is_number()) fail(std::string("field '") + key + "' must be a number");
    const double v = value->get<double>();
    if (!(v >= 0)) fail(std::string("field '") + key + "' must not be negative");
    return v;
  }
  bool boolean(const char* key) {
    const Json* value = field(key);
    if (value == nullptr) return false;
    if (!value->is_boolean()) fail(std::string("field '") + key + "' must be true or false");
    return value->get<bool>();
  }
  std::vector<std::string> strings(const char* key) {
    const Json* value = field(key);
    std::vector<std::string> result;
    if (value == nullptr) return result;
    if (!value->is_array()) fail(std::string("field '") + key + "' must be an array of strings");
    for (const auto& item : *value) {
      if (!item.is_string()) fail(std::string("field '") + key + "' must hold only strings");
      result.push_back(item.get<std::string>());
    }
    return result;
  }
  // Unknown fields are errors: they are almost always typos in a hand-written file.
  void finish() const {
    for (const auto& [key, value] : object_.items()) {
      if (seen_.count(key) == 0) fail("unknown field '" + key + "'");
    }
  }

 private:
  const Json& object_;
  std::string where_;
  std::set<std::string> seen_;
};

template <typename Enum>
Enum parseEnum(FieldReader& reader, const char* key, const std::string& text, const char* choices) {
  Enum value{};
  if (!parse(text, value)) {
    reader.fail(std::string("field '") + key + "' = '" + text + "' is not one of " + choices);
  }
  return value;
}

Vertex vertexFromJson(const Json& j, const std::string& where) {
  FieldReader r(j, where);
  Vertex v;
  v.id = r.string("id", true);
  v.kind = parseEnum<VertexKind>(r, "kind", r.string("kind", true),
                                 "host, numa, pci_switch, gpu, nic, network");
  v.host = r.string("host", v.kind != VertexKind::kNetwork);
  v.name = r.string("name", false);
  v.index = static_cast<int>(r.integer("index", -1, -1, 1 << 20, false));
  v.cores = static_cast<int>(r.integer("cores", 0, 0, 1 << 24, false));
  v.threads = static_cast<int>(r.integer("threads", 0, 0, 1 << 24, false));
  v.cpus = r.string("cpus", false);
  v.memory_bytes = r.unsignedInteger("memory_bytes");
  v.pci = r.string("pci", false);
  const std::string layer = r.string("link_layer", false);
  if (!layer.empty()) {
    v.link_layer =
        parseEnum<LinkLayer>(r, "link_layer", layer, "unknown, ethernet, infiniband, loopback");
  }
  v.speed_gbps = r.number("speed_gbps");
  v.mtu = static_cast<int>(r.integer("mtu", 0, 0, 1 << 20, false));
  v.up = r.boolean("up");
  v.addresses = r.strings("addresses");
  v.rdma_device = r.string("rdma_device", false);
  v.rdma_port = static_cast<int>(r.integer("rdma_port", 0, 0, 255, false));
  v.excluded = r.string("excluded", false);
  r.finish();
  return v;
}

Link linkFromJson(const Json& j, const std::string& where) {
  FieldReader r(j, where);
  Link l;
  l.a = r.string("a", true);
  l.b = r.string("b", true);
  l.kind = parseEnum<LinkKind>(
      r, "kind", r.string("kind", true),
      "nvlink, pcie, cpu_interconnect, ethernet, infiniband, roce, loopback, shm, virtual");
  l.nominal_gbps = r.number("nominal_gbps");
  l.lanes = static_cast<int>(r.integer("lanes", 0, 0, 1024, false));
  l.measured_gbps = r.number("measured_gbps");
  l.latency_us = r.number("latency_us");
  r.finish();
  return l;
}

RankPlacement rankFromJson(const Json& j, const std::string& where) {
  FieldReader r(j, where);
  RankPlacement p;
  p.rank = static_cast<int>(r.integer("rank", 0, 0, 1 << 24, true));
  p.host = r.string("host", true);
  p.local_rank = static_cast<int>(r.integer("local_rank", 0, 0, 1 << 24, true));
  p.numa = r.string("numa", false);
  p.gpu = r.string("gpu", false);
  r.finish();
  return p;
}

const Json& arrayField(FieldReader& reader, const char* key) {
  static const Json kEmpty = Json::array();
  const Json* value = reader.field(key);
  if (value == nullptr) return kEmpty;
  if (!value->is_array()) reader.fail(std::string("field '") + key + "' must be an array");
  return *value;
}

}  // namespace

std::string Topology::toJson() const {
  Json root;
  root["format"] = kFormat;
  root["version"] = kSchemaVersion;
  root["vertices"] = Json::array();
  for (const Vertex* v : vertices()) root["vertices"].push_back(vertexToJson(*v));
  root["links"] = Json::array();
  for (const Link* l : links()) root["links"].push_back(linkToJson(*l));
  root["ranks"] = Json::array();
  for (const auto& r : ranks_) root["ranks"].push_back(rankToJson(r));
  return root.dump(2) + "\n";
}

Topology Topology::fromJson(const std::string& text, const std::string& what) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(what + ": not valid JSON: " + e.what());
  }
  FieldReader reader(root, what);
  const std::string format = reader.string("format", true);
  if (format != kFormat) {
    reader.fail("field 'format' = '" + format + "', expected '" + kFormat + "'");
  }
  const int64_t version = reader.integer("version", 0, 1, 1 << 20, true);
  if (version > kSchemaVersion) {
    reader.fail("schema version " + std::to_string(version) +
                " is newer than this railshard reads (" + std::to_string(kSchemaVersion) + ")");
  }
  Topology topology;
  const auto wrap = [&](const std::string& where, auto&& body) {
    try {
      body();
    } catch (const InvalidArgument& e) {
      throw ConfigError(where + ": " + e.what());
    }
  };
  const Json& vertices = arrayField(reader, "vertices");
  for (size_t i = 0; i < vertices.size(); ++i) {
    const std::string where = what + ": vertices[" + std::to_string(i) + "]";
    Vertex v = vertexFromJson(vertices[i], where);
    wrap(where, [&] { topology.addVertex(std::move(v)); });
  }
  const Json& links = arrayField(reader, "links");
  for (size_t i = 0; i < links.size(); ++i) {
    const std::string where = what + ": links[" + std::to_string(i) + "]";
    Link l = linkFromJson(links[i], where);
    wrap(where, [&] { topology.addLink(std::move(l)); });
  }
  const Json& ranks = arrayField(reader, "ranks");
  std::vector<RankPlacement> placements;
  for (size_t i = 0; i < ranks.size(); ++i) {
    placements.push_back(rankFromJson(ranks[i], what + ": ranks[" + std::to_string(i) + "]"));
  }
  wrap(what + ": ranks", [&] { topology.setRanks(std::move(placements)); });
  reader.finish();
  return topology;
}

std::string Topology::hash() const {
  // Ranks compare it to catch disagreeing pictures (different library versions, different
  // discovery results).
  const uint64_t h = Fnv1a().add(toJson()).value();
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, h);
  return text;
}

}  // namespace railshard::topology
