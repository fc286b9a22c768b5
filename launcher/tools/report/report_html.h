#pragma once

#include <string>

#include "launcher/tools/report/report_analysis.h"

namespace railshard::report {

// A self-contained static HTML page (railshard-report --html): the text report's tables and
// three inline SVG plots: busbw against message size with the link limit, rail throughput
// over time, and each rank's wait for the last-entering rank. No scripts, no external files.
std::string renderHtml(const Report& report);

}  // namespace railshard::report
