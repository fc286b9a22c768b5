#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace railshard::transport::rails {

// One piece of a striped message: bytes [offset, offset + length) go over `rail`.
struct Piece {
  int rail = 0;
  size_t offset = 0;
  size_t length = 0;
  bool operator==(const Piece&) const = default;
};

struct SchedulerOptions {
  // Messages up to this size go whole to the fastest rail: striping them would only add
  // per-piece latency.
  size_t small_message_bytes = 64 << 10;
  // Piece boundaries are multiples of this (whole cache lines; whole elements of any dtype).
  size_t alignment = 64;
  // Every live rail gets at least this fraction of a striped message, so its rate keeps being
  // measured and a rail that got faster is noticed.
  double min_fraction = 0.05;
  // Weight of the past halves every this many seconds of a rail's transfer time.
  double half_life_seconds = 0.25;
  // A rail whose samples all differ from its estimate by more than this factor, in the same
  // direction, for jump_seconds of transfer time or jump_samples samples in a row has
  // changed (reshaped, congested, freed): its estimate jumps to what those samples measured
  // instead of drifting there. (Counting samples matters for a rail that just got faster:
  // it carries a small share, so its transfer time accrues slowly.)
  double jump_ratio = 1.3;
  double jump_seconds = 0.1;
  int jump_samples = 8;
};

// Splits messages across rails in proportion to each rail's estimated bandwidth and keeps the
// estimates current from completed transfers. Pure logic: no sockets, no clock (callers time
// the transfers), so it can be tested on synthetic timings. Not thread-safe.
class RailScheduler {
 public:
  // initial_gbps: a starting estimate per rail (nominal speed or probe); 0 = unknown, taken
  // as the mean of the known ones (1 when none is known). Names are for logs and errors.
  RailScheduler(std::vector<std::string> names, std::vector<double> initial_gbps,
                SchedulerOptions options = {});

  // Pieces covering [0, bytes) exactly, in offset order, over rails that are up. A zero-byte
  // message is one empty piece on the fastest rail: it still travels, carrying the tag the
  // receiver checks. PeerLostError naming every rail and why it is down when none is up.
  std::vector<Piece> split(size_t bytes) const;
  // The fastest rail that is up: where small messages, acknowledgements and reports go.
  // PeerLostError as split() when none is up.
  int fastest() const;
  // A piece of `bytes` took `seconds` on `rail` (from hand-off to completion). The first
  // sample of a rail replaces its starting estimate outright: nominal speeds are routinely
  // off by several times (a veth says 10 Gbit/s; a shared or shaped NIC its link rate).
  void record(int rail, size_t bytes, double seconds);
  // The rail failed or stalled: it gets no more pieces until markUp.
  void markDown(int rail, const std::string& why);
  void markUp(int rail, double gbps = 0);

  int rails() const { return static_cast<int>(rails_.size()); }
  bool up(int rail) const;
  int upCount() const;
  double gbps(int rail) const;  // current estimate
  const std::string& name(int rail) const;
  const std::string& downReason(int rail) const;
  // Fraction of a large message `rail` gets now (0 when down).
  double fraction(int rail) const;

 private:
  struct Rail {
    std::string name;
    double gbps = 1;
    bool up = true;
    std::string down_reason;
    bool measured = false;  // false: the estimate is still the starting (nominal) speed
    int streak = 0;         // +1: samples above the estimate by jump_ratio, -1 below, 0 none
    double streak_bytes = 0;
    double streak_seconds = 0;
    int streak_samples = 0;
  };
  const Rail& at(int rail) const;
  std::vector<double> fractions() const;

  SchedulerOptions options_;
  std::vector<Rail> rails_;
};

}  // namespace railshard::transport::rails
