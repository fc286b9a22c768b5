#pragma once

// Command line of dispatch_bench (see usage()).

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace railshard::bench {

// Bad command line: exit status 2, like railshard-launch's own usage errors.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr double kDefaultIdealStepMs = 50;  // --unit-ms default: the ideal step takes this long

struct Slowdown {
  int rank = 0;
  double factor = 1;
  int step = 0;  // from this step of each policy on (steps count from 0)
};

// --kill RANK:STEP[:POINT]: launch rank RANK raises SIGKILL on itself in step STEP of the first
// policy. kCompute (default): after computing its share, before the gradient all-reduce (the
// survivors fail in that all-reduce and redo the step); kCommit: after the all-reduce, before
// the next step (the step stands; the survivors fail in the exchange that follows it).
struct Kill {
  enum class Point { kCompute, kCommit };
  int rank = 0;
  int step = 0;
  Point point = Point::kCompute;
};

// --stall R:FROM:TO:MS: in steps [FROM, TO) of each policy, launch rank R waits MS ms for its
// data before it computes (its loader ran dry); it reports the wait as queued work
// (LoadSignals::queued_samples = the wait times its rate), which least_loaded plans with.
struct Stall {
  int rank = 0;
  int from = 0;
  int to = 0;
  double ms = 0;
};

// --quota-change R:S:F: in step S of each policy launch rank R multiplies its own CPU quota
// (its cgroup, as railshard-launch --emulate-speeds made it) by F: the machine, not a sleep,
// makes it slower or faster.
struct QuotaChange {
  int rank = 0;
  int step = 0;
  double factor = 1;
};

struct BenchOptions {
  std::vector<std::string> policies = {"proportional", "equal"};
  int steps = 30;
  int warmup = 5;
  size_t batch = 840;
  size_t micro = 8;
  double unit_ms = 0;          // 0: chosen so that the ideal step is kDefaultIdealStepMs
  std::vector<double> speeds;  // empty: 1 per rank
  std::optional<Slowdown> slowdown;
  std::optional<Kill> kill;  // needs railshard-launch --elastic
  std::optional<Stall> stall;
  std::optional<QuotaChange> quota_change;
  // --watts a,b,...: an emulated power source per rank (RAILSHARD_POWER_WATTS, per slot): the
  // watts it draws per busy core, for the energy policy where the machine reports none.
  std::vector<double> watts;
  bool grow = false;  // admit joiners at step boundaries (Communicator::grow())
  // 256K floats (1 MiB, ~1 ms here): the issue asked for 1M, but on this 2-core machine 1M
  // floats take ~5 ms to all-reduce across 3 ranks, ~10% of a 50 ms step on their own; that is
  // the all-reduce's cost, not the dispatcher's, and would hide what this benchmark is about.
  size_t grad_count = 256 << 10;
  bool cpu_work = false;
  std::string json;
  uint64_t epoch = 0;  // 0: steps * batch
  bool help = false;
};

std::string usage();
// Parses the options; UsageError (exit status 2) naming the problem.
BenchOptions parseOptions(int argc, char** argv);
// Checks what needs the world size (one speed per rank) and fills the defaults that depend on
// it (--unit-ms, --epoch).
void checkAgainstWorld(BenchOptions& options, int world);

}  // namespace railshard::bench
