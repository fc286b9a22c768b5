#pragma once

#include <cstddef>

namespace railshard::bench {

// One timed all-reduce of one size, out-of-place or in-place.
struct PerfMeasurement {
  double seconds = 0;  // per iteration, combined over ranks per -a
  size_t wrong = 0;    // elements that failed validation, summed over ranks
};

// One row of allreduce_perf's table.
struct PerfRow {
  size_t bytes = 0;  // count * element size
  size_t count = 0;
  PerfMeasurement out_of_place;
  PerfMeasurement in_place;
};

// nccl-tests' definitions: algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce,
// the traffic each rank's links must carry, comparable across world sizes. GB = 1e9 bytes.
inline double busFactor(int ranks) {
  return ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0;
}
inline double algbwGBps(const PerfMeasurement& m, size_t bytes) {
  return m.seconds > 0 ? static_cast<double>(bytes) / m.seconds / 1e9 : 0;
}
inline double busbwGBps(const PerfMeasurement& m, size_t bytes, int ranks) {
  return algbwGBps(m, bytes) * busFactor(ranks);
}
// busbw as a fraction of a link limit in Gbit/s (bytes -> bits: x8).
inline double efficiency(double busbw_gbps_bytes, double limit_gbits) {
  return busbw_gbps_bytes * 8 / limit_gbits;
}

}  // namespace railshard::bench
