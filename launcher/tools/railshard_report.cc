// railshard-report: reads a RAILSHARD_TRACE directory and prints the efficiency report (see
// --help and docs/tracing.md, "Report"); optionally merges the per-rank files into one trace.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "base/error.h"
#include "core/topology/topology.h"
#include "core/tracing/trace_file.h"
#include "core/tracing/trace_merge.h"
#include "launcher/tools/report/report_analysis.h"
#include "launcher/tools/report/report_html.h"
#include "launcher/tools/report/report_json.h"
#include "launcher/tools/report/report_text.h"

namespace {

constexpr const char* kUsage =
    "usage: railshard-report TRACE_DIR [--merge OUT.json] [--html OUT.html] [--json OUT.json]\n"
    "                        [--topology FILE] [--link-gbps X]\n";

constexpr const char* kHelp =
    "\n"
    "Reads the per-rank trace files a job wrote with RAILSHARD_TRACE=TRACE_DIR and prints, per\n"
    "message-size class, count, time, algbw, busbw and efficiency (busbw x 8 / the link limit),\n"
    "bytes and utilisation per rail, the slowest rank per collective and what the others\n"
    "waited for it, and the dispatcher's shares over time.\n"
    "\n"
    "  --merge OUT.json   also write one merged Chrome-trace / Perfetto file of all ranks\n"
    "  --html OUT.html    also write a static page with the tables and SVG plots\n"
    "  --json OUT.json    also write the analysis as JSON\n"
    "  --topology FILE    measure efficiency against this topology graph (railshard-topo\n"
    "                     --json) instead of the one embedded in the trace\n"
    "  --link-gbps X      measure efficiency against X Gbit/s\n"
    "\n"
    "Exit status: 0 done, 2 bad usage or unreadable / malformed input.\n";

struct UsageError {
  std::string problem;
};

struct Arguments {
  std::string dir;
  std::string merge;
  std::string html;
  std::string json;
  std::string topology;
  double link_gbps = 0;
  bool help = false;
};

double parseGbps(const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const double gbps = std::strtod(value.c_str(), &end);
  if (value.empty() || end == nullptr || *end != '\0' || errno != 0 || !std::isfinite(gbps) ||
      gbps <= 0) {
    throw UsageError{"--link-gbps needs a positive number of Gbit/s, got '" + value + "'"};
  }
  return gbps;
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto next = [&](const char* what) -> std::string {
      if (i + 1 >= argc) throw UsageError{arg + " needs " + what};
      return argv[++i];
    };
    if (arg == "--merge") {
      args.merge = next("an output file");
    } else if (arg == "--html") {
      args.html = next("an output file");
    } else if (arg == "--json") {
      args.json = next("an output file");
    } else if (arg == "--topology") {
      args.topology = next("a topology file");
    } else if (arg == "--link-gbps") {
      args.link_gbps = parseGbps(next("a number of Gbit/s"));
    } else if (arg == "-h" || arg == "--help") {
      args.help = true;
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError{"unknown argument '" + arg + "'"};
    } else if (args.dir.empty()) {
      args.dir = arg;
    } else {
      throw UsageError{"one trace directory only (got '" + args.dir + "' and '" + arg + "')"};
    }
  }
  if (args.dir.empty() && !args.help) throw UsageError{"no trace directory given"};
  return args;
}

std::string readFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw railshard::ConfigError(std::string("cannot read ") + what + " '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeFile(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw railshard::ConfigError(std::string("cannot write ") + what + " '" + path + "'");
}

int run(const Arguments& args) {
  namespace tracing = railshard::tracing;
  namespace report = railshard::report;
  report::ReportOptions options;
  options.link_gbps = args.link_gbps;
  if (!args.topology.empty()) {
    options.topology =
        railshard::topology::Topology::fromJson(readFile(args.topology, "topology"), args.topology);
    options.topology_source = args.topology;
  }
  const tracing::TraceSet traces = tracing::readTraceDir(args.dir);
  const report::Report analysed = report::analyse(traces, options);
  std::cout << report::renderText(analysed);
  if (!args.json.empty()) writeFile(args.json, report::renderJson(analysed), "JSON report");
  if (!args.html.empty()) writeFile(args.html, report::renderHtml(analysed), "HTML report");
  if (!args.merge.empty()) {
    const auto merged = tracing::writeMergedTrace(args.dir, args.merge);
    std::cout << "\nmerged " << merged.ranks << " rank(s), " << merged.events << " events into "
              << args.merge << "\n";
    for (const auto& warning : merged.warnings) {
      std::fprintf(stderr, "railshard-report: merge: %s\n", warning.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "railshard-report: %s\n%s", error.problem.c_str(), kUsage);
    return 2;
  }
  if (args.help) {
    std::cout << kUsage << kHelp;
    return 0;
  }
  try {
    return run(args);
  } catch (const railshard::ConfigError& error) {
    std::fprintf(stderr, "railshard-report: %s\n", error.what());
    return 2;
  } catch (const railshard::InvalidArgument& error) {
    std::fprintf(stderr, "railshard-report: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "railshard-report: %s\n", error.what());
    return 1;
  }
}
