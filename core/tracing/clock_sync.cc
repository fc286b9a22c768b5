#include "core/tracing/clock_sync.h"

#include <limits>

#include "base/trace.h"

namespace railshard::tracing {

namespace {

std::string key(const std::string& prefix, int rank, int round, const char* what) {
  return prefix + "/clock/" + std::to_string(rank) + "/" + std::to_string(round) + "/" + what;
}

}  // namespace

ClockAlignment alignClocks(Store& store, const std::string& prefix, int rank, int size,
                           Duration timeout, int rounds) {
  ClockAlignment result;
  if (rank == 0) {
    for (int r = 1; r < size; ++r) {
      for (int i = 0; i < rounds; ++i) {
        store.getString(key(prefix, r, i, "ping"), timeout);
        store.setString(key(prefix, r, i, "pong"), std::to_string(trace::now()), timeout);
      }
    }
    result.epoch_ns = trace::now();
    store.setString(prefix + "/clock/epoch", std::to_string(result.epoch_ns), timeout);
    return result;
  }
  int64_t best_rtt = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < rounds; ++i) {
    const int64_t sent = trace::now();
    store.setString(key(prefix, rank, i, "ping"), "1", timeout);
    const int64_t remote = std::stoll(store.getString(key(prefix, rank, i, "pong"), timeout));
    const int64_t received = trace::now();
    const int64_t rtt = received - sent;
    if (rtt < best_rtt) {
      best_rtt = rtt;
      result.offset_ns = remote - (sent + received) / 2;
      result.uncertainty_ns = rtt / 2;
    }
  }
  result.epoch_ns = std::stoll(store.getString(prefix + "/clock/epoch", timeout));
  return result;
}

}  // namespace railshard::tracing
