#pragma once

#include <cstdint>
#include <string>

#include "base/clock.h"
#include "base/store.h"

namespace railshard::tracing {

// How this rank's steady clock maps onto rank 0's: rank0_time = local_time + offset_ns, known
// to within uncertainty_ns. epoch_ns is rank 0's clock when the alignment ran: time 0 of the
// job's trace.
struct ClockAlignment {
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = 0;
  int64_t epoch_ns = 0;
};

// Collective over `size` ranks, through the store (the only channel every launcher gives
// before the transport exists, and the same one on every host). Rank 0 answers each other
// rank's pings in rank order; a rank keeps the offset of its fastest of `rounds` round trips,
// as NTP does: offset = t_rank0 - (t_send + t_receive) / 2, error <= round trip / 2.
// Steady clocks of one host agree already; this is for ranks on different hosts, whose trace
// would otherwise be shifted by their boot times.
ClockAlignment alignClocks(Store& store, const std::string& prefix, int rank, int size,
                           Duration timeout, int rounds = 4);

}  // namespace railshard::tracing
