#pragma once

#include <string>
#include <vector>

namespace railshard::tracing {

// Joins a trace directory's per-rank files (docs/tracing.md) into one Chrome-trace / Perfetto
// file: every rank's traceEvents concatenated (their pids are the ranks, their timestamps
// already on one clock, so nothing is shifted), and a top-level
// "railshard": {"version": 1, "ranks": [each rank's metadata without its topology],
//               "topology": <the lowest rank's topology, or null>, "warnings": [...]}.
//
// It is what railshard-launch runs when a job ends, when some rank may have died before or
// while writing its file: a missing or unreadable rank file is a warning, not an error, and
// only a directory with no usable rank file at all throws (ConfigError).
struct MergeResult {
  int ranks = 0;                      // rank files merged
  int world_size = 0;                 // the largest world_size the files state
  size_t events = 0;                  // trace events written
  std::vector<std::string> warnings;  // missing ranks, skipped files (naming file and why)
};

// The merged trace as JSON text; `result` (optional) receives what was merged.
std::string mergeTraces(const std::string& dir, MergeResult* result = nullptr);

// Writes mergeTraces(dir) to out_path (through a temporary file renamed into place, so a
// reader never sees half a file). ConfigError when out_path cannot be written.
MergeResult writeMergedTrace(const std::string& dir, const std::string& out_path);

}  // namespace railshard::tracing
