#pragma once

#include <string>

#include "core/tracing/report_analysis.h"

namespace railshard::tracing {

// railshard-report's standard output: the summary, the size table (with the `efficiency`
// column), the rail table, the slowest ranks, the per-rank table, the dispatcher's shares
// and any warnings. Column meanings: docs/tracing.md, "Report".
std::string renderText(const Report& report);

}  // namespace railshard::tracing
