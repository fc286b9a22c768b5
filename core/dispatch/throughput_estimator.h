#pragma once

#include <vector>

namespace railshard::dispatch {

struct EstimatorOptions {
  // Weight of the past halves every this many steps (EWMA). Small: reacts fast, noisy.
  double half_life_steps = 2.0;
  // A sample this many times faster or slower than the estimate is an outlier: held back
  // once; if the next sample is off the same way, the rank really changed and the estimate
  // jumps to the two samples' mean (so a slowdown is tracked two steps later, not ten).
  double jump_ratio = 1.5;
};

// Samples per second per rank from (samples, seconds) reports. Pure: no clock of its own.
class ThroughputEstimator {
 public:
  ThroughputEstimator(int ranks, EstimatorOptions options = {});

  // InvalidArgument for a rank out of range, negative or non-finite values. A report with no
  // samples or no time carries no rate and is ignored.
  void report(int rank, double samples, double seconds);
  // The CPU the rank may use, in cores (its quota), 0 when unknown. While it is known the
  // estimate is kept per core and rate() scales it by the latest capacity: a rank whose quota
  // halves gets half the rate at once, before a slower step has been measured; the one report
  // after the change, measured partly under the old quota, is left out. InvalidArgument for
  // a negative or non-finite value.
  void setCapacity(int rank, double cores);
  // Every rank has reported at least once.
  bool warm() const;
  bool reported(int rank) const;
  // Samples per second; 0 before the rank's first report.
  double rate(int rank) const;
  std::vector<double> rates() const;
  int ranks() const { return static_cast<int>(states_.size()); }
  // A new rank (elastic growth): no rate until it reports.
  int addRank();
  // Forgets a rank's history (it restarted, or moved to other hardware).
  void reset(int rank);

 private:
  // Reads and writes every field (core/dispatch/state_codec.cc): a joiner's copy.
  friend struct StateCodecAccess;

  struct State {
    double rate = 0;  // samples/s, per core while capacity is known
    int reports = 0;
    double suspect = 0;      // an outlier held back (same units), 0 if none
    double capacity = 0;     // cores; 0 = unknown
    bool straddles = false;  // the next report spans a capacity change: left out
  };
  static double scale(const State& s) { return s.capacity > 0 ? s.capacity : 1; }
  State& at(int rank);
  const State& at(int rank) const;

  EstimatorOptions options_;
  double alpha_;
  std::vector<State> states_;
};

}  // namespace railshard::dispatch
