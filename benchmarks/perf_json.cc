#include "benchmarks/perf_json.h"

#include <nlohmann/json.hpp>

#include "base/types.h"

namespace railshard::bench {

void writePerfJson(std::ostream& out, const PerfOptions& options, const PerfRunInfo& info,
                   const std::vector<PerfRow>& rows) {
  // ordered: the file reads in the order written (identification, config, limit, rows).
  using json = nlohmann::ordered_json;
  const bool known = info.limit.gbps > 0;
  json config = {
      {"backend", info.backend},
      {"description", info.description},
      {"ranks", info.ranks},
      {"dtype", std::string(name(options.dtype))},
      {"op", std::string(name(options.op))},
      {"min_bytes", options.min_bytes},
      {"max_bytes", options.max_bytes},
      {"iters", options.iters},
      {"warmup", options.warmup_iters},
      {"check", options.check},
      {"average", options.average},
      {"memory", std::string(memoryName(options.memory))},
  };
  if (options.step_factor > 0) {
    config["step_factor"] = options.step_factor;
  } else {
    config["step_bytes"] = options.step_bytes;
  }
  config["hosts"] = info.hosts.empty() ? json(nullptr) : json(info.hosts);

  json limit = nullptr;
  if (known) {
    limit = {{"gbps", info.limit.gbps},
             {"description", info.limit.description},
             {"source", info.limit_source}};
  }

  json table = json::array();
  size_t wrong = 0;
  double busbw_sum = 0;
  for (const PerfRow& row : rows) {
    json entry = {{"size", row.bytes},
                  {"count", row.count},
                  {"type", std::string(name(options.dtype))},
                  {"redop", std::string(name(options.op))},
                  {"root", -1}};
    for (const auto& [prefix, m] : {std::pair{"oop", row.out_of_place}, {"ip", row.in_place}}) {
      const std::string p = prefix;
      entry[p + "_time_us"] = m.seconds * 1e6;
      entry[p + "_algbw"] = algbwGBps(m, row.bytes);
      entry[p + "_busbw"] = busbwGBps(m, row.bytes, info.ranks);
      entry[p + "_wrong"] = m.wrong;
    }
    const double busbw = busbwGBps(row.in_place, row.bytes, info.ranks);
    entry["efficiency"] = known ? json(efficiency(busbw, info.limit.gbps)) : json(nullptr);
    wrong += row.out_of_place.wrong + row.in_place.wrong;
    busbw_sum += busbw;
    table.push_back(std::move(entry));
  }

  const json document = {
      {"identifier", "railshard allreduce_perf"},
      {"version", info.version},
      {"config", config},
      {"link_limit", limit},
      {"link_limit_unknown_reason", known ? json(nullptr) : json(info.limit.description)},
      {"efficiency_of", "in-place busbw (GB/s) * 8 / link_limit.gbps (Gbit/s)"},
      {"rows", table},
      {"wrong_total", wrong},
      {"avg_busbw", rows.empty() ? 0.0 : busbw_sum / static_cast<double>(rows.size())},
  };
  out << document.dump(2) << "\n";
}

}  // namespace railshard::bench
