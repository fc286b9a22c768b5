#pragma once

#include <string>

#include "launcher/tools/report/report_analysis.h"

namespace railshard::report {

// railshard-report's standard output: the summary, the size table (with the `efficiency`
// column), the rail table, the slowest ranks, the per-rank table, the dispatcher's shares
// and any warnings. Column meanings: docs/tracing.md, "Report".
std::string renderText(const Report& report);

}  // namespace railshard::report
