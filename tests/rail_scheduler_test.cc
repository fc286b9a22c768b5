// The rail scheduler on its own: exact splits, proportional to weights, and weights that
// follow synthetic transfer timings (the multi-rail transport of #6 times real transfers).
#include "transport/rails/rail_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include <random>

#include "base/error.h"

namespace railshard::transport::rails {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void expectExactCover(const std::vector<Piece>& pieces, size_t bytes, size_t align) {
  size_t offset = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].offset, offset);
    EXPECT_GT(pieces[i].length, 0u);
    if (i + 1 < pieces.size()) {
      EXPECT_EQ((pieces[i].offset + pieces[i].length) % align, 0u);
    }
    offset += pieces[i].length;
  }
  EXPECT_EQ(offset, bytes);
}

TEST(RailScheduler, SplitsCoverEveryByteOnceInProportion) {
  RailScheduler s({"eth0", "eth1", "eth2"}, {10, 20, 70}, {.min_fraction = 0});
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t bytes = 1 + rng() % (64 << 20);
    const auto pieces = s.split(bytes);
    expectExactCover(pieces, bytes, 64);
    if (bytes > (64 << 10)) {
      ASSERT_EQ(pieces.size(), 3u);
      EXPECT_NEAR(static_cast<double>(pieces[0].length), 0.1 * bytes, 64.0 + 1);
      EXPECT_NEAR(static_cast<double>(pieces[2].length), 0.7 * bytes, 128.0 + 1);
    }
  }
  // Small messages go whole to the fastest rail.
  EXPECT_THAT(s.split(4096), ElementsAre(Piece{2, 0, 4096}));
  // An empty message still travels (its tag is checked): one empty piece, on the fastest rail.
  EXPECT_THAT(s.split(0), ElementsAre(Piece{2, 0, 0}));
  EXPECT_EQ(s.fastest(), 2);
  s.markDown(2, "cable pulled");
  EXPECT_EQ(s.fastest(), 1);
  EXPECT_THAT(s.split(0), ElementsAre(Piece{1, 0, 0}));
}

TEST(RailScheduler, EveryLiveRailKeepsAMinimumShare) {
  RailScheduler s({"fast", "slow"}, {100, 1}, {.min_fraction = 0.05});
  EXPECT_NEAR(s.fraction(1), 0.05, 1e-12);
  EXPECT_NEAR(s.fraction(0), 0.95, 1e-12);
  const auto pieces = s.split(1 << 20);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_NEAR(static_cast<double>(pieces[1].length), 0.05 * (1 << 20), 64);
}

TEST(RailScheduler, UnknownSpeedsStartAtTheMeanOfTheKnownOnes) {
  RailScheduler s({"a", "b", "c"}, {0, 4, 2});
  EXPECT_DOUBLE_EQ(s.gbps(0), 3);
  RailScheduler none({"a", "b"}, {0, 0});
  EXPECT_DOUBLE_EQ(none.fraction(0), 0.5);
  EXPECT_THROW(RailScheduler({"a"}, {1, 2}), InvalidArgument);
  EXPECT_THROW(RailScheduler({"a"}, {-1}), InvalidArgument);
}

// Rails with true rates (Gbit/s) running one striped message at a time: each piece takes
// length / rate; the message takes as long as its slowest piece.
double simulate(RailScheduler& s, const std::vector<double>& rates, double seconds_of_traffic) {
  double elapsed = 0;
  while (elapsed < seconds_of_traffic) {
    const auto pieces = s.split(64 << 20);
    double slowest = 0;
    for (const Piece& p : pieces) {
      const double t =
          static_cast<double>(p.length) * 8 / (rates[static_cast<size_t>(p.rail)] * 1e9);
      s.record(p.rail, p.length, t);
      slowest = std::max(slowest, t);
    }
    elapsed += slowest;
  }
  return elapsed;
}

