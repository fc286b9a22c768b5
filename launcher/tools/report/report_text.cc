#include "launcher/tools/report/report_text.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <vector>

#include "launcher/tools/report/report_format.h"

namespace railshard::report {

namespace {

// Columns padded to their widest cell; text columns left-aligned, numbers right-aligned.
class TextTable {
 public:
  // A heading starting with '<' is a left-aligned column (the '<' is not printed).
  explicit TextTable(std::vector<std::string> headings) {
    for (auto& heading : headings) {
      const bool left = !heading.empty() && heading[0] == '<';
      left_.push_back(left);
      head_.push_back(left ? heading.substr(1) : heading);
    }
  }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const {
    std::vector<size_t> width(head_.size());
    for (size_t c = 0; c < head_.size(); ++c) width[c] = head_[c].size();
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
        width[c] = std::max(width[c], row[c].size());
      }
    }
    std::ostringstream out;
    const auto line = [&](const std::vector<std::string>& row) {
      std::string text = " ";
      for (size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < row.size() ? row[c] : "";
        const std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
        text += "  " + (left_[c] ? cell + pad : pad + cell);
      }
      while (!text.empty() && text.back() == ' ') text.pop_back();
      out << text << "\n";
    };
    line(head_);
    for (const auto& row : rows_) line(row);
    return out.str();
  }

 private:
  std::vector<std::string> head_;
  std::vector<bool> left_;
  std::vector<std::vector<std::string>> rows_;
};

std::string sizeTable(const Report& report) {
  TextTable table({"size", "<collective", "count", "ranks", "time(us)", "algbw(GB/s)",
                   "busbw(GB/s)", "efficiency"});
  for (const auto& row : report.sizes) {
    table.add({std::to_string(row.size_class), row.collective, std::to_string(row.count),
               std::to_string(row.ranks), fixed(row.time_us, 1),
               row.size_class > 0 ? rate(row.algbw_gbs) : "-",
               row.has_busbw ? rate(row.busbw_gbs) : "-", percent(row.efficiency)});
  }
  return table.str();
}

std::string railTable(const Report& report) {
  TextTable table({"rank", "peer", "<rail", "bytes", "pieces", "busy(ms)", "Gbit/s busy",
                   "rail Gbit/s", "utilisation", "share"});
  for (const auto& row : report.rails) {
    table.add({std::to_string(row.rank), std::to_string(row.peer), row.rail,
               std::to_string(row.bytes), std::to_string(row.pieces), fixed(row.busy_us / 1e3, 3),
               row.busy_us > 0 ? rate(row.busy_gbps) : "-", row.gbps > 0 ? rate(row.gbps) : "?",
               percent(row.utilisation), percent(row.share)});
  }
  return table.str();
}

std::string slowestTable(const Report& report) {
  TextTable table({"rank", "<host", "times last", "others waited(us)"});
  const size_t shown = std::min<size_t>(report.slowest.size(), 10);
  for (size_t i = 0; i < shown; ++i) {
    const auto& row = report.ranks[report.slowest[i]];
    table.add({std::to_string(row.rank), row.host, std::to_string(row.times_last),
               fixed(row.others_waited_us, 1)});
  }
  return table.str();
}

std::string rankTable(const Report& report) {
  TextTable table({"rank", "<host", "collectives", "in collectives(ms)", "waited for last(us)",
                   "wait events(ms)", "reduce(ms)", "clock +-us", "dropped"});
  for (const auto& row : report.ranks) {
    table.add({std::to_string(row.rank), row.host, std::to_string(row.collectives),
               fixed(row.collective_us / 1e3, 3), fixed(row.waited_us, 1),
               fixed(row.wait_events_us / 1e3, 3), fixed(row.reduce_us / 1e3, 3),
               fixed(row.clock_uncertainty_us, 1), std::to_string(row.dropped_events)});
  }
  return table.str();
}

std::string dispatchTable(const Report& report) {
  std::set<int> ranks;
  for (const auto& row : report.dispatch) {
    for (const auto& [rank, value] : row.shares) ranks.insert(rank);
  }
  std::vector<std::string> headings = {"sample", "t(ms)"};
  for (int rank : ranks) headings.push_back(rankKey(rank));
  TextTable table(headings);
  for (const auto& row : report.dispatch) {
    std::vector<std::string> cells = {std::to_string(row.sample), fixed(row.t_us / 1e3, 3)};
    for (int rank : ranks) {
      const auto it = row.shares.find(rank);
      cells.push_back(it == row.shares.end() ? "-" : fixed(it->second, 0));
    }
    table.add(std::move(cells));
  }
  return table.str();
}

}  // namespace

std::string renderText(const Report& report) {
  std::ostringstream out;
  out << "railshard-report: " << report.dir << "\n"
      << "  " << report.ranks_read << " of " << report.world_size << " ranks, "
      << report.collectives.size() << " collectives, trace span " << fixed(report.spanUs() / 1e3, 3)
      << " ms\n";
  if (report.limit.gbps > 0) {
    out << "  link limit: " << rate(report.limit.gbps) << " Gbit/s, from " << report.limit.source
        << ": " << report.limit.description << "\n";
  } else {
    out << "  link limit: unknown, so no efficiency (" << report.limit.description << ")\n";
  }

  out << "\nCollectives by size class (time: median over ranks of each collective, mean over "
         "the class;\nbusbw = algbw x nccl-tests factor; efficiency = busbw x 8 / link limit)\n"
      << sizeTable(report);

  out << "\nRails (bytes as the rail events add up; utilisation = bytes x 8 / (rail Gbit/s x "
         "trace span);\nshare = of the rank's bytes on all its rails)\n";
  out << (report.rails.empty() ? "  no rail events (shared memory only?)\n" : railTable(report));

  out << "\nSlowest rank (entered a collective last; others waited from their entry to its)\n";
  if (report.slowest.empty()) {
    out << "  none: every collective was entered by all ranks at the same time\n";
  } else {
    out << slowestTable(report);
    if (report.max_clock_uncertainty_us > 0) {
      out << "  (clocks aligned to +-" << fixed(report.max_clock_uncertainty_us, 1)
          << " us: entry differences below that are not meaningful)\n";
    }
  }

  out << "\nRanks\n" << rankTable(report);

  if (!report.dispatch.empty()) {
    out << "\nDispatcher shares (rank " << report.dispatch_rank << "'s plans; "
        << report.dispatch.size() << " of " << report.dispatch_samples << " shown)\n"
        << dispatchTable(report);
  }

  if (!report.warnings.empty()) {
    out << "\nWarnings\n";
    for (const auto& warning : report.warnings) out << "  " << warning << "\n";
  }
  return out.str();
}

}  // namespace railshard::report
