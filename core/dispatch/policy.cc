#include "core/dispatch/policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace railshard::dispatch {

std::string_view name(Policy policy) {
  switch (policy) {
    case Policy::kProportional:
      return "proportional";
    case Policy::kRoundRobin:
      return "round_robin";
    case Policy::kWeightedRoundRobin:
      return "weighted_round_robin";
    case Policy::kLeastLoaded:
      return "least_loaded";
    case Policy::kEnergy:
      return "energy";
  }
  return "unknown";
}

Policy parsePolicy(const std::string& text) {
  if (text == "proportional") return Policy::kProportional;
  if (text == "round_robin" || text == "equal") return Policy::kRoundRobin;
  if (text == "weighted_round_robin") return Policy::kWeightedRoundRobin;
  if (text == "least_loaded") return Policy::kLeastLoaded;
  if (text == "energy") return Policy::kEnergy;
  throw ConfigError("unknown dispatch policy '" + text +
                    "' (choose proportional, round_robin (or equal), weighted_round_robin, "
                    "least_loaded, energy)");
}

namespace {

void checkWeights(const std::vector<double>& weights, const char* what) {
  for (size_t r = 0; r < weights.size(); ++r) {
    if (!std::isfinite(weights[r]) || weights[r] < 0) {
      throw InvalidArgument(std::string(what) + ": weight of rank " + std::to_string(r) + " is " +
                            std::to_string(weights[r]) + " (must be finite and >= 0)");
    }
  }
}

size_t participants(const std::vector<double>& weights) {
  return static_cast<size_t>(
      std::count_if(weights.begin(), weights.end(), [](double w) { return w > 0; }));
}

void requireSomeone(size_t units, size_t n, const char* what) {
  if (units > 0 && n == 0) {
    throw InvalidArgument(std::string(what) + ": " + std::to_string(units) +
                          " units to share but no rank takes part");
  }
}

}  // namespace

std::vector<size_t> largestRemainder(size_t units, const std::vector<double>& weights,
                                     size_t min_units, uint64_t rotation) {
  checkWeights(weights, "largestRemainder");
  const size_t n = weights.size();
  std::vector<size_t> shares(n, 0);
  const size_t live = participants(weights);
  requireSomeone(units, live, "largestRemainder");
  if (units == 0) return shares;
  // The guaranteed minimum first, when there is enough to go round.
  size_t floor_each = std::min(min_units, units / live);
  size_t left = units - floor_each * live;
  for (size_t r = 0; r < n; ++r) {
    if (weights[r] > 0) shares[r] = floor_each;
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> remainder(n, -1);
  size_t given = 0;
  for (size_t r = 0; r < n; ++r) {
    if (weights[r] <= 0) continue;
    const double quota = static_cast<double>(left) * weights[r] / total;
    const auto whole = static_cast<size_t>(std::floor(quota));
    shares[r] += whole;
    given += whole;
    remainder[r] = quota - static_cast<double>(whole);
  }
  // Largest remainders get the units floating-point floors left over; ties in rotation order.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  const auto position = [&](size_t r) { return (r + n - rotation % n) % n; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (remainder[a] != remainder[b]) return remainder[a] > remainder[b];
    return position(a) < position(b);
  });
  for (size_t i = 0; given < left; i = (i + 1) % n) {
    if (weights[order[i]] <= 0) continue;
    ++shares[order[i]];
    ++given;
  }
  return shares;
}

std::vector<size_t> roundRobin(size_t units, const std::vector<double>& weights,
                               uint64_t rotation) {
  checkWeights(weights, "roundRobin");
  const size_t n = weights.size();
  std::vector<size_t> shares(n, 0);
  const size_t live = participants(weights);
  requireSomeone(units, live, "roundRobin");
  if (units == 0) return shares;
  // Every live rank gets units / live; the rest go one each from the rotation point on.
  for (size_t r = 0; r < n; ++r) {
    if (weights[r] > 0) shares[r] = units / live;
  }
  size_t extra = units % live;
  for (size_t i = 0; extra > 0; ++i) {
    const size_t r = (rotation + i) % n;
    if (weights[r] > 0) {
      ++shares[r];
      --extra;
    }
  }
  return shares;
}

std::vector<size_t> weightedRoundRobin(size_t units, const std::vector<double>& weights) {
  checkWeights(weights, "weightedRoundRobin");
  const size_t n = weights.size();
  std::vector<size_t> shares(n, 0);
  requireSomeone(units, participants(weights), "weightedRoundRobin");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> credit(n, 0);
  for (size_t u = 0; u < units; ++u) {
    size_t best = n;
    for (size_t r = 0; r < n; ++r) {
      if (weights[r] <= 0) continue;
      credit[r] += weights[r];
      if (best == n || credit[r] > credit[best]) best = r;
    }
    credit[best] -= total;
    ++shares[best];
  }
  return shares;
}