TEST(RailScheduler, WeightsConvergeOnMeasuredRatesAndFollowAChange) {
  // Nominal speeds say 10 + 10 (veth); the rails are really shaped to 2 and 0.5 Gbit/s.
  RailScheduler s({"rail0", "rail1"}, {10, 10});
  simulate(s, {2.0, 0.5}, 2.0);
  EXPECT_NEAR(s.fraction(0) / s.fraction(1), 4.0, 0.4);  // within 10% after 2 s of traffic
  EXPECT_NEAR(s.gbps(0), 2.0, 0.2);
  // Rail 1 is reshaped to 2 Gbit/s: within 10% of 1:1 after another 2 s.
  simulate(s, {2.0, 2.0}, 2.0);
  EXPECT_NEAR(s.fraction(0) / s.fraction(1), 1.0, 0.1);
  // And a message over the converged split takes close to the ideal time.
  const auto pieces = s.split(64 << 20);
  double slowest = 0;
  for (const Piece& p : pieces) slowest = std::max(slowest, p.length * 8 / 2e9);
  EXPECT_LT(slowest, 1.1 * (64 << 20) * 8 / 4e9);
}

// What the TCP transport feeds it: frequent samples (an ack every ~256 KiB) while every rail
// is loaded. Returns the seconds of traffic until both estimates are within 10% of the truth.
double secondsToConverge(RailScheduler& s, const std::vector<double>& rates) {
  double elapsed = 0;
  auto close = [&] {
    for (size_t i = 0; i < rates.size(); ++i) {
      if (std::abs(s.gbps(static_cast<int>(i)) / rates[i] - 1) > 0.1) return false;
    }
    return true;
  };
  constexpr double kTick = 0.002;  // every rail acknowledges what it moved in 2 ms
  while (!close() && elapsed < 10) {
    for (size_t i = 0; i < rates.size(); ++i) {
      s.record(static_cast<int>(i), static_cast<size_t>(rates[i] * 1e9 / 8 * kTick), kTick);
    }
    elapsed += kTick;
  }
  return elapsed;
}

TEST(RailScheduler, ARailThatChangesByMoreThanTheJumpRatioIsFollowedWithinAFewTenthsOfASecond) {
  RailScheduler s({"rail0", "rail1"}, {10, 10});  // nominal 10 + 10, really 2 + 0.5
  EXPECT_LT(secondsToConverge(s, {2.0, 0.5}), 0.3);
  EXPECT_LT(secondsToConverge(s, {0.5, 2.0}), 0.3);  // swapped by tc
  // A change under the jump ratio is followed by the EWMA: slower, but well within 2 s.
  const double drift = secondsToConverge(s, {0.4, 2.0});
  EXPECT_GT(drift, 0.05);
  EXPECT_LT(drift, 2.0);
  // One outlier sample (a latency-bound ack) does not move the estimate much.
  const double before = s.gbps(0);
  s.record(0, 4 << 10, 0.01);
  EXPECT_NEAR(s.gbps(0), before, 0.05 * before);
}

TEST(RailScheduler, FirstMeasurementReplacesTheNominalSpeed) {
  RailScheduler s({"rail0", "rail1"}, {10, 10});
  s.record(1, 1 << 20, (1 << 20) * 8 / 0.5e9);  // 1 MiB at 0.5 Gbit/s
  EXPECT_DOUBLE_EQ(s.gbps(1), 0.5);
  EXPECT_DOUBLE_EQ(s.gbps(0), 10);              // not measured yet
  s.record(1, 1 << 20, (1 << 20) * 8 / 0.6e9);  // from now on smoothed
  EXPECT_GT(s.gbps(1), 0.5);
  EXPECT_LT(s.gbps(1), 0.6);
}

TEST(RailScheduler, DownRailsGetNothingAndAllDownIsPeerLost) {
  RailScheduler s({"eth0", "eth1"}, {1, 1});
  s.markDown(0, "connection reset");
  EXPECT_FALSE(s.up(0));
  EXPECT_THAT(s.split(1 << 20), ElementsAre(Piece{1, 0, 1 << 20}));
  EXPECT_EQ(s.fraction(0), 0);
  s.markDown(1, "stalled 2 s");
  try {
    s.split(100);
    FAIL();
  } catch (const PeerLostError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("every rail is down: eth0 (connection reset), eth1 (stalled 2 s)"));
  }
  EXPECT_THROW(s.split(0), PeerLostError);  // an empty message needs a rail too
  EXPECT_THROW(s.fastest(), PeerLostError);
  s.markUp(0, 3);
  EXPECT_DOUBLE_EQ(s.gbps(0), 3);
  EXPECT_EQ(s.split(100).front().rail, 0);
}

}  // namespace
}  // namespace railshard::transport::rails
