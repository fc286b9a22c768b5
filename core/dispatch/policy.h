#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace railshard::dispatch {

// How a global batch is shared out.
enum class Policy {
  kProportional,        // shares proportional to each rank's measured throughput (default)
  kRoundRobin,          // micro-batches dealt in turn: equal shares ("equal" is an alias)
  kWeightedRoundRobin,  // micro-batches dealt by static weights (smooth weighted round robin)
  kLeastLoaded,         // each micro-batch to the rank that would finish it first, counting
                        // the work already queued there (reported queue length)
  kEnergy,              // within a step-time budget (DispatchOptions::energy_budget times the
                        // fastest plan's), micro-batches to the ranks that spend the fewest
                        // joules on them (reported power); proportional where none is known
};

std::string_view name(Policy policy);
// "proportional", "round_robin" (or "equal"), "weighted_round_robin", "least_loaded",
// "energy"; ConfigError listing them otherwise.
Policy parsePolicy(const std::string& text);

// Splits `units` whole units among ranks in proportion to `weights` (a weight of 0 means the
// rank takes no part) by largest remainders, so the shares add up to `units` exactly. Each
// rank with a positive weight gets at least `min_units` when units allow it. Ties in the
// remainders go to ranks in the order rotation, rotation + 1, ... (mod n), so that with a
// rotation that changes every step no rank is always the one left short.
// InvalidArgument when a weight is negative or not finite, or every weight is 0 while units
// are to be shared.
std::vector<size_t> largestRemainder(size_t units, const std::vector<double>& weights,
                                     size_t min_units = 0, uint64_t rotation = 0);

// The same `units`, dealt one at a time: round robin starting at rank rotation % n, among
// ranks with a positive weight.
std::vector<size_t> roundRobin(size_t units, const std::vector<double>& weights, uint64_t rotation);

// Smooth weighted round robin (as in nginx): deals units one at a time to the rank with the
// highest running credit; over any window shares track the weights within one unit.
std::vector<size_t> weightedRoundRobin(size_t units, const std::vector<double>& weights);

// Each unit to the rank whose finish time (queued + assigned + 1) / rate would be smallest.
// rates[r] = 0 takes no part.
std::vector<size_t> leastLoaded(size_t units, const std::vector<double>& rates,
                                const std::vector<double>& queued);

// The fewest joules within a time budget: the fastest plan takes units / sum(rates) seconds;
// each rank may take at most rate x budget x that (whole units), and the units go to the
// ranks with the lowest joules[r] per unit first, each filled to its room (a fractional
// knapsack: optimal for this model). joules[r] = 0 (unknown) counts as the median of the
// known. rates[r] = 0 takes no part. InvalidArgument for budget < 1 or a bad rate or joule.
std::vector<size_t> energyAware(size_t units, const std::vector<double>& rates,
                                const std::vector<double>& joules, double budget);

// Holds each rank to at most caps[r] units (caps[r] < 0: no cap): what capped ranks cannot
// take goes to the others in proportion to `weights` (largest remainders), again as they fill
// up. Returns fewer units in all only when every rank with a weight is full.
std::vector<size_t> applyCaps(std::vector<size_t> shares, const std::vector<long long>& caps,
                              const std::vector<double>& weights);

}  // namespace railshard::dispatch
