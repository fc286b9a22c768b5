#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "benchmarks/perf_options.h"
#include "benchmarks/perf_results.h"
#include "core/tracing/link_limit.h"

namespace railshard::bench {

// What allreduce_perf knows about its run besides the options and the rows.
struct PerfRunInfo {
  std::string backend;      // --backend
  std::string description;  // the "# Using" line
  std::string version;      // railshard's
  int ranks = 0;
  std::vector<std::string> hosts;  // by rank; empty when unknown
  tracing::LinkLimit limit;        // gbps 0: unknown, no efficiency
  std::string limit_source;        // "--link-gbps" or "topology"
};

// -J's document, one object (nccl-tests' JSON output, in railshard's column names):
//   {"identifier": "railshard allreduce_perf", "version", "config": {backend, ranks, hosts,
//    dtype, op, iters, warmup, ...}, "link_limit": {gbps, description, source} or null,
//    "efficiency_of": ..., "rows": [{size, count, type, redop, root, oop_time_us, oop_algbw,
//    oop_busbw, oop_wrong, ip_..., efficiency}], "wrong_total", "avg_busbw"}
// Times in microseconds, bandwidths in GB/s (1e9 bytes), efficiency a fraction or null.
void writePerfJson(std::ostream& out, const PerfOptions& options, const PerfRunInfo& info,
                   const std::vector<PerfRow>& rows);

}  // namespace railshard::bench
