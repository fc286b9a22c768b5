#include "core/tracing/trace_merge.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "core/tracing/trace_file.h"

namespace railshard::tracing {

namespace {

// ordered_json keeps each event's keys in the writer's order, so a merged event reads like
// the per-rank one it came from.
using Json = nlohmann::ordered_json;

struct RankFile {
  int rank = -1;
  Json root;
};

// Only the shape merging depends on is checked here; railshard-report's reader checks every
// field. Returns the problem, empty when the file is usable.
std::string load(const std::string& path, int named_rank, RankFile& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot be read";
  std::stringstream text;
  text << in.rdbuf();
  try {
    out.root = Json::parse(text.str());
  } catch (const Json::parse_error& error) {
    return std::string("not valid JSON (") + error.what() + ")";
  }
  if (!out.root.is_object()) return "not a JSON object";
  const auto events = out.root.find("traceEvents");
  if (events == out.root.end() || !events->is_array()) return "no 'traceEvents' array";
  const auto meta = out.root.find("railshard");
  if (meta == out.root.end() || !meta->is_object()) return "no 'railshard' metadata object";
  const auto rank = meta->find("rank");
  if (rank == meta->end() || !rank->is_number_integer()) return "railshard.rank is missing";
  out.rank = rank->get<int>();
  if (out.rank != named_rank) {
    return "railshard.rank is " + std::to_string(out.rank) + " but the file name says rank " +
           std::to_string(named_rank);
  }
  return {};
}

}  // namespace

std::string mergeTraces(const std::string& dir, MergeResult* result) {
  MergeResult local;
  MergeResult& merged = result != nullptr ? *result : local;
  merged = MergeResult{};

  Json events = Json::array();
  Json ranks = Json::array();
  Json topology;  // null unless some rank has one
  std::vector<bool> present;
  for (const auto& path : listRankFiles(dir)) {
    const int named = rankOfFileName(std::filesystem::path(path).filename().string());
    RankFile file;
    const std::string problem = load(path, named, file);
    if (!problem.empty()) {
      merged.warnings.push_back("skipped " + path + ": " + problem);
      continue;
    }
    Json& meta = file.root["railshard"];
    const auto world = meta.find("world_size");
    if (world != meta.end() && world->is_number_integer()) {
      merged.world_size = std::max(merged.world_size, world->get<int>());
    }
    if (static_cast<int>(present.size()) <= file.rank) present.resize(file.rank + 1);
    present[file.rank] = true;
    const auto topo = meta.find("topology");
    if (topo != meta.end()) {
      // Files come in rank order: the first topology is the lowest rank's (rank 0's).
      if (topology.is_null()) topology = std::move(*topo);
      meta.erase("topology");
    }
    ranks.push_back(std::move(meta));
    for (auto& event : file.root["traceEvents"]) events.push_back(std::move(event));
    ++merged.ranks;
  }
  if (merged.ranks == 0) {
    std::string why = "no usable railshard-trace-rank<R>.json file in '" + dir + "'";
    for (const auto& warning : merged.warnings) why += "; " + warning;
    throw ConfigError(why);
  }
  std::string missing;
  int missing_count = 0;
  for (int rank = 0; rank < merged.world_size; ++rank) {
    if (rank < static_cast<int>(present.size()) && present[rank]) continue;
    if (++missing_count <= 8) missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
  }
  if (missing_count > 0) {
    merged.warnings.push_back(std::to_string(missing_count) + " of " +
                              std::to_string(merged.world_size) +
                              " ranks are not in the merged trace (rank " + missing +
                              (missing_count > 8 ? ", ..." : "") + ")");
  }
  merged.events = events.size();

  Json out = Json::object();
  out["displayTimeUnit"] = "ns";
  out["traceEvents"] = std::move(events);
  Json& meta = out["railshard"];
  meta["version"] = 1;
  meta["ranks"] = std::move(ranks);
  meta["topology"] = std::move(topology);
  meta["warnings"] = merged.warnings;
  return out.dump() + "\n";
}

MergeResult writeMergedTrace(const std::string& dir, const std::string& out_path) {
  MergeResult result;
  const std::string text = mergeTraces(dir, &result);
  const std::string temporary = out_path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      std::remove(temporary.c_str());
      throw ConfigError("cannot write merged trace '" + out_path + "'");
    }
  }
  if (std::rename(temporary.c_str(), out_path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw ConfigError("cannot write merged trace '" + out_path + "' (rename failed)");
  }
  return result;
}

}  // namespace railshard::tracing
