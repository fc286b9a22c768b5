#include "core/tracing/trace_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"

namespace railshard::tracing {

namespace {

using Json = nlohmann::json;

constexpr const char* kPrefix = "railshard-trace-rank";
constexpr const char* kSuffix = ".json";

// Field access with errors that say where: "<file>: traceEvents[12] (rail send): field 'bytes'
// must be a non-negative integer". Missing optional fields take the fallback.
class Fields {
 public:
  Fields(const Json& object, std::string where) : object_(object), where_(std::move(where)) {
    if (!object_.is_object()) fail("must be an object");
  }

  [[noreturn]] void fail(const std::string& why) const { throw ConfigError(where_ + ": " + why); }

  const Json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  const Json& need(const char* key) const {
    const Json* value = find(key);
    if (value == nullptr) fail(std::string("field '") + key + "' is missing");
    return *value;
  }
  double number(const char* key, bool required, double fallback = 0) const {
    const Json* value = required ? &need(key) : find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number()) fail(std::string("field '") + key + "' must be a number");
    const double v = value->get<double>();
    if (!std::isfinite(v)) fail(std::string("field '") + key + "' must be finite");
    return v;
  }
  double nonNegative(const char* key, bool required, double fallback = 0) const {
    const double v = number(key, required, fallback);
    if (v < 0) fail(std::string("field '") + key + "' must not be negative");
    return v;
  }
  int64_t integer(const char* key, bool required, int64_t fallback = 0) const {
    const Json* value = required ? &need(key) : find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number_integer()) fail(std::string("field '") + key + "' must be an integer");
    if (value->is_number_unsigned()) {
      const auto v = value->get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) fail(std::string("field '") + key + "' too large");
      return static_cast<int64_t>(v);
    }
    return value->get<int64_t>();
  }
  uint64_t count(const char* key, bool required) const {
    const Json* value = required ? &need(key) : find(key);
    if (value == nullptr) return 0;
    if (!value->is_number_unsigned() &&
        !(value->is_number_integer() && value->get<int64_t>() >= 0)) {
      fail(std::string("field '") + key + "' must be a non-negative integer");
    }
    return value->get<uint64_t>();
  }
  int rank(const char* key, bool required, int fallback = -1) const {
    const int64_t v = integer(key, required, fallback);
    if (v < -1 || v > (1 << 24)) fail(std::string("field '") + key + "' is out of range");
    return static_cast<int>(v);
  }
  std::string string(const char* key, bool required) const {
    const Json* value = required ? &need(key) : find(key);
    if (value == nullptr) return {};
    if (!value->is_string()) fail(std::string("field '") + key + "' must be a string");
    return value->get<std::string>();
  }
  Fields object(const char* key) const { return Fields(need(key), where_ + "." + key); }

 private:
  const Json& object_;
  std::string where_;
};

void readMetadata(const Json& meta, const std::string& what, RankTrace& trace) {
  const Fields m(meta, what + ": railshard");
  trace.version = static_cast<int>(m.integer("version", true));
  if (trace.version != 1) {
    m.fail("version " + std::to_string(trace.version) + " is not supported (this reads 1)");
  }
  trace.rank = m.rank("rank", true);
  trace.world_size = m.rank("world_size", true);
  if (trace.rank < 0 || trace.world_size < 1 || trace.rank >= trace.world_size) {
    m.fail("rank " + std::to_string(trace.rank) + " is not within world_size " +
           std::to_string(trace.world_size));
  }
  trace.host = m.string("host", false);
  trace.os_pid = m.integer("os_pid", false);
  if (m.find("clock") != nullptr) {
    const Fields clock = m.object("clock");
    trace.clock.offset_us = clock.number("offset_us", false);
    trace.clock.uncertainty_us = clock.nonNegative("uncertainty_us", false);
    trace.clock.aligned = clock.string("aligned", false);
  }
  trace.events = m.count("events", false);
  trace.dropped_events = m.count("dropped_events", false);
  if (const Json* rails = m.find("rails")) {
    if (!rails->is_array()) m.fail("field 'rails' must be an array");
    for (size_t i = 0; i < rails->size(); ++i) {
      const Fields r((*rails)[i], what + ": railshard.rails[" + std::to_string(i) + "]");
      RailInfo info;
      info.peer = r.rank("peer", true);
      info.name = r.string("name", true);
      info.local = r.string("local", false);
      info.remote = r.string("remote", false);
      info.gbps = r.nonNegative("gbps", false);
      info.bytes_sent = r.count("bytes_sent", false);
      trace.rails.push_back(std::move(info));
    }
  }
  if (m.find("link_limit") != nullptr) {
    const Fields limit = m.object("link_limit");
    trace.link_limit_gbps = limit.nonNegative("gbps", false);
    trace.link_limit_description = limit.string("description", false);
  }
  if (const Json* topology = m.find("topology")) {
    trace.topology = topology::Topology::fromJson(topology->dump(), what + ": railshard.topology");
  }
}

