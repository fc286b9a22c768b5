#pragma once

// Process-wide metrics in the Prometheus text exposition format, so an operator can watch a
// job (collectives per rank, bytes per rail, errors) with the tools they already have: a
// node exporter's textfile collector, or anything that reads the file startFileExporter()
// keeps fresh. Updates happen per collective, not per byte, so one mutex guards everything.
//
//   metrics::describe("railshard_collectives_total", "counter", "Collectives completed.");
//   metrics::add("railshard_collectives_total", {{"rank", "0"}, {"op", "allreduce"}}, 1);
//   metrics::set("railshard_rail_weight", {{"rank", "0"}, {"rail", "eth1"}}, 0.8);
//
// Every call throws InvalidArgument on a malformed name, a duplicate label key or a use that
// contradicts the metric's type (set() on a counter, a negative delta to a counter).
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace railshard::metrics {

// (key, value) pairs; any order on input, kept sorted by key, so {{"op",..},{"rank",..}} and
// {{"rank",..},{"op",..}} are the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

// Registers the # HELP and # TYPE lines of `name`; type is "counter" or "gauge". Optional:
// a metric first used by add() is a counter, by set() a gauge, with a placeholder help text.
// Describing a metric as the other type than it already has is an InvalidArgument.
void describe(std::string_view name, std::string_view type, std::string_view help);

// Counter (or gauge) += delta. A counter only goes up: delta must be >= 0.
void add(std::string_view name, const Labels& labels, double delta = 1);

// Gauge = value. InvalidArgument on a counter.
void set(std::string_view name, const Labels& labels, double value);

// The value of one series; 0 when it was never written (for tests and for collectors that
// derive one metric from another).
double value(std::string_view name, const Labels& labels);

// Runs the collectors, then renders every metric: metrics sorted by name, each with its
// # HELP and # TYPE lines, then its series sorted by labels, `name{k="v",...} value`. Label
// values escape backslash, double quote and newline as the format requires.
std::string renderPrometheus();

// `collector` runs at the start of every renderPrometheus() (so it may set() gauges from
// live state, such as a transport's per-rail estimates). Collectors run one at a time, on
// the rendering thread (the file exporter's, for scrapes through the file); they must not
// call addCollector/removeCollector. Returns an id for removeCollector().
int addCollector(std::function<void()> collector);
// After it returns the collector is not running and never runs again, so its owner may be
// destroyed. Unknown ids are ignored.
void removeCollector(int id);

// Drops every metric and description (collectors stay). For tests.
void reset();

// A background thread writes renderPrometheus() to `path` at once and then every `interval`,
// atomically (`path`.tmp, then rename, so a reader never sees half a file), and once more
// when stopped and at process exit. A second start replaces the first (which writes its final
// snapshot). A write that fails (directory missing, disk full) logs one warning until a write
// succeeds again; nothing is thrown from the thread. InvalidArgument for an empty path or an
// interval that is not > 0.
void startFileExporter(const std::string& path, std::chrono::milliseconds interval);
// Writes the final snapshot and joins the thread; no-op when none is running.
void stopFileExporter();

}  // namespace railshard::metrics
