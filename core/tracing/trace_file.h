#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/topology/topology.h"

namespace railshard::tracing {

// One per-rank trace file (docs/tracing.md, "File format") read into plain values: the events
// railshard-report analyses, and the file's `railshard` metadata. Events of kinds the report
// does not use (metadata "M", async "transfer" b/e, unknown categories) are skipped, so a
// newer writer with extra events still reads.

// `cat: collective`, track 0.
struct CollectiveEvent {
  std::string name;  // allreduce, reduce_scatter, allgather, broadcast, barrier
  double ts = 0;     // microseconds on the job-wide clock
  double dur = 0;
  int64_t seq = 0;
  int64_t generation = 0;
  uint64_t bytes = 0;  // per-rank buffer size as nccl-tests counts it
  uint64_t count = 0;
  int size = 0;  // ranks in the communicator; 0 = not recorded
  int root = -1;
  std::string dtype;
  std::string op;
  std::string algorithm;
};

// `cat: phase`, `wait` or `reduce`: a span on track 0.
struct SpanEvent {
  std::string name;  // reduce_scatter / wait_recv / reduce ...
  double ts = 0;
  double dur = 0;
  int64_t seq = -1;    // phase
  int peer = -1;       // wait
  uint64_t bytes = 0;  // wait, reduce
};

// `cat: rail`: one piece written to one rail.
struct RailEvent {
  double ts = 0;
  double dur = 0;
  int tid = 0;
  int peer = -1;
  uint64_t bytes = 0;
  std::string rail;
};

// `cat: dispatch`, `ph: C`: one sample of a counter, values by rank ("r3" -> 3).
struct CounterEvent {
  std::string name;  // shares, throughput
  double ts = 0;
  std::map<int, double> values;
};

// `railshard.rails[]`.
struct RailInfo {
  int peer = -1;
  std::string name;
  std::string local;
  std::string remote;
  double gbps = 0;  // 0 = unknown
  uint64_t bytes_sent = 0;
};

struct ClockInfo {
  double offset_us = 0;
  double uncertainty_us = 0;
  std::string aligned;  // "store" | "none"
};

struct RankTrace {
  std::string path;  // the file it came from
  // railshard metadata.
  int version = 1;
  int rank = 0;
  int world_size = 0;
  std::string host;
  int64_t os_pid = 0;
  ClockInfo clock;
  uint64_t events = 0;
  uint64_t dropped_events = 0;
  std::vector<RailInfo> rails;
  double link_limit_gbps = 0;  // `link_limit.gbps`; 0 when absent
  std::string link_limit_description;
  std::optional<topology::Topology> topology;  // null / absent -> none
  // Events, in file order.
  std::vector<CollectiveEvent> collectives;
  std::vector<SpanEvent> phases;
  std::vector<SpanEvent> waits;
  std::vector<SpanEvent> reduces;
  std::vector<RailEvent> rail_events;
  std::vector<CounterEvent> dispatch;
};

// All per-rank files of one trace directory, ordered by rank.
struct TraceSet {
  std::string dir;
  int world_size = 0;  // the largest world_size any file states
  std::vector<RankTrace> ranks;
  std::vector<std::string> warnings;  // missing ranks, dropped events
};

// "railshard-trace-rank<R>.json".
std::string rankFileName(int rank);
// The rank in a per-rank file name, or -1 when `name` is not one.
int rankOfFileName(const std::string& name);
// The per-rank files in `dir`, ordered by rank. ConfigError when `dir` cannot be listed.
std::vector<std::string> listRankFiles(const std::string& dir);

// ConfigError naming `what` (the file) and the offending field or event on malformed input.
RankTrace parseTrace(const std::string& text, const std::string& what);
// ConfigError when the file cannot be read or is malformed.
RankTrace readTraceFile(const std::string& path);
// Reads every per-rank file of `dir`. ConfigError when there is none, a file is malformed
// or a file's name disagrees with its `rank`; missing ranks and dropped events become
// warnings.
TraceSet readTraceDir(const std::string& dir);

}  // namespace railshard::tracing
