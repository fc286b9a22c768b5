#include "core/dispatch/dispatcher.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "base/fnv.h"

namespace railshard::dispatch {

size_t StepPlan::total() const {
  return std::accumulate(samples.begin(), samples.end(), size_t{0});
}

uint64_t StepPlan::fingerprint() const {
  // Over the step number and every rank's ranges: equal plans, equal fingerprints.
  Fnv1a h;
  h.add(step);
  for (size_t r = 0; r < ranges.size(); ++r) {
    h.add(uint64_t{r});
    for (const Range& range : ranges[r]) h.add(range.begin).add(range.end);
  }
  return h.value();
}

DispatchOptions DispatchOptions::fromConfig(const Config& config) {
  DispatchOptions options;
  options.policy = parsePolicy(config.dispatch_policy);
  return options;
}

Dispatcher::Dispatcher(int world_size, uint64_t epoch_size, DispatchOptions options)
    : options_(std::move(options)),
      epoch_size_(epoch_size),
      alive_(static_cast<size_t>(std::max(world_size, 0)), true),
      queued_(alive_.size(), 0),
      estimator_(world_size, options_.estimator) {
  if (world_size < 1) throw InvalidArgument("Dispatcher: world size must be >= 1");
  if (options_.micro_batch == 0) throw InvalidArgument("Dispatcher: micro_batch must be >= 1");
  if (!options_.weights.empty() && options_.weights.size() != alive_.size()) {
    throw InvalidArgument("Dispatcher: " + std::to_string(options_.weights.size()) +
                          " weights for " + std::to_string(world_size) + " ranks");
  }
  static_weights_ =
      options_.weights.empty() ? std::vector<double>(alive_.size(), 1.0) : options_.weights;
  for (const double w : static_weights_) {
    if (!(w > 0)) throw InvalidArgument("Dispatcher: weights must be > 0");
  }
}

bool Dispatcher::alive(int rank) const {
  return rank >= 0 && rank < worldSize() && alive_[static_cast<size_t>(rank)];
}

int Dispatcher::liveRanks() const {
  return static_cast<int>(std::count(alive_.begin(), alive_.end(), true));
}

std::vector<double> Dispatcher::weightsFor(const std::vector<bool>& take_part) const {
  const size_t n = take_part.size();
  std::vector<double> weights(n, 0);
  switch (options_.policy) {
    case Policy::kRoundRobin:
    case Policy::kWeightedRoundRobin:
      for (size_t r = 0; r < n; ++r) weights[r] = take_part[r] ? static_weights_[r] : 0;
      return weights;
    case Policy::kProportional:
    case Policy::kLeastLoaded: {
      // Measured rates; a rank that has not reported yet counts as the median of those that
      // have (so before anyone reports, everyone is equal: the warm-up split).
      std::vector<double> known;
      for (size_t r = 0; r < n; ++r) {
        if (take_part[r] && estimator_.reported(static_cast<int>(r))) {
          known.push_back(estimator_.rate(static_cast<int>(r)));
        }
      }
      double fill = 1;
      if (!known.empty()) {
        std::nth_element(known.begin(), known.begin() + static_cast<long>(known.size() / 2),
                         known.end());
        fill = known[known.size() / 2];
      }
      for (size_t r = 0; r < n; ++r) {
        if (!take_part[r]) continue;
        weights[r] =
            estimator_.reported(static_cast<int>(r)) ? estimator_.rate(static_cast<int>(r)) : fill;
      }
      return weights;
    }
  }
  return weights;
}

std::vector<size_t> Dispatcher::share(size_t units, const std::vector<bool>& take_part,
                                      uint64_t rotation) {
  const std::vector<double> weights = weightsFor(take_part);
  switch (options_.policy) {
    case Policy::kProportional:
      return largestRemainder(units, weights, options_.min_micro_batches, rotation);
    case Policy::kRoundRobin:
      return roundRobin(units, weights, rotation);
    case Policy::kWeightedRoundRobin:
      return weightedRoundRobin(units, weights);
    case Policy::kLeastLoaded: {
      // Queued work is in samples; the shares are in units of `units`' size.
      std::vector<double> queued(queued_.size());
      for (size_t r = 0; r < queued.size(); ++r) {
        queued[r] = queued_[r] / static_cast<double>(options_.micro_batch);
      }
      return leastLoaded(units, weights, queued);
    }
  }
  return {};
}

const StepPlan& Dispatcher::plan(size_t global_batch) {
  if (step_open_) {
    throw InvalidArgument("Dispatcher::plan: step " + std::to_string(plan_.step) +
                          " is still open (call completeStep first)");
  }
  if (global_batch == 0) throw InvalidArgument("Dispatcher::plan: global batch of 0 samples");
  if (cursor_ >= epoch_size_) {
    throw InvalidArgument("Dispatcher::plan: the epoch's " + std::to_string(epoch_size_) +
                          " samples are all assigned (call newEpoch)");
  }
  const uint64_t batch = std::min<uint64_t>(global_batch, epoch_size_ - cursor_);
  // Whole micro-batches; a last partial one (the epoch's tail) goes to whoever gets the
  // final unit.
  const size_t micro = options_.micro_batch;
  const size_t units = static_cast<size_t>((batch + micro - 1) / micro);
  const std::vector<size_t> shares = share(units, alive_, next_step_);
  plan_ = StepPlan{};
  plan_.step = next_step_++;
  plan_.samples.assign(alive_.size(), 0);
  plan_.ranges.assign(alive_.size(), {});
  uint64_t at = cursor_;
  const uint64_t end = cursor_ + batch;
  for (size_t r = 0; r < shares.size(); ++r) {
    if (shares[r] == 0) continue;
    const uint64_t stop = std::min<uint64_t>(end, at + shares[r] * micro);
    plan_.ranges[r].push_back({at, stop});
    plan_.samples[r] = static_cast<size_t>(stop - at);
    at = stop;
  }
  cursor_ = end;
  step_open_ = true;
  return plan_;
}

void Dispatcher::completeStep() {
  if (!step_open_) throw InvalidArgument("Dispatcher::completeStep: no step is open");
  done_ += plan_.total();
  step_open_ = false;
}

void Dispatcher::report(int rank, double samples, double seconds) {
  estimator_.report(rank, samples, seconds);
}

void Dispatcher::setQueued(int rank, double queued_samples) {
  if (rank < 0 || rank >= worldSize()) {
    throw InvalidArgument("Dispatcher::setQueued: no rank " + std::to_string(rank));
  }
  queued_[static_cast<size_t>(rank)] = std::max(queued_samples, 0.0);
}

const StepPlan& Dispatcher::markFailed(int rank) {
  if (!alive(rank)) {
    throw InvalidArgument(
        "Dispatcher::markFailed: rank " + std::to_string(rank) +
        (rank >= 0 && rank < worldSize() ? " has already failed" : " does not exist"));
  }
  if (liveRanks() == 1) {
    throw InvalidArgument("Dispatcher::markFailed: rank " + std::to_string(rank) +
                          " is the last live rank; nobody can take its work");
  }
  alive_[static_cast<size_t>(rank)] = false;
  if (!step_open_) return plan_;
  // Its ranges of the open step are not done: hand them to the survivors, cut in proportion
  // to the policy's shares of the orphaned samples (in whole micro-batches where possible).
  std::vector<Range> orphaned = std::move(plan_.ranges[static_cast<size_t>(rank)]);
  plan_.ranges[static_cast<size_t>(rank)].clear();
  const size_t lost = plan_.samples[static_cast<size_t>(rank)];
  plan_.samples[static_cast<size_t>(rank)] = 0;
  if (lost == 0) return plan_;
  const size_t micro = options_.micro_batch;
  const size_t units = (lost + micro - 1) / micro;
  const std::vector<size_t> shares = share(units, alive_, plan_.step + 1);
  size_t index = 0;
  uint64_t offset = 0;  // within orphaned[index]
  size_t left = lost;
  for (size_t r = 0; r < shares.size() && left > 0; ++r) {
    size_t want = std::min(shares[r] * micro, left);
    left -= want;
    plan_.samples[r] += want;
    while (want > 0) {
      const Range& source = orphaned[index];
      const uint64_t take = std::min<uint64_t>(want, source.size() - offset);
      const Range piece{source.begin + offset, source.begin + offset + take};
      auto& mine = plan_.ranges[r];
      if (!mine.empty() && mine.back().end == piece.begin) {
        mine.back().end = piece.end;  // contiguous with what it already has
      } else {
        mine.push_back(piece);
      }
      offset += take;
      want -= static_cast<size_t>(take);
      if (offset == source.size()) {
        ++index;
        offset = 0;
      }
    }
  }
  return plan_;
}

int Dispatcher::addRank(double weight) {
  if (!(weight > 0)) throw InvalidArgument("Dispatcher::addRank: weight must be > 0");
  alive_.push_back(true);
  queued_.push_back(0);
  static_weights_.push_back(weight);
  if (step_open_) {
    plan_.samples.push_back(0);
    plan_.ranges.emplace_back();
  }
  return estimator_.addRank();
}

void Dispatcher::unplan() {
  if (!step_open_) throw InvalidArgument("Dispatcher::unplan: no step is open");
  // plan() advanced the cursor by the batch and markFailed() only moves ranges between
  // ranks, so the plan's total is what goes back.
  cursor_ -= plan_.total();
  next_step_ = plan_.step;
  step_open_ = false;
  plan_ = StepPlan{};
  plan_.step = next_step_;
  plan_.samples.assign(alive_.size(), 0);
  plan_.ranges.assign(alive_.size(), {});
}

uint64_t Dispatcher::stateFingerprint() const {
  Fnv1a h;
  h.add(epoch_).add(cursor_).add(done_).add(next_step_).add(uint64_t{step_open_});
  for (size_t r = 0; r < alive_.size(); ++r) {
    h.add(uint64_t{alive_[r]});
    const double rate = estimator_.rate(static_cast<int>(r));
    uint64_t bits = 0;
    static_assert(sizeof(bits) == sizeof(rate));
    std::memcpy(&bits, &rate, sizeof(bits));
    h.add(bits).add(uint64_t{estimator_.reported(static_cast<int>(r))});
  }
  if (step_open_) h.add(plan_.fingerprint());
  return h.value();
}

void Dispatcher::newEpoch() {
  if (step_open_)
    throw InvalidArgument("Dispatcher::newEpoch: step " + std::to_string(plan_.step) +
                          " is still open");
  cursor_ = 0;
  done_ = 0;
  ++epoch_;
}

}  // namespace railshard::dispatch
