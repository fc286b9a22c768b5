#pragma once

#include <string>

#include "launcher/tools/report/report_analysis.h"

namespace railshard::report {

// The analysis as JSON (railshard-report --json): every table of the text report unabridged
// (all collectives, all dispatcher rows kept by the subsampling), unknown values as null.
std::string renderJson(const Report& report);

}  // namespace railshard::report
