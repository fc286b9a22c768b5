#include "launcher/tools/report/report_json.h"

#include <nlohmann/json.hpp>

#include "launcher/tools/report/report_format.h"

namespace railshard::report {

namespace {

using Json = nlohmann::ordered_json;

// Unknown values (negative by convention in Report) become null rather than a fake number.
Json known(double value) {
  return value < 0 ? Json() : Json(value);
}

}  // namespace

std::string renderJson(const Report& report) {
  Json out;
  out["version"] = 1;
  out["dir"] = report.dir;
  out["world_size"] = report.world_size;
  out["ranks_read"] = report.ranks_read;
  out["begin_us"] = report.begin_us;
  out["end_us"] = report.end_us;
  out["link_limit"] = {{"gbps", report.limit.gbps > 0 ? Json(report.limit.gbps) : Json()},
                       {"source", report.limit.source},
                       {"description", report.limit.description}};

  Json& sizes = out["sizes"] = Json::array();
  for (const auto& row : report.sizes) {
    sizes.push_back({{"collective", row.collective},
                     {"size", row.size_class},
                     {"mean_bytes", row.mean_bytes},
                     {"count", row.count},
                     {"ranks", row.ranks},
                     {"time_us", row.time_us},
                     {"algbw_gbs", row.algbw_gbs},
                     {"busbw_gbs", row.has_busbw ? Json(row.busbw_gbs) : Json()},
                     {"efficiency", known(row.efficiency)}});
  }

  Json& rails = out["rails"] = Json::array();
  for (const auto& row : report.rails) {
    rails.push_back({{"rank", row.rank},
                     {"peer", row.peer},
                     {"rail", row.rail},
                     {"bytes", row.bytes},
                     {"bytes_sent", row.bytes_sent},
                     {"pieces", row.pieces},
                     {"busy_us", row.busy_us},
                     {"busy_gbps", row.busy_gbps},
                     {"gbps", row.gbps > 0 ? Json(row.gbps) : Json()},
                     {"utilisation", known(row.utilisation)},
                     {"share", row.share}});
  }

  Json& collectives = out["collectives"] = Json::array();
  for (const auto& c : report.collectives) {
    collectives.push_back({{"generation", c.generation},
                           {"seq", c.seq},
                           {"name", c.name},
                           {"bytes", c.bytes},
                           {"ranks", c.ranks},
                           {"begin_us", c.begin_us},
                           {"time_us", c.time_us},
                           {"last_rank", c.last_rank >= 0 ? Json(c.last_rank) : Json()},
                           {"spread_us", c.spread_us},
                           {"others_waited_us", c.others_waited_us}});
  }

  Json& ranks = out["ranks"] = Json::array();
  for (const auto& row : report.ranks) {
    ranks.push_back({{"rank", row.rank},
                     {"host", row.host},
                     {"collectives", row.collectives},
                     {"collective_us", row.collective_us},
                     {"waited_us", row.waited_us},
                     {"times_last", row.times_last},
                     {"others_waited_us", row.others_waited_us},
                     {"wait_events_us", row.wait_events_us},
                     {"reduce_us", row.reduce_us},
                     {"clock_uncertainty_us", row.clock_uncertainty_us},
                     {"dropped_events", row.dropped_events}});
  }
  Json& slowest = out["slowest"] = Json::array();
  for (int i : report.slowest) slowest.push_back(report.ranks[i].rank);

  Json& dispatch = out["dispatch"];
  dispatch["rank"] = report.dispatch_rank >= 0 ? Json(report.dispatch_rank) : Json();
  dispatch["samples"] = report.dispatch_samples;
  Json& rows = dispatch["rows"] = Json::array();
  for (const auto& row : report.dispatch) {
    Json shares = Json::object();
    for (const auto& [rank, value] : row.shares) shares[rankKey(rank)] = value;
    rows.push_back({{"sample", row.sample}, {"t_us", row.t_us}, {"shares", shares}});
  }

  Json& timeline = out["rail_timeline"];
  timeline["begin_us"] = report.timeline.begin_us;
  timeline["bin_us"] = report.timeline.bin_us;
  Json& series = timeline["series"] = Json::array();
  for (const auto& s : report.timeline.series) {
    series.push_back({{"label", s.label}, {"gbps", s.gbps}});
  }
  out["warnings"] = report.warnings;
  return out.dump(2) + "\n";
}

}  // namespace railshard::report