void readEvent(const Json& event, const std::string& where, RankTrace& trace) {
  const Fields e(event, where);
  const std::string ph = e.string("ph", true);
  const std::string cat = e.string("cat", false);
  if (ph == "X" && (cat == "collective" || cat == "phase" || cat == "wait" || cat == "reduce" ||
                    cat == "rail")) {
    const std::string name = e.string("name", true);
    const double ts = e.number("ts", true);
    const double dur = e.nonNegative("dur", true);
    static const Json kNoArgs = Json::object();
    const Json* args_json = e.find("args");
    const Fields args(args_json != nullptr ? *args_json : kNoArgs, where + ".args");
    if (cat == "collective") {
      CollectiveEvent c;
      c.name = name;
      c.ts = ts;
      c.dur = dur;
      c.seq = args.integer("seq", true);
      c.generation = args.integer("generation", false);
      c.bytes = args.count("bytes", true);
      c.count = args.count("count", false);
      c.size = args.rank("size", false, 0);
      c.root = args.rank("root", false);
      c.dtype = args.string("dtype", false);
      c.op = args.string("op", false);
      c.algorithm = args.string("algorithm", false);
      trace.collectives.push_back(std::move(c));
    } else if (cat == "rail") {
      RailEvent r;
      r.ts = ts;
      r.dur = dur;
      r.tid = static_cast<int>(e.integer("tid", false));
      r.peer = args.rank("peer", true);
      r.bytes = args.count("bytes", true);
      r.rail = args.string("rail", true);
      trace.rail_events.push_back(std::move(r));
    } else {
      SpanEvent s;
      s.name = name;
      s.ts = ts;
      s.dur = dur;
      s.seq = args.integer("seq", false, -1);
      s.peer = args.rank("peer", false);
      s.bytes = args.count("bytes", false);
      auto& into = cat == "phase" ? trace.phases : cat == "wait" ? trace.waits : trace.reduces;
      into.push_back(std::move(s));
    }
  } else if (ph == "C" && cat == "dispatch") {
    CounterEvent c;
    c.name = e.string("name", true);
    c.ts = e.number("ts", true);
    const Json& args = e.need("args");
    if (!args.is_object()) e.fail("field 'args' must be an object");
    for (const auto& [key, value] : args.items()) {
      // "r<rank>": the writer's per-rank series; anything else is not ours to interpret.
      if (key.size() < 2 || key[0] != 'r' || !std::all_of(key.begin() + 1, key.end(), [](char ch) {
            return ch >= '0' && ch <= '9';
          })) {
        continue;
      }
      if (!value.is_number()) e.fail("args." + key + " must be a number");
      c.values[std::stoi(key.substr(1))] = value.get<double>();
    }
    trace.dispatch.push_back(std::move(c));
  }
}

}  // namespace

std::string rankFileName(int rank) {
  return std::string(kPrefix) + std::to_string(rank) + kSuffix;
}

int rankOfFileName(const std::string& name) {
  const std::string prefix = kPrefix;
  const std::string suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 8 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoi(digits);
}

std::vector<std::string> listRankFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw ConfigError("trace directory '" + dir + "' does not exist or is not a directory");
  }
  std::vector<std::pair<int, std::string>> found;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const int rank = rankOfFileName(it->path().filename().string());
    if (rank >= 0) found.emplace_back(rank, it->path().string());
  }
  if (error) throw ConfigError("cannot list trace directory '" + dir + "': " + error.message());
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [rank, path] : found) paths.push_back(std::move(path));
  return paths;
}

RankTrace parseTrace(const std::string& text, const std::string& what) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::parse_error& error) {
    throw ConfigError(what + ": not valid JSON (" + error.what() + ")");
  }
  const Fields top(root, what);
  RankTrace trace;
  trace.path = what;
  readMetadata(top.need("railshard"), what, trace);
  const Json& events = top.need("traceEvents");
  if (!events.is_array()) top.fail("field 'traceEvents' must be an array");
  for (size_t i = 0; i < events.size(); ++i) {
    const Json& event = events[i];
    std::string label;
    if (event.is_object()) {
      const auto cat = event.find("cat");
      const auto name = event.find("name");
      if (cat != event.end() && cat->is_string()) label += cat->get<std::string>();
      if (name != event.end() && name->is_string()) label += " " + name->get<std::string>();
    }
    readEvent(event,
              what + ": traceEvents[" + std::to_string(i) + "]" +
                  (label.empty() ? "" : " (" + label + ")"),
              trace);
  }
  return trace;
}

RankTrace readTraceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read trace file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return parseTrace(text.str(), path);
}

TraceSet readTraceDir(const std::string& dir) {
  TraceSet set;
  set.dir = dir;
  const auto paths = listRankFiles(dir);
  if (paths.empty()) {
    throw ConfigError("trace directory '" + dir + "' has no " + kPrefix + "<R>" + kSuffix +
                      " files (was the job run with RAILSHARD_TRACE=" + dir + "?)");
  }
  for (const auto& path : paths) {
    RankTrace trace = readTraceFile(path);
    const int named = rankOfFileName(std::filesystem::path(path).filename().string());
    if (named != trace.rank) {
      throw ConfigError(path + ": railshard.rank is " + std::to_string(trace.rank) +
                        " but the file name says rank " + std::to_string(named));
    }
    set.world_size = std::max(set.world_size, trace.world_size);
    if (trace.dropped_events > 0) {
      set.warnings.push_back("rank " + std::to_string(trace.rank) + " dropped " +
                             std::to_string(trace.dropped_events) +
                             " events (buffer full; raise RAILSHARD_TRACE_EVENTS): its oldest "
                             "collectives are missing");
    }
    set.ranks.push_back(std::move(trace));
  }
  std::string missing;
  int missing_count = 0;
  for (int rank = 0, i = 0; rank < set.world_size; ++rank) {
    while (i < static_cast<int>(set.ranks.size()) && set.ranks[i].rank < rank) ++i;
    if (i < static_cast<int>(set.ranks.size()) && set.ranks[i].rank == rank) continue;
    if (++missing_count <= 8) missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
  }
  if (missing_count > 0) {
    if (missing_count > 8) missing += ", ...";
    set.warnings.push_back(std::to_string(missing_count) + " of " + std::to_string(set.world_size) +
                           " ranks have no trace file in '" + dir + "' (rank " + missing + ")");
  }
  return set;
}

}  // namespace railshard::tracing
