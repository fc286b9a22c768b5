#pragma once

// The trace recorder: low-overhead events of what each rank's collectives did, kept in a
// bounded in-memory buffer and written as Chrome-trace / Perfetto JSON (docs/tracing.md) at
// exit or flush(). It lives in base, not core/tracing, because the transports (which may only
// use base) record the per-rail transfers; the parts that need the store or the topology
// (clock alignment, link limits, reading and merging files) are in core/tracing.
//
// When tracing is off (no RAILSHARD_TRACE) every hook costs one relaxed atomic load.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/clock.h"

namespace railshard::trace {

enum class Category : uint8_t {
  kCollective,  // one collective call, begin to end
  kPhase,       // a phase of its algorithm (ring reduce-scatter, all-gather, ...)
  kWait,        // the calling thread blocked on one send or receive
  kReduce,      // a reduction kernel
  kRail,        // one piece written to one connection (rail) of one peer
  kTransfer,    // one send or receive, posted to completed (async event)
  kCounter,     // dispatcher shares / throughputs per rank
};

struct Event {
  int64_t begin_ns = 0;  // steady clock
  int64_t end_ns = 0;
  const char* name = "";         // a literal
  const char* detail = nullptr;  // a literal: the algorithm of a collective
  uint64_t bytes = 0;
  uint64_t seq = 0;   // collective sequence number
  int32_t rank = -1;  // world (launch) rank: the trace's pid
  int32_t peer = -1;  // communicator rank of the peer
  int32_t track = 0;  // 0 = the collectives track; else a track() id
  int32_t generation = 0;
  int32_t root = -1;
  int32_t size = 0;      // ranks in the communicator
  uint8_t dtype = 0xff;  // DataType, 0xff = none
  uint8_t op = 0xff;     // ReduceOp, 0xff = none
  Category category = Category::kCollective;
  bool failed = false;
};

namespace detail {
extern std::atomic<bool> g_enabled;
}

// True while recording; the hooks test this before doing anything else.
inline bool enabled() {
  return detail::g_enabled.load(std::memory_order_relaxed);
}

inline int64_t now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Starts recording into `dir` (created at write time), keeping at most `max_events` (the
// oldest are dropped and counted). Idempotent; a second call with another directory is
// ignored with a warning. InvalidArgument when max_events is 0.
void enable(const std::string& dir, size_t max_events);
// Stops recording and forgets everything (tests).
void disableAndClear();
const std::string& directory();

void record(const Event& event);
// A counter sample (ph "C"): `values[i]` is named "r<i>".
void recordCounter(int rank, const char* name, std::vector<double> values);

// The id of the track named `name` in rank `rank`'s process (created on first use); `rail` is
// the rail the track shows, for the events' args.
int32_t track(int rank, const std::string& name, const std::string& rail);

// The calling thread's world rank for events recorded below the communicator (reductions).
int currentRank();
class ScopedRank {
 public:
  explicit ScopedRank(int rank);
  ~ScopedRank();
  ScopedRank(const ScopedRank&) = delete;
  ScopedRank& operator=(const ScopedRank&) = delete;

 private:
  int previous_;
};

// What the rank's file says about it. offset_ns maps its steady clock onto rank 0's;
// epoch_ns (on rank 0's clock) becomes time 0 of the job.
struct RankInfo {
  int world_size = 0;
  std::string host;
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = 0;
  int64_t epoch_ns = 0;
  std::string aligned = "none";  // "store" or "none"
};
void setRankInfo(int rank, const RankInfo& info);

// Extra "railshard" metadata of a rank (a JSON object's members, without braces: rails,
// link_limit, topology), asked for whenever files are written. A provider is called one last
// time when removed and its answer kept, so a communicator destroyed before exit still
// describes itself.
int addMetadataProvider(int rank, std::function<std::string()> provider);
void removeMetadataProvider(int id);

// Writes DIR/railshard-trace-rank<R>.json for every rank recorded in this process; returns
// the paths written. Also runs at exit while tracing is on. Failures are logged, not thrown.
std::vector<std::string> flush();

// The per-rank file name in `dir`.
std::string rankFile(const std::string& dir, int rank);

// Records a complete event from construction to destruction when tracing was on at
// construction. Fill event() before it ends.
class Span {
 public:
  Span(Category category, const char* name) {
    if (enabled()) {
      active_ = true;
      event_.category = category;
      event_.name = name;
      event_.rank = currentRank();
      event_.begin_ns = now();
    }
  }
  ~Span() {
    if (active_) {
      event_.end_ns = now();
      record(event_);
    }
  }
  // A phase of collective `seq`.
  Span(Category category, const char* name, uint64_t seq) : Span(category, name) {
    event_.seq = seq;
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool active() const { return active_; }
  Event& event() { return event_; }

 private:
  bool active_ = false;
  Event event_;
};

}  // namespace railshard::trace