std::vector<size_t> leastLoaded(size_t units, const std::vector<double>& rates,
                                const std::vector<double>& queued) {
  checkWeights(rates, "leastLoaded");
  const size_t n = rates.size();
  std::vector<size_t> shares(n, 0);
  requireSomeone(units, participants(rates), "leastLoaded");
  for (size_t u = 0; u < units; ++u) {
    size_t best = n;
    double best_finish = 0;
    for (size_t r = 0; r < n; ++r) {
      if (rates[r] <= 0) continue;
      const double queue = r < queued.size() ? std::max(queued[r], 0.0) : 0.0;
      const double finish = (queue + static_cast<double>(shares[r]) + 1) / rates[r];
      if (best == n || finish < best_finish) {
        best = r;
        best_finish = finish;
      }
    }
    ++shares[best];
  }
  return shares;
}

std::vector<size_t> energyAware(size_t units, const std::vector<double>& rates,
                                const std::vector<double>& joules, double budget) {
  checkWeights(rates, "energyAware");
  checkWeights(joules, "energyAware (joules)");
  if (!(budget >= 1) || !std::isfinite(budget)) {
    throw InvalidArgument("energyAware: the time budget must be >= 1 times the fastest plan, got " +
                          std::to_string(budget));
  }
  const size_t n = rates.size();
  std::vector<size_t> shares(n, 0);
  requireSomeone(units, participants(rates), "energyAware");
  if (units == 0) return shares;
  std::vector<double> known;
  for (size_t r = 0; r < n; ++r) {
    if (rates[r] > 0 && r < joules.size() && joules[r] > 0) known.push_back(joules[r]);
  }
  double fill = 0;
  if (!known.empty()) {
    std::nth_element(known.begin(), known.begin() + static_cast<long>(known.size() / 2),
                     known.end());
    fill = known[known.size() / 2];
  }
  const double total_rate = std::accumulate(rates.begin(), rates.end(), 0.0);
  const double seconds = budget * static_cast<double>(units) / total_rate;
  std::vector<size_t> order;
  for (size_t r = 0; r < n; ++r) {
    if (rates[r] > 0) order.push_back(r);
  }
  const auto cost = [&](size_t r) { return r < joules.size() && joules[r] > 0 ? joules[r] : fill; };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost(a) < cost(b); });
  size_t left = units;
  for (const size_t r : order) {
    const auto room = static_cast<size_t>(std::floor(rates[r] * seconds + 1e-9));
    shares[r] = std::min(room, left);
    left -= shares[r];
  }
  // Whole units can leave a few over (rooms rounded down): to the cheapest ranks by speed.
  if (left > 0) {
    const std::vector<size_t> rest = largestRemainder(left, rates);
    for (size_t r = 0; r < n; ++r) shares[r] += rest[r];
  }
  return shares;
}

std::vector<size_t> applyCaps(std::vector<size_t> shares, const std::vector<long long>& caps,
                              const std::vector<double>& weights) {
  const size_t n = shares.size();
  const auto capOf = [&](size_t r) { return r < caps.size() ? caps[r] : -1LL; };
  size_t excess = 0;
  for (size_t r = 0; r < n; ++r) {
    const long long cap = capOf(r);
    if (cap >= 0 && shares[r] > static_cast<size_t>(cap)) {
      excess += shares[r] - static_cast<size_t>(cap);
      shares[r] = static_cast<size_t>(cap);
    }
  }
  while (excess > 0) {
    // Ranks with room, by their weights.
    std::vector<double> open(n, 0);
    for (size_t r = 0; r < n; ++r) {
      const long long cap = capOf(r);
      if (r < weights.size() && weights[r] > 0 &&
          (cap < 0 || shares[r] < static_cast<size_t>(cap))) {
        open[r] = weights[r];
      }
    }
    if (participants(open) == 0) break;  // everyone is full: fewer units this step
    const std::vector<size_t> extra = largestRemainder(excess, open);
    excess = 0;
    for (size_t r = 0; r < n; ++r) {
      shares[r] += extra[r];
      const long long cap = capOf(r);
      if (cap >= 0 && shares[r] > static_cast<size_t>(cap)) {
        excess += shares[r] - static_cast<size_t>(cap);
        shares[r] = static_cast<size_t>(cap);
      }
    }
  }
  return shares;
}

}  // namespace railshard::dispatch
