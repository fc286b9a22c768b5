#include "core/dispatch/dispatcher.h"

#include <algorithm>
#include <cmath>
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
  options.energy_budget = config.energy_budget;
  return options;
}

Dispatcher::Dispatcher(int world_size, uint64_t epoch_size, DispatchOptions options)
    : options_(std::move(options)),
      epoch_size_(epoch_size),
      alive_(static_cast<size_t>(std::max(world_size, 0)), true),
      load_(alive_.size()),
      joules_per_sample_(alive_.size(), 0),
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
  if (!(options_.energy_budget >= 1) || !std::isfinite(options_.energy_budget)) {
    throw InvalidArgument("Dispatcher: energy_budget must be >= 1 (times the fastest plan), got " +
                          std::to_string(options_.energy_budget));
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
    case Policy::kLeastLoaded:
    case Policy::kEnergy: {
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

std::vector<long long> Dispatcher::capsInUnits() const {
  std::vector<long long> caps(load_.size(), -1);
  for (size_t r = 0; r < caps.size(); ++r) {
    if (load_[r].cap_samples > 0) {
      caps[r] =
          static_cast<long long>(load_[r].cap_samples / static_cast<double>(options_.micro_batch));
    }
  }
  return caps;
}

std::vector<size_t> Dispatcher::share(size_t units, const std::vector<bool>& take_part,
                                      uint64_t rotation) {
  const std::vector<double> weights = weightsFor(take_part);
  return applyCaps(policyShares(units, weights, rotation), capsInUnits(), weights);
}

std::vector<size_t> Dispatcher::policyShares(size_t units, const std::vector<double>& weights,
                                             uint64_t rotation) const {
  switch (options_.policy) {
    case Policy::kProportional:
      return largestRemainder(units, weights, options_.min_micro_batches, rotation);
    case Policy::kRoundRobin:
      return roundRobin(units, weights, rotation);
    case Policy::kWeightedRoundRobin:
      return weightedRoundRobin(units, weights);
    case Policy::kLeastLoaded: {
      // Queued work is in samples; the shares are in units of `units`' size.
      std::vector<double> queued(load_.size());
      for (size_t r = 0; r < queued.size(); ++r) {
        queued[r] = load_[r].queued_samples / static_cast<double>(options_.micro_batch);
      }
      return leastLoaded(units, weights, queued);
    }
    case Policy::kEnergy: {
      std::vector<double> joules(joules_per_sample_.size());
      bool any = false;
      for (size_t r = 0; r < joules.size(); ++r) {
        joules[r] = joules_per_sample_[r] * static_cast<double>(options_.micro_batch);
        any = any || (weights[r] > 0 && joules[r] > 0);
      }
      // Nobody's energy known yet (no power source): the fastest plan.
      if (!any) return largestRemainder(units, weights, options_.min_micro_batches, rotation);
      return energyAware(units, weights, joules, options_.energy_budget);
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
  uint64_t returned = 0;
  for (const Range& range : returned_) returned += range.size();
  if (cursor_ >= epoch_size_ && returned == 0) {
    throw InvalidArgument("Dispatcher::plan: the epoch's " + std::to_string(epoch_size_) +
                          " samples are all assigned (call newEpoch)");
  }
  uint64_t batch = std::min<uint64_t>(global_batch, returned + epoch_size_ - cursor_);
  // Whole micro-batches; a last partial one (the epoch's tail) goes to whoever gets the
  // final unit.
  const size_t micro = options_.micro_batch;
  size_t units = static_cast<size_t>((batch + micro - 1) / micro);
  // Memory caps can hold the step below the global batch; the rest of the epoch waits.
  uint64_t room = 0;
  bool capped_everywhere = true;
  const std::vector<long long> caps = capsInUnits();
  for (size_t r = 0; r < alive_.size(); ++r) {
    if (!alive_[r]) continue;
    if (caps[r] < 0) capped_everywhere = false;
    room += static_cast<uint64_t>(std::max(caps[r], 0LL));
  }
  if (capped_everywhere && room < units) {
    if (room == 0) {
      throw InvalidArgument("Dispatcher::plan: no live rank's memory holds a micro-batch of " +
                            std::to_string(micro) + " samples (their cap_samples reports)");
    }
    units = static_cast<size_t>(room);
    batch = std::min<uint64_t>(batch, units * micro);
  }
  const std::vector<size_t> shares = share(units, alive_, next_step_);
  plan_ = StepPlan{};
  plan_.step = next_step_++;
  plan_.samples.assign(alive_.size(), 0);
  plan_.ranges.assign(alive_.size(), {});
  // Samples given back (requeue()) first, in their order, then the epoch's next ones.
  std::vector<Range> sources;
  uint64_t from_returned = std::min(batch, returned);
  for (const Range& range : returned_) {
    if (from_returned == 0) break;
    const uint64_t take = std::min(from_returned, range.size());
    sources.push_back({range.begin, range.begin + take});
    from_returned -= take;
  }
  taken_returned_ = sources;
  const uint64_t fresh = batch - std::min(batch, returned);
  if (fresh > 0) sources.push_back({cursor_, cursor_ + fresh});
  size_t source = 0;
  uint64_t offset = 0;
  uint64_t left = batch;
  for (size_t r = 0; r < shares.size() && left > 0; ++r) {
    uint64_t want = std::min<uint64_t>(left, shares[r] * micro);
    left -= want;
    plan_.samples[r] = static_cast<size_t>(want);
    while (want > 0) {
      const Range& from = sources[source];
      const uint64_t take = std::min(want, from.size() - offset);
      auto& mine = plan_.ranges[r];
      const Range piece{from.begin + offset, from.begin + offset + take};
      if (!mine.empty() && mine.back().end == piece.begin) {
        mine.back().end = piece.end;
      } else {
        mine.push_back(piece);
      }
      offset += take;
      want -= take;
      if (offset == from.size()) {
        ++source;
        offset = 0;
      }
    }
  }
  // What was taken from the returned ranges leaves them.
  uint64_t consumed = std::min(batch, returned);
  while (consumed > 0) {
    Range& front = returned_.front();
    const uint64_t take = std::min(consumed, front.size());
    front.begin += take;
    consumed -= take;
    if (front.size() == 0) returned_.erase(returned_.begin());
  }
  cursor_ += fresh;
  step_open_ = true;
  return plan_;
}

void Dispatcher::requeue(const std::vector<Range>& ranges) {
  if (step_open_) {
    throw InvalidArgument("Dispatcher::requeue: step " + std::to_string(plan_.step) +
                          " is open; requeue a completed step's samples");
  }
  uint64_t total = 0;
  for (const Range& range : ranges) {
    if (range.end <= range.begin || range.end > cursor_) {
      throw InvalidArgument("Dispatcher::requeue: range [" + std::to_string(range.begin) + ", " +
                            std::to_string(range.end) + ") was not handed out (cursor at " +
                            std::to_string(cursor_) + ")");
    }
    for (const Range& back : returned_) {
      if (range.begin < back.end && back.begin < range.end) {
        throw InvalidArgument("Dispatcher::requeue: range [" + std::to_string(range.begin) + ", " +
                              std::to_string(range.end) + ") is already requeued");
      }
    }
    total += range.size();
  }
  if (total > done_) {
    throw InvalidArgument("Dispatcher::requeue: " + std::to_string(total) +
                          " samples back, but only " + std::to_string(done_) + " are done");
  }
  done_ -= total;
  returned_.insert(returned_.end(), ranges.begin(), ranges.end());
  std::sort(returned_.begin(), returned_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
}

void Dispatcher::completeStep() {
  if (!step_open_) throw InvalidArgument("Dispatcher::completeStep: no step is open");
  done_ += plan_.total();
  step_open_ = false;
}

void Dispatcher::report(int rank, double samples, double seconds, double energy_joules) {
  if (!std::isfinite(energy_joules) || energy_joules < 0) {
    throw InvalidArgument("rank " + std::to_string(rank) + " reported energy_joules = " +
                          std::to_string(energy_joules) + " (must be a finite number >= 0)");
  }
  estimator_.report(rank, samples, seconds);
  if (energy_joules > 0 && samples > 0) {
    // Smoothed as the rates are (half the weight per step): one noisy step moves it half way.
    double& j = joules_per_sample_[static_cast<size_t>(rank)];
    const double sample = energy_joules / samples;
    j = j == 0 ? sample : (j + sample) / 2;
  }
}

void Dispatcher::setLoad(int rank, const LoadSignals& load) {
  if (rank < 0 || rank >= worldSize()) {
    throw InvalidArgument("Dispatcher::setLoad: no rank " + std::to_string(rank));
  }
  validate(load, "rank " + std::to_string(rank));
  load_[static_cast<size_t>(rank)] = load;
  estimator_.setCapacity(rank, load.cpu_quota_cores);
}

const LoadSignals& Dispatcher::load(int rank) const {
  if (rank < 0 || rank >= worldSize()) {
    throw InvalidArgument("Dispatcher::load: no rank " + std::to_string(rank));
  }
  return load_[static_cast<size_t>(rank)];
}

double Dispatcher::joulesPerSample(int rank) const {
  if (rank < 0 || rank >= worldSize()) {
    throw InvalidArgument("Dispatcher::joulesPerSample: no rank " + std::to_string(rank));
  }
  return joules_per_sample_[static_cast<size_t>(rank)];
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
  load_.emplace_back();
  joules_per_sample_.push_back(0);
  static_weights_.push_back(weight);
  if (step_open_) {
    plan_.samples.push_back(0);
    plan_.ranges.emplace_back();
  }
  return estimator_.addRank();
}

void Dispatcher::unplan() {
  if (!step_open_) throw InvalidArgument("Dispatcher::unplan: no step is open");
  // plan() advanced the cursor by the batch less what it took from returned ranges, and
  // markFailed() only moves ranges between ranks: both go back where they came from.
  uint64_t from_returned = 0;
  for (const Range& range : taken_returned_) from_returned += range.size();
  cursor_ -= plan_.total() - from_returned;
  returned_.insert(returned_.end(), taken_returned_.begin(), taken_returned_.end());
  std::sort(returned_.begin(), returned_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  taken_returned_.clear();
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
  for (const Range& range : returned_) h.add(range.begin).add(range.end);
  for (size_t r = 0; r < alive_.size(); ++r) {
    h.add(uint64_t{alive_[r]});
    const double rate = estimator_.rate(static_cast<int>(r));
    uint64_t bits = 0;
    static_assert(sizeof(bits) == sizeof(rate));
    std::memcpy(&bits, &rate, sizeof(bits));
    h.add(bits).add(uint64_t{estimator_.reported(static_cast<int>(r))});
    // What else the next plans read: queue, cap, energy.
    for (const double value :
         {load_[r].queued_samples, load_[r].cap_samples, joules_per_sample_[r]}) {
      std::memcpy(&bits, &value, sizeof(bits));
      h.add(bits);
    }
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
  returned_.clear();
  ++epoch_;
}

}  // namespace railshard::dispatch
