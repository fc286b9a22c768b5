#include "launcher/tools/report/report_html.h"

#include <set>
#include <sstream>

#include "launcher/tools/report/report_format.h"
#include "launcher/tools/report/svg_plot.h"

namespace railshard::report {

namespace {

std::string cell(const std::string& text, bool number = true) {
  return std::string(number ? "<td class=\"n\">" : "<td>") + escapeXml(text) + "</td>";
}

std::string headings(std::initializer_list<const char*> names) {
  std::string row = "<tr>";
  for (const char* name : names) row += std::string("<th>") + escapeXml(name) + "</th>";
  return row + "</tr>\n";
}

std::string busbwPlot(const Report& report) {
  LineChart chart;
  chart.title = "Bus bandwidth by message size";
  chart.x_label = "message size (bytes, log2)";
  chart.y_label = "busbw (GB/s)";
  chart.x_axis = PlotAxis::kLog2;
  chart.x_format = TickFormat::kBytes;
  for (const auto& row : report.sizes) {
    if (!row.has_busbw || row.size_class == 0) continue;
    PlotSeries* series = nullptr;
    for (auto& s : chart.series) {
      if (s.label == row.collective) series = &s;
    }
    if (series == nullptr) series = &chart.series.emplace_back(PlotSeries{row.collective, {}});
    series->points.emplace_back(static_cast<double>(row.size_class), row.busbw_gbs);
  }
  if (report.limit.gbps > 0) {
    chart.lines.push_back({"link limit " + rate(report.limit.gbps) +
                               " Gbit/s = " + rate(report.limit.gbps / 8) + " GB/s",
                           report.limit.gbps / 8});
  }
  return renderSvg(chart);
}

std::string railPlot(const Report& report) {
  LineChart chart;
  chart.title = "Rail throughput over time";
  chart.x_label =
      "time since the trace began (ms), " + fixed(report.timeline.bin_us / 1e3, 3) + " ms bins";
  chart.y_label = "Gbit/s";
  for (const auto& s : report.timeline.series) {
    PlotSeries series{s.label, {}, false};
    for (size_t b = 0; b < s.gbps.size(); ++b) {
      series.points.emplace_back((b + 0.5) * report.timeline.bin_us / 1e3, s.gbps[b]);
    }
    chart.series.push_back(std::move(series));
  }
  return renderSvg(chart);
}

std::string waitPlot(const Report& report) {
  BarChart chart;
  chart.title = "Time each rank waited for the last rank to enter";
  chart.x_label = "rank";
  chart.y_label = "waited (ms)";
  for (const auto& row : report.ranks) {
    chart.bars.emplace_back(std::to_string(row.rank), row.waited_us / 1e3);
  }
  return renderSvg(chart);
}

}  // namespace

std::string renderHtml(const Report& report) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      << "<title>railshard-report: " << escapeXml(report.dir) << "</title>\n"
      << "<style>\n"
      << "body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}\n"
      << "table{border-collapse:collapse;margin:8px 0 20px}\n"
      << "th,td{border:1px solid #ccc;padding:3px 8px}th{background:#f0f0f0}\n"
      << "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
      << "figure{margin:12px 0 28px}p.note{color:#555;font-size:90%}\n"
      << "</style>\n</head>\n<body>\n"
      << "<h1>railshard-report</h1>\n<p>" << escapeXml(report.dir) << ": " << report.ranks_read
      << " of " << report.world_size << " ranks, " << report.collectives.size()
      << " collectives, trace span " << fixed(report.spanUs() / 1e3, 3) << " ms.<br>\n";
  if (report.limit.gbps > 0) {
    out << "Link limit <b>" << rate(report.limit.gbps) << " Gbit/s</b>, from "
        << escapeXml(report.limit.source) << ": " << escapeXml(report.limit.description);
  } else {
    out << "Link limit unknown, so no efficiency (" << escapeXml(report.limit.description) << ")";
  }
  out << "</p>\n";

