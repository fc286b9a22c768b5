#include "launcher/tools/report/report_analysis.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "base/error.h"
#include "core/tracing/link_limit.h"

namespace railshard::report {

namespace {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Collectives in the order nccl-tests lists them; anything else after, by name.
int collectiveOrder(const std::string& name) {
  static const char* kOrder[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                 "reduce",    "alltoall",       "barrier"};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i) {
    if (name == kOrder[i]) return i;
  }
  return static_cast<int>(std::size(kOrder));
}

LimitInfo fromTopology(const topology::Topology& graph, int world_size, std::string source) {
  LimitInfo info;
  info.source = std::move(source);
  try {
    LinkLimit limit;
    if (world_size >= 2 && world_size <= graph.worldSize()) {
      // The traced ranks are the first world_size of the graph's (a shrunk job keeps its
      // launch topology).
      std::vector<int> ring;
      for (int r = 0; r < world_size; ++r) ring.push_back(r);
      limit = tracing::ringLimit(graph, ring);
    } else {
      limit = tracing::ringLimit(graph);
    }
    info.gbps = limit.gbps;
    info.description = limit.description;
  } catch (const Error& error) {
    info.gbps = 0;
    info.description = error.what();
  }
  return info;
}

// Total length of the union of [ts, ts + dur) over `events` (sorted by ts here).
double busyTime(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double busy = 0;
  double cover_end = -std::numeric_limits<double>::infinity();
  for (const auto& [begin, end] : spans) {
    if (end <= cover_end) continue;
    busy += end - std::max(begin, cover_end);
    cover_end = end;
  }
  return busy;
}

void addSpan(Report& report, bool& first, double begin, double end) {
  if (first) {
    report.begin_us = begin;
    report.end_us = end;
    first = false;
  }
  report.begin_us = std::min(report.begin_us, begin);
  report.end_us = std::max(report.end_us, end);
}

void traceSpan(const TraceSet& traces, Report& report) {
  bool first = true;
  for (const auto& trace : traces.ranks) {
    for (const auto& e : trace.collectives) addSpan(report, first, e.ts, e.ts + e.dur);
    for (const auto& e : trace.rail_events) addSpan(report, first, e.ts, e.ts + e.dur);
    for (const auto* spans : {&trace.phases, &trace.waits, &trace.reduces}) {
      for (const auto& e : *spans) addSpan(report, first, e.ts, e.ts + e.dur);
    }
    for (const auto& e : trace.dispatch) addSpan(report, first, e.ts, e.ts);
  }
}

void matchCollectives(const TraceSet& traces, Report& report) {
  struct Entry {
    int rank;
    const CollectiveEvent* event;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<Entry>> by_key;
  for (const auto& trace : traces.ranks) {
    for (const auto& event : trace.collectives) {
      by_key[{event.generation, event.seq}].push_back({trace.rank, &event});
    }
  }
  int disagreements = 0;
  std::string first_disagreement;
  for (const auto& [key, entries] : by_key) {
    CollectiveRecord record;
    record.generation = key.first;
    record.seq = key.second;
    record.name = entries.front().event->name;
    record.bytes = entries.front().event->bytes;
    record.ranks = static_cast<int>(entries.size());
    std::vector<double> durations;
    double first_begin = entries.front().event->ts;
    double last_begin = first_begin;
    for (const auto& entry : entries) {
      const auto& e = *entry.event;
      if (e.name != record.name || e.bytes != record.bytes) {
        if (disagreements++ == 0) {
          first_disagreement =
              "generation " + std::to_string(key.first) + " seq " + std::to_string(key.second) +
              ": rank " + std::to_string(entries.front().rank) + " has " + record.name + " of " +
              std::to_string(record.bytes) + " bytes, rank " + std::to_string(entry.rank) + " " +
              e.name + " of " + std::to_string(e.bytes);
        }
      }
      durations.push_back(e.dur);
      first_begin = std::min(first_begin, e.ts);
      last_begin = std::max(last_begin, e.ts);
    }
    record.begin_us = first_begin;
    record.time_us = median(durations);
    record.spread_us = last_begin - first_begin;
    if (entries.size() >= 2 && record.spread_us > 0) {
      // Ties for last go to the lowest rank: entries are in rank order.
      for (const auto& entry : entries) {
        if (entry.event->ts == last_begin) {
          record.last_rank = entry.rank;
          break;
        }
      }
      for (const auto& entry : entries) record.others_waited_us += last_begin - entry.event->ts;
    }
    report.collectives.push_back(std::move(record));
  }
  if (disagreements > 0) {
    report.warnings.push_back(std::to_string(disagreements) +
                              " collective(s) differ between ranks under one (generation, seq); "
                              "the lowest rank's name and size are used (first: " +
                              first_disagreement + ")");
  }
}

void sizeTable(const TraceSet& traces, Report& report) {
  struct Class {
    std::vector<double> times;
    double bytes = 0;
    int ranks = 0;
  };
  // The communicator size per collective: its `size` arg, else the job's world size.
  std::map<std::pair<int64_t, int64_t>, int> sizes;
  for (const auto& trace : traces.ranks) {
    for (const auto& e : trace.collectives) {
      int& n = sizes[{e.generation, e.seq}];
      n = std::max(n, e.size > 0 ? e.size : traces.world_size);
    }
  }
  std::map<std::tuple<int, std::string, uint64_t>, Class> classes;
  for (const auto& record : report.collectives) {
    Class& c = classes[{collectiveOrder(record.name), record.name, sizeClass(record.bytes)}];
    c.times.push_back(record.time_us);
    c.bytes += static_cast<double>(record.bytes);
    c.ranks = std::max(c.ranks, sizes[{record.generation, record.seq}]);
  }
  for (const auto& [key, c] : classes) {
    SizeRow row;
    row.collective = std::get<1>(key);
    row.size_class = std::get<2>(key);
    row.count = static_cast<int>(c.times.size());
    row.ranks = c.ranks;
    row.mean_bytes = c.bytes / row.count;
    double total = 0;
    for (double t : c.times) total += t;
    row.time_us = total / row.count;
    // bytes / us = MB/s; / 1e3 = GB/s.
    row.algbw_gbs = row.time_us > 0 ? row.mean_bytes / row.time_us / 1e3 : 0;
    const double factor = busBandwidthFactor(row.collective, row.ranks);
    row.has_busbw = factor > 0 && row.time_us > 0;
    if (row.has_busbw) {
      row.busbw_gbs = row.algbw_gbs * factor;
      if (report.limit.gbps > 0) row.efficiency = row.busbw_gbs * 8 / report.limit.gbps;
    }
    report.sizes.push_back(std::move(row));
  }
}

void railTable(const TraceSet& traces, Report& report) {
  const double span = report.spanUs();
  for (const auto& trace : traces.ranks) {
    std::map<std::pair<int, std::string>, std::vector<const RailEvent*>> by_rail;
    // Rails listed in the metadata appear when they carried something by their own count,
    // even if the events were dropped.
    for (const auto& info : trace.rails) by_rail[{info.peer, info.name}];
    for (const auto& e : trace.rail_events) by_rail[{e.peer, e.rail}].push_back(&e);
    uint64_t rank_bytes = 0;
    const size_t first = report.rails.size();
    for (const auto& [key, events] : by_rail) {
      RailRow row;
      row.rank = trace.rank;
      row.peer = key.first;
      row.rail = key.second;
      std::vector<std::pair<double, double>> spans;
      for (const auto* e : events) {
        row.bytes += e->bytes;
        spans.emplace_back(e->ts, e->ts + e->dur);
      }
      row.pieces = static_cast<int>(events.size());
      row.busy_us = busyTime(std::move(spans));
      row.busy_gbps = row.busy_us > 0 ? static_cast<double>(row.bytes) * 8 / row.busy_us / 1e3 : 0;
      for (const auto& info : trace.rails) {
        if (info.peer == row.peer && info.name == row.rail) {
          row.gbps = info.gbps;
          row.bytes_sent = info.bytes_sent;
          if (info.bytes_sent != row.bytes && trace.dropped_events == 0) {
            report.warnings.push_back(
                "rank " + std::to_string(trace.rank) + " " + row.rail + " to rank " +
                std::to_string(row.peer) + ": rail events add up to " + std::to_string(row.bytes) +
                " bytes but railshard.rails[] says " + std::to_string(info.bytes_sent) + " sent");
          }
        }
      }
      // Connections that never carried data (the TCP mesh beside shared memory) would only
      // bury the rails that did.
      if (row.pieces == 0 && row.bytes_sent == 0) continue;
      if (row.gbps > 0 && span > 0) {
        row.utilisation = static_cast<double>(row.bytes) * 8 / (row.gbps * 1e3 * span);
      }
      rank_bytes += row.bytes;
      report.rails.push_back(std::move(row));
    }
    for (size_t i = first; i < report.rails.size(); ++i) {
      auto& row = report.rails[i];
      row.share = rank_bytes > 0 ? static_cast<double>(row.bytes) / rank_bytes : 0;
    }
  }
}

void rankTable(const TraceSet& traces, Report& report) {
  std::map<int, size_t> index;
  for (const auto& trace : traces.ranks) {
    RankRow row;
    row.rank = trace.rank;
    row.host = trace.host;
    row.collectives = static_cast<int>(trace.collectives.size());
    for (const auto& e : trace.collectives) row.collective_us += e.dur;
    for (const auto& e : trace.waits) row.wait_events_us += e.dur;
    for (const auto& e : trace.reduces) row.reduce_us += e.dur;
    row.clock_uncertainty_us = trace.clock.uncertainty_us;
    row.dropped_events = trace.dropped_events;
    report.max_clock_uncertainty_us =
        std::max(report.max_clock_uncertainty_us, trace.clock.uncertainty_us);
    index[trace.rank] = report.ranks.size();
    report.ranks.push_back(std::move(row));
  }
  // Each rank's wait for the last one: needs its own entry time per collective.
  std::map<std::pair<int64_t, int64_t>, double> last_entry;
  for (const auto& record : report.collectives) {
    last_entry[{record.generation, record.seq}] = record.begin_us + record.spread_us;
    if (record.last_rank >= 0) {
      auto& row = report.ranks[index[record.last_rank]];
      ++row.times_last;
      row.others_waited_us += record.others_waited_us;
    }
  }
  for (const auto& trace : traces.ranks) {
    auto& row = report.ranks[index[trace.rank]];
    for (const auto& e : trace.collectives)
      row.waited_us += last_entry[{e.generation, e.seq}] - e.ts;
  }
  for (size_t i = 0; i < report.ranks.size(); ++i) {
    if (report.ranks[i].times_last > 0) report.slowest.push_back(static_cast<int>(i));
  }
  std::stable_sort(report.slowest.begin(), report.slowest.end(), [&](int a, int b) {
    const auto& x = report.ranks[a];
    const auto& y = report.ranks[b];
    return std::tie(y.times_last, y.others_waited_us) < std::tie(x.times_last, x.others_waited_us);
  });
}

void dispatchTable(const TraceSet& traces, const ReportOptions& options, Report& report) {
  for (const auto& trace : traces.ranks) {
    std::vector<const CounterEvent*> samples;
    for (const auto& e : trace.dispatch) {
      if (e.name == "shares") samples.push_back(&e);
    }
    if (samples.empty()) continue;
    // Every rank runs the same deterministic planner; the lowest rank's view stands for all.
    std::stable_sort(samples.begin(), samples.end(),
                     [](const auto* a, const auto* b) { return a->ts < b->ts; });
    report.dispatch_rank = trace.rank;
    report.dispatch_samples = static_cast<int>(samples.size());
    const int n = static_cast<int>(samples.size());
    const int rows = std::max(2, options.dispatch_rows);
    std::vector<int> picks;
    if (n <= rows) {
      for (int i = 0; i < n; ++i) picks.push_back(i);
    } else {
      // Evenly spaced, always keeping the first and the last plan.
      for (int i = 0; i < rows; ++i) {
        picks.push_back(
            static_cast<int>(std::llround(static_cast<double>(i) * (n - 1) / (rows - 1))));
      }
    }
    for (int i : picks) {
      DispatchRow row;
      row.sample = i;
      row.t_us = samples[i]->ts - report.begin_us;
      row.shares = samples[i]->values;
      report.dispatch.push_back(std::move(row));
    }
    return;
  }
}

void timeline(const TraceSet& traces, const ReportOptions& options, Report& report) {
  RailTimeline& line = report.timeline;
  const int bins = std::max(1, options.time_bins);
  line.begin_us = report.begin_us;
  line.bin_us = report.spanUs() / bins;
  if (line.bin_us <= 0 || report.rails.empty()) return;
  // One line per rail while that stays readable; beyond 16, one per rail name over all ranks.
  const bool per_rank = report.rails.size() <= 16;
  std::map<std::string, size_t> series_of;
  for (const auto& row : report.rails) {
    const std::string label = per_rank ? "rank " + std::to_string(row.rank) + " " + row.rail +
                                             " to " + std::to_string(row.peer)
                                       : row.rail + " (all ranks)";
    if (series_of.emplace(label, line.series.size()).second) {
      line.series.push_back({label, std::vector<double>(bins, 0.0)});
    }
  }
  for (const auto& trace : traces.ranks) {
    for (const auto& e : trace.rail_events) {
      const std::string label = per_rank ? "rank " + std::to_string(trace.rank) + " " + e.rail +
                                               " to " + std::to_string(e.peer)
                                         : e.rail + " (all ranks)";
      auto& gbits = line.series[series_of.at(label)].gbps;
      const double bits = static_cast<double>(e.bytes) * 8;
      const double from = (e.ts - line.begin_us) / line.bin_us;
      if (e.dur <= 0) {
        gbits[std::clamp(static_cast<int>(from), 0, bins - 1)] += bits;
        continue;
      }
      // Spread the piece's bits over the bins it overlaps, in proportion to the overlap.
      const double to = from + e.dur / line.bin_us;
      for (int b = std::max(0, static_cast<int>(from)); b < bins && b < to; ++b) {
        const double overlap = std::min<double>(to, b + 1) - std::max<double>(from, b);
        if (overlap > 0) gbits[b] += bits * overlap / (to - from);
      }
    }
  }
  for (auto& series : line.series) {
    for (double& value : series.gbps) value = value / line.bin_us / 1e3;  // bits/us -> Gbit/s
  }
}

}  // namespace

double busBandwidthFactor(const std::string& collective, int n) {
  if (n < 1) return 0;
  const double ranks = n;
  if (collective == "allreduce") return 2 * (ranks - 1) / ranks;
  if (collective == "reduce_scatter" || collective == "allgather" || collective == "alltoall") {
    return (ranks - 1) / ranks;
  }
  if (collective == "broadcast" || collective == "reduce" || collective == "sendrecv") return 1;
  return 0;
}

uint64_t sizeClass(uint64_t bytes) {
  return bytes == 0 ? 0 : std::bit_floor(bytes);
}

LimitInfo resolveLimit(const TraceSet& traces, const ReportOptions& options) {
  if (options.link_gbps > 0) {
    return {options.link_gbps, "--link-gbps", "given on the command line"};
  }
  if (options.topology) {
    return fromTopology(*options.topology, traces.world_size,
                        "--topology " + options.topology_source);
  }
  // The embedded graph first; when it knows no speed (one host of CPU ranks), the limit a
  // rank recorded, which is then the shared-memory copy rate it measured at start-up.
  std::optional<LimitInfo> unknown;
  for (const auto& trace : traces.ranks) {
    if (trace.topology) {
      LimitInfo limit = fromTopology(*trace.topology, traces.world_size,
                                     "topology in rank " + std::to_string(trace.rank) + "'s trace");
      if (limit.gbps > 0) return limit;
      unknown = std::move(limit);
      break;
    }
  }
  for (const auto& trace : traces.ranks) {
    if (trace.link_limit_gbps > 0) {
      return {trace.link_limit_gbps,
              "link_limit in rank " + std::to_string(trace.rank) + "'s trace",
              trace.link_limit_description};
    }
  }
  if (unknown) return *unknown;
  return {0, "", "no topology in the trace; give --topology FILE or --link-gbps X"};
}

Report analyse(const TraceSet& traces, const ReportOptions& options) {
  Report report;
  report.dir = traces.dir;
  report.world_size = traces.world_size;
  report.ranks_read = static_cast<int>(traces.ranks.size());
  report.warnings = traces.warnings;
  report.limit = resolveLimit(traces, options);
  traceSpan(traces, report);
  matchCollectives(traces, report);
  sizeTable(traces, report);
  railTable(traces, report);
  rankTable(traces, report);
  dispatchTable(traces, options, report);
  timeline(traces, options, report);
  return report;
}

}  // namespace railshard::report
