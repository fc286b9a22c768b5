#include "transport/rails/rail_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace railshard::transport::rails {

RailScheduler::RailScheduler(std::vector<std::string> names, std::vector<double> initial_gbps,
                             SchedulerOptions options)
    : options_(options) {
  if (names.empty()) throw InvalidArgument("RailScheduler: no rails");
  if (names.size() != initial_gbps.size()) {
    throw InvalidArgument("RailScheduler: " + std::to_string(names.size()) + " rails but " +
                          std::to_string(initial_gbps.size()) + " speeds");
  }
  if (options_.alignment == 0) throw InvalidArgument("RailScheduler: alignment must be >= 1");
  if (!(options_.min_fraction >= 0) || options_.min_fraction * names.size() > 1) {
    throw InvalidArgument("RailScheduler: min_fraction must be in [0, 1/rails]");
  }
  if (!(options_.jump_ratio > 1) || !(options_.jump_seconds > 0) || options_.jump_samples < 1) {
    throw InvalidArgument(
        "RailScheduler: jump_ratio must be > 1, jump_seconds > 0 and jump_samples >= 1");
  }
  if (!(options_.half_life_seconds > 0)) {
    throw InvalidArgument("RailScheduler: half_life_seconds must be > 0");
  }
  double known = 0;
  int count = 0;
  for (const double g : initial_gbps) {
    if (!std::isfinite(g) || g < 0) {
      throw InvalidArgument("RailScheduler: a rail speed must be finite and >= 0");
    }
    if (g > 0) {
      known += g;
      ++count;
    }
  }
  const double fill = count > 0 ? known / count : 1;
  for (size_t i = 0; i < names.size(); ++i) {
    Rail rail;
    rail.name = names[i];
    rail.gbps = initial_gbps[i] > 0 ? initial_gbps[i] : fill;
    rails_.push_back(rail);
  }
}

const RailScheduler::Rail& RailScheduler::at(int rail) const {
  if (rail < 0 || rail >= rails()) {
    throw InvalidArgument("RailScheduler: no rail " + std::to_string(rail));
  }
  return rails_[static_cast<size_t>(rail)];
}

bool RailScheduler::up(int rail) const {
  return at(rail).up;
}
double RailScheduler::gbps(int rail) const {
  return at(rail).gbps;
}
const std::string& RailScheduler::name(int rail) const {
  return at(rail).name;
}
const std::string& RailScheduler::downReason(int rail) const {
  return at(rail).down_reason;
}

int RailScheduler::upCount() const {
  return static_cast<int>(
      std::count_if(rails_.begin(), rails_.end(), [](const Rail& r) { return r.up; }));
}

std::vector<double> RailScheduler::fractions() const {
  std::vector<double> result(rails_.size(), 0);
  double total = 0;
  for (const auto& r : rails_) total += r.up ? r.gbps : 0;
  if (total <= 0) return result;
  // Proportional, then lift rails under the floor and take the lift from the others in
  // proportion to what they have above the floor.
  const double floor = options_.min_fraction;
  double lifted = 0;
  double above = 0;
  for (size_t i = 0; i < rails_.size(); ++i) {
    if (!rails_[i].up) continue;
    result[i] = rails_[i].gbps / total;
    if (result[i] < floor) {
      lifted += floor - result[i];
      result[i] = floor;
    } else {
      above += result[i] - floor;
    }
  }
  if (lifted > 0 && above > 0) {
    for (size_t i = 0; i < rails_.size(); ++i) {
      if (rails_[i].up && result[i] > floor) result[i] -= lifted * (result[i] - floor) / above;
    }
  }
  return result;
}

double RailScheduler::fraction(int rail) const {
  at(rail);
  return fractions()[static_cast<size_t>(rail)];
}

int RailScheduler::fastest() const {
  int best = -1;
  for (int i = 0; i < rails(); ++i) {
    if (rails_[static_cast<size_t>(i)].up &&
        (best < 0 ||
         rails_[static_cast<size_t>(i)].gbps > rails_[static_cast<size_t>(best)].gbps)) {
      best = i;
    }
  }
  if (best < 0) {
    std::string names;
    for (const auto& r : rails_)
      names += (names.empty() ? "" : ", ") + r.name + " (" + r.down_reason + ")";
    throw PeerLostError("every rail is down: " + names);
  }
  return best;
}

std::vector<Piece> RailScheduler::split(size_t bytes) const {
  std::vector<Piece> pieces;
  const int fastest_rail = fastest();
  if (bytes <= options_.small_message_bytes || upCount() == 1) {
    pieces.push_back({fastest_rail, 0, bytes});
    return pieces;
  }
  // Cut points at aligned offsets; the last live rail takes what is left, so the pieces
  // cover the message exactly whatever the rounding.
  const std::vector<double> share = fractions();
  const size_t align = options_.alignment;
  int last = -1;
  for (int i = 0; i < rails(); ++i) {
    if (share[static_cast<size_t>(i)] > 0) last = i;
  }
  size_t offset = 0;
  double cumulative = 0;
  for (int i = 0; i < rails() && offset < bytes; ++i) {
    const double f = share[static_cast<size_t>(i)];
    if (f <= 0) continue;
    cumulative += f;
    size_t end = bytes;
    if (i != last) {
      end = static_cast<size_t>(std::llround(cumulative * static_cast<double>(bytes)));
      end = std::min(bytes, end / align * align);
    }
    if (end > offset) {
      pieces.push_back({i, offset, end - offset});
      offset = end;
    }
  }
  return pieces;
}

void RailScheduler::record(int rail, size_t bytes, double seconds) {
  at(rail);
  if (!(seconds > 0) || bytes == 0 || !std::isfinite(seconds)) return;
  Rail& r = rails_[static_cast<size_t>(rail)];
  const double sample = static_cast<double>(bytes) * 8 / seconds / 1e9;
  if (!r.measured) {
    r.measured = true;
    r.gbps = sample;
    return;
  }
  const int direction =
      sample > r.gbps * options_.jump_ratio ? 1 : (sample * options_.jump_ratio < r.gbps ? -1 : 0);
  if (direction == 0 || direction != r.streak) {
    r.streak = direction;
    r.streak_bytes = 0;
    r.streak_seconds = 0;
    r.streak_samples = 0;
  }
  if (direction != 0) {
    r.streak_bytes += static_cast<double>(bytes);
    r.streak_seconds += seconds;
    ++r.streak_samples;
    if (r.streak_seconds >= options_.jump_seconds || r.streak_samples >= options_.jump_samples) {
      r.gbps = r.streak_bytes * 8 / r.streak_seconds / 1e9;
      r.streak = 0;
      r.streak_bytes = 0;
      r.streak_seconds = 0;
      r.streak_samples = 0;
      return;
    }
  }
  // Time-weighted EWMA: a transfer that took `seconds` moves the estimate as much as that
  // much time of traffic should, whatever the piece sizes.
  const double keep = std::pow(0.5, seconds / options_.half_life_seconds);
  r.gbps = keep * r.gbps + (1 - keep) * sample;
}

void RailScheduler::markDown(int rail, const std::string& why) {
  at(rail);
  Rail& r = rails_[static_cast<size_t>(rail)];
  r.up = false;
  r.down_reason = why;
}

void RailScheduler::markUp(int rail, double gbps) {
  at(rail);
  Rail& r = rails_[static_cast<size_t>(rail)];
  r.up = true;
  r.down_reason.clear();
  if (gbps > 0) r.gbps = gbps;
}

}  // namespace railshard::transport::rails
