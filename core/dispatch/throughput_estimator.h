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
    double rate = 0;
    int reports = 0;
    double suspect = 0;  // an outlier held back, 0 if none
  };
  State& at(int rank);
  const State& at(int rank) const;

  EstimatorOptions options_;
  double alpha_;
  std::vector<State> states_;
};

}  // namespace railshard::dispatch
