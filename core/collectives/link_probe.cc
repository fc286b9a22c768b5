#include "core/collectives/link_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "core/collectives/shm_engine.h"
#include "kernels/reduce.h"

namespace railshard::collectives {

namespace {

// Best of this many timings: the first warms the pages and caches, and on a shared machine a
// later one may be preempted; the fastest is what the hardware does.
constexpr int kTimings = 3;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

double measureCopyGBps(size_t bytes) {
  std::vector<uint8_t> from(bytes, 1);
  std::vector<uint8_t> to(bytes, 0);
  double best = 0;
  for (int i = 0; i < kTimings; ++i) {
    const auto start = Clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    const double seconds = secondsSince(start);
    if (seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds / 1e9);
    from[static_cast<size_t>(i) % bytes] = to[bytes - 1];  // keeps the copies observable
  }
  return best;
}

double measureReduceGBps(size_t bytes) {
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  std::vector<float> a(count, 1.0f);
  std::vector<float> b(count, 2.0f);
  std::vector<float> out(count, 0.0f);
  double best = 0;
  for (int i = 0; i < kTimings; ++i) {
    const auto start = Clock::now();
    kernels::reduce(out.data(), a.data(), b.data(), count, DataType::kFloat32, ReduceOp::kSum);
    const double seconds = secondsSince(start);
    if (seconds > 0)
      best = std::max(best, static_cast<double>(count * sizeof(float)) / seconds / 1e9);
    a[static_cast<size_t>(i) % count] = out[count - 1];
  }
  return best;
}

double measureHandOffMicros(ShmEngine& engine, const transport::MessageTag& tag, int rounds) {
  double fastest = 0;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    engine.barrier(tag);
    const double micros = secondsSince(start) * 1e6;
    if (i == 0 || micros < fastest) fastest = micros;
  }
  return fastest;
}

ReadProbe probeCrossRead(ShmEngine& engine, const transport::MessageTag& tag, size_t bytes) {
  // More ranks than cores on any rank: nobody reads across whatever this finds (a rank that
  // reads while its peer waits for a core loses), so no timing; all learn it from one flag.
  double lacks_core = engine.hasCoreEach() ? 0 : 1;
  engine.allreduceDirect(&lacks_core, &lacks_core, 1, DataType::kFloat64, ReduceOp::kMax, tag);
  if (lacks_core != 0) return {};
  const auto [single_copy, cross_read] = engine.singleCopy();
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  std::vector<float> send(count, 1.0f);
  std::vector<float> recv(count, 0.0f);
  // Alternating, each way once untimed first (page faults, caches): both ways see the same
  // machine load, and the fastest of each is what the memory system does.
  double best[2] = {0, 0};  // staged, across
  for (int i = 0; i < kTimings; ++i) {
    for (int across = 0; across < 2; ++across) {
      engine.setSingleCopy(across != 0 ? bytes : 0, across != 0);
      engine.barrier(tag);
      const auto start = Clock::now();
      engine.allreduceReduceScatterGather(send.data(), recv.data(), count, DataType::kFloat32,
                                          ReduceOp::kSum, tag);
      const double micros = secondsSince(start) * 1e6;
      if (i > 0 && (best[across] == 0 || micros < best[across])) best[across] = micros;
    }
  }
  engine.allreduceDirect(best, best, 2, DataType::kFloat64, ReduceOp::kMax, tag);
  engine.setSingleCopy(single_copy, cross_read);
  return ReadProbe{best[0], best[1]};
}

}  // namespace railshard::collectives
