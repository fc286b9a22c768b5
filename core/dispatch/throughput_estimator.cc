#include "core/dispatch/throughput_estimator.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace railshard::dispatch {

ThroughputEstimator::ThroughputEstimator(int ranks, EstimatorOptions options)
    : options_(options), states_(static_cast<size_t>(ranks < 0 ? 0 : ranks)) {
  if (ranks < 0) throw InvalidArgument("ThroughputEstimator: negative rank count");
  if (!(options.half_life_steps > 0)) {
    throw InvalidArgument("ThroughputEstimator: half_life_steps must be > 0");
  }
  if (!(options.jump_ratio > 1)) {
    throw InvalidArgument("ThroughputEstimator: jump_ratio must be > 1");
  }
  // EWMA weight of a new sample such that an old one's weight halves every half-life.
  alpha_ = 1 - std::pow(0.5, 1 / options.half_life_steps);
}

ThroughputEstimator::State& ThroughputEstimator::at(int rank) {
  if (rank < 0 || rank >= ranks()) {
    throw InvalidArgument("ThroughputEstimator: rank " + std::to_string(rank) + " is not in 0.." +
                          std::to_string(ranks() - 1));
  }
  return states_[static_cast<size_t>(rank)];
}

const ThroughputEstimator::State& ThroughputEstimator::at(int rank) const {
  return const_cast<ThroughputEstimator*>(this)->at(rank);
}

void ThroughputEstimator::report(int rank, double samples, double seconds) {
  State& s = at(rank);
  if (!std::isfinite(samples) || !std::isfinite(seconds) || samples < 0 || seconds < 0) {
    throw InvalidArgument("ThroughputEstimator: rank " + std::to_string(rank) + " reported " +
                          std::to_string(samples) + " samples in " + std::to_string(seconds) +
                          " s");
  }
  if (samples == 0 || seconds == 0) return;  // nothing was measured
  if (s.straddles) {
    // Measured across a change of capacity: neither the old nor the new rate.
    s.straddles = false;
    return;
  }
  const double sample = samples / seconds / scale(s);
  if (s.reports++ == 0) {
    s.rate = sample;
    return;
  }
  const bool outlier =
      sample > s.rate * options_.jump_ratio || sample * options_.jump_ratio < s.rate;
  if (!outlier) {
    s.suspect = 0;
    s.rate += alpha_ * (sample - s.rate);
    return;
  }
  const bool same_way = s.suspect > 0 && (sample > s.rate) == (s.suspect > s.rate);
  if (same_way) {
    // Twice off the same way: the rank changed (throttling, a neighbour's job). Jump.
    s.rate = (s.suspect + sample) / 2;
    s.suspect = 0;
  } else {
    s.suspect = sample;  // once: could be a hiccup (GC, a page fault storm); hold it back
  }
}

bool ThroughputEstimator::warm() const {
  for (const auto& s : states_) {
    if (s.reports == 0) return false;
  }
  return true;
}

bool ThroughputEstimator::reported(int rank) const {
  return at(rank).reports > 0;
}

double ThroughputEstimator::rate(int rank) const {
  const State& s = at(rank);
  return s.rate * scale(s);
}

std::vector<double> ThroughputEstimator::rates() const {
  std::vector<double> result;
  result.reserve(states_.size());
  for (const auto& s : states_) result.push_back(s.rate * scale(s));
  return result;
}

void ThroughputEstimator::setCapacity(int rank, double cores) {
  State& s = at(rank);
  if (!std::isfinite(cores) || cores < 0) {
    throw InvalidArgument("ThroughputEstimator: rank " + std::to_string(rank) +
                          " has a capacity of " + std::to_string(cores) + " cores");
  }
  if (cores == s.capacity) return;
  if (s.capacity == 0 || cores == 0) {
    // Known to unknown or back: carry the estimate over as measured under the new value.
    const double factor = scale(s) / (cores > 0 ? cores : 1);
    s.rate *= factor;
    s.suspect *= factor;
  } else {
    s.straddles = s.reports > 0;  // the step being reported ran partly under the old quota
  }
  s.capacity = cores;
}

int ThroughputEstimator::addRank() {
  states_.emplace_back();
  return ranks() - 1;
}

void ThroughputEstimator::reset(int rank) {
  at(rank) = State{};
}

}  // namespace railshard::dispatch
