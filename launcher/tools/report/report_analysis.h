#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/topology/topology.h"
#include "core/tracing/link_limit.h"
#include "core/tracing/trace_file.h"

namespace railshard::report {

// The report reads what the library records (core/tracing): those types unqualified here.
using tracing::CollectiveEvent;
using tracing::CounterEvent;
using tracing::LinkLimit;
using tracing::RailEvent;
using tracing::RankTrace;
using tracing::SpanEvent;
using tracing::TraceSet;

// What railshard-report computes from a trace directory (docs/tracing.md, "Report"). Plain
// values, so the text, JSON and HTML renderers only format them.

struct ReportOptions {
  std::optional<topology::Topology> topology;  // --topology: replaces the embedded graph
  std::string topology_source;                 // its file name, for the "limit from" line
  double link_gbps = 0;                        // --link-gbps: replaces any topology; 0 = none
  int dispatch_rows = 20;                      // the shares table is subsampled to this
  int time_bins = 50;                          // bins of the rail throughput timeline
};

// The bandwidth efficiency is measured against.
struct LimitInfo {
  double gbps = 0;          // Gbit/s; 0 = unknown (efficiency "-")
  std::string source;       // "--link-gbps", "--topology FILE", "embedded topology", ...
  std::string description;  // the bottleneck hop, or why the limit is unknown
};

// One (collective name, size class) row: nccl-tests' columns plus efficiency.
struct SizeRow {
  std::string collective;
  uint64_t size_class = 0;  // largest power of two <= bytes (0 for 0 bytes)
  double mean_bytes = 0;
  int count = 0;           // collectives in the class
  int ranks = 0;           // communicator size (the largest `size` seen)
  double time_us = 0;      // mean over the class of each collective's median-over-ranks dur
  double algbw_gbs = 0;    // GB/s (1e9 bytes)
  double busbw_gbs = 0;    // algbw x bus factor; valid when has_busbw
  bool has_busbw = false;  // false for barrier (no data) and unknown collectives
  double efficiency = -1;  // busbw x 8 / limit Gbit/s; < 0 = unknown
};

// One rail of one rank (rank -> peer over a named rail).
struct RailRow {
  int rank = 0;
  int peer = -1;
  std::string rail;
  uint64_t bytes = 0;       // sum of the rail events' bytes
  uint64_t bytes_sent = 0;  // the writer's counter (railshard.rails[]), 0 when not listed
  int pieces = 0;
  double busy_us = 0;       // union of the events' [ts, ts + dur)
  double busy_gbps = 0;     // bytes x 8 / busy time
  double gbps = 0;          // the rail's speed from the metadata; 0 = unknown
  double utilisation = -1;  // bytes x 8 / (gbps x trace span); < 0 = unknown
  double share = 0;         // of this rank's rail bytes
};

// One collective matched across ranks by (generation, seq).
struct CollectiveRecord {
  int64_t generation = 0;
  int64_t seq = 0;
  std::string name;
  uint64_t bytes = 0;
  int ranks = 0;                // ranks that recorded it
  double begin_us = 0;          // earliest entry
  double time_us = 0;           // median over ranks of dur
  int last_rank = -1;           // entered last; -1 when all entered together or one rank only
  double spread_us = 0;         // last entry - first entry
  double others_waited_us = 0;  // sum over the other ranks of (last entry - their entry)
};

struct RankRow {
  int rank = 0;
  std::string host;
  int collectives = 0;
  double collective_us = 0;     // sum of its collectives' dur
  double waited_us = 0;         // sum over collectives of (last entry - its entry)
  int times_last = 0;           // collectives it entered last
  double others_waited_us = 0;  // what the others waited for it, summed
  double wait_events_us = 0;    // wait_send / wait_recv spans
  double reduce_us = 0;         // reduce spans
  double clock_uncertainty_us = 0;
  uint64_t dropped_events = 0;
};

// The dispatcher's `shares` counter, subsampled.
struct DispatchRow {
  int sample = 0;   // index among all samples
  double t_us = 0;  // since the trace began
  std::map<int, double> shares;
};

// Rail throughput over time: time_bins equal bins over the trace span.
struct RailTimeline {
  double begin_us = 0;
  double bin_us = 0;
  struct Series {
    std::string label;
    std::vector<double> gbps;  // per bin
  };
  std::vector<Series> series;
};

struct Report {
  std::string dir;
  int world_size = 0;
  int ranks_read = 0;
  double begin_us = 0;  // first event of any rank
  double end_us = 0;    // last event end of any rank
  double max_clock_uncertainty_us = 0;
  LimitInfo limit;
  std::vector<SizeRow> sizes;
  std::vector<RailRow> rails;
  std::vector<CollectiveRecord> collectives;  // by (generation, seq)
  std::vector<RankRow> ranks;                 // by rank
  std::vector<int> slowest;                   // indexes into ranks: times last, then waited
  std::vector<DispatchRow> dispatch;
  int dispatch_rank = -1;  // whose plan the shares come from
  int dispatch_samples = 0;
  RailTimeline timeline;
  std::vector<std::string> warnings;

  double spanUs() const { return end_us > begin_us ? end_us - begin_us : 0; }
};

// nccl-tests' bus bandwidth factor for a collective over n ranks: allreduce 2(n-1)/n,
// reduce_scatter / allgather / alltoall (n-1)/n, broadcast / reduce / sendrecv 1; 0 when the
// collective moves no data (barrier) or is unknown.
double busBandwidthFactor(const std::string& collective, int n);

// The size class of a message: the largest power of two <= bytes; 0 for 0.
uint64_t sizeClass(uint64_t bytes);

// The link limit: --link-gbps, else ringLimit over --topology, else over the embedded
// topology, else the writer's `link_limit`; unknown when none of these knows.
LimitInfo resolveLimit(const TraceSet& traces, const ReportOptions& options);

Report analyse(const TraceSet& traces, const ReportOptions& options = {});

}  // namespace railshard::report
