#pragma once

// The metrics registry (base/metrics.h) as prometheus-cpp sees it, for the text rendering and
// the HTTP exporter (base/metrics_http.cc). Internal to base/.
#include <vector>

#include <prometheus/metric_family.h>

namespace railshard::metrics {

// Runs the collectors, then returns every metric that has a series, with its help text:
// metrics sorted by name, each one's series by their sorted labels.
std::vector<prometheus::MetricFamily> collect();

}  // namespace railshard::metrics