  out << "<h2>Collectives by size</h2>\n<figure>" << busbwPlot(report) << "</figure>\n"
      << "<table>\n"
      << headings({"size", "collective", "count", "ranks", "time (us)", "algbw (GB/s)",
                   "busbw (GB/s)", "efficiency"});
  for (const auto& row : report.sizes) {
    out << "<tr>" << cell(std::to_string(row.size_class)) << cell(row.collective, false)
        << cell(std::to_string(row.count)) << cell(std::to_string(row.ranks))
        << cell(fixed(row.time_us, 1)) << cell(row.size_class > 0 ? rate(row.algbw_gbs) : "-")
        << cell(row.has_busbw ? rate(row.busbw_gbs) : "-") << cell(percent(row.efficiency))
        << "</tr>\n";
  }
  out << "</table>\n<p class=\"note\">time: per collective the median over ranks of its "
         "duration, then the mean over the class; busbw = algbw &times; the nccl-tests factor; "
         "efficiency = busbw &times; 8 / link limit.</p>\n";

  out << "<h2>Rails</h2>\n<figure>" << railPlot(report) << "</figure>\n<table>\n"
      << headings({"rank", "peer", "rail", "bytes", "pieces", "busy (ms)", "Gbit/s busy",
                   "rail Gbit/s", "utilisation", "share"});
  for (const auto& row : report.rails) {
    out << "<tr>" << cell(std::to_string(row.rank)) << cell(std::to_string(row.peer))
        << cell(row.rail, false) << cell(std::to_string(row.bytes))
        << cell(std::to_string(row.pieces)) << cell(fixed(row.busy_us / 1e3, 3))
        << cell(row.busy_us > 0 ? rate(row.busy_gbps) : "-")
        << cell(row.gbps > 0 ? rate(row.gbps) : "?") << cell(percent(row.utilisation))
        << cell(percent(row.share)) << "</tr>\n";
  }
  out << "</table>\n";

  out << "<h2>Waiting for the slowest rank</h2>\n<figure>" << waitPlot(report)
      << "</figure>\n<table>\n"
      << headings({"rank", "host", "times last", "others waited (us)"});
  for (int i : report.slowest) {
    const auto& row = report.ranks[i];
    out << "<tr>" << cell(std::to_string(row.rank)) << cell(row.host, false)
        << cell(std::to_string(row.times_last)) << cell(fixed(row.others_waited_us, 1))
        << "</tr>\n";
  }
  out << "</table>\n<table>\n"
      << headings({"rank", "host", "collectives", "in collectives (ms)", "waited for last (us)",
                   "wait events (ms)", "reduce (ms)", "clock ± us", "dropped"});
  for (const auto& row : report.ranks) {
    out << "<tr>" << cell(std::to_string(row.rank)) << cell(row.host, false)
        << cell(std::to_string(row.collectives)) << cell(fixed(row.collective_us / 1e3, 3))
        << cell(fixed(row.waited_us, 1)) << cell(fixed(row.wait_events_us / 1e3, 3))
        << cell(fixed(row.reduce_us / 1e3, 3)) << cell(fixed(row.clock_uncertainty_us, 1))
        << cell(std::to_string(row.dropped_events)) << "</tr>\n";
  }
  out << "</table>\n";

  if (!report.dispatch.empty()) {
    std::set<int> ranks;
    for (const auto& row : report.dispatch) {
      for (const auto& [rank, value] : row.shares) ranks.insert(rank);
    }
    out << "<h2>Dispatcher shares</h2>\n<p>rank " << report.dispatch_rank << "'s plans, "
        << report.dispatch.size() << " of " << report.dispatch_samples << " shown</p>\n"
        << "<table>\n<tr><th>sample</th><th>t (ms)</th>";
    for (int rank : ranks) out << "<th>r" << rank << "</th>";
    out << "</tr>\n";
    for (const auto& row : report.dispatch) {
      out << "<tr>" << cell(std::to_string(row.sample)) << cell(fixed(row.t_us / 1e3, 3));
      for (int rank : ranks) {
        const auto it = row.shares.find(rank);
        out << cell(it == row.shares.end() ? "-" : fixed(it->second, 0));
      }
      out << "</tr>\n";
    }
    out << "</table>\n";
  }

  if (!report.warnings.empty()) {
    out << "<h2>Warnings</h2>\n<ul>\n";
    for (const auto& warning : report.warnings) out << "<li>" << escapeXml(warning) << "</li>\n";
    out << "</ul>\n";
  }
  out << "</body>\n</html>\n";
  return out.str();
}

}  // namespace railshard::report
