#pragma once

#include <atomic>
#include <cstdint>

#include "base/clock.h"

namespace railshard::transport::messaging {

// A 32-bit counter in shared memory that other processes wait on: waiters spin briefly, then
// sleep in the kernel (futex), so oversubscribed ranks give their core to the rank they wait
// for instead of burning it. Counters only grow (modulo 2^32); "reached" compares with wrap.
class FutexWord {
 public:
  uint32_t load() const { return value_.load(std::memory_order_acquire); }
  // Publishes `value` and wakes every sleeper when anyone might be sleeping.
  void store(uint32_t value, std::atomic<uint32_t>& sleepers);
  // Adds one (several writers may bump the same word) and wakes every sleeper.
  void bump(std::atomic<uint32_t>& sleepers);
  // Wakes all sleepers on this word (abort).
  void wakeAll();
  // Sleeps while the word still equals `seen`, at most `max_wait`. Returns on change,
  // timeout or a spurious wake-up; the caller re-checks.
  void sleepWhile(uint32_t seen, Duration max_wait, std::atomic<uint32_t>& sleepers);

  static bool reached(uint32_t value, uint32_t target) {
    return static_cast<int32_t>(value - target) >= 0;
  }

 private:
  std::atomic<uint32_t> value_{0};
};
static_assert(sizeof(FutexWord) == 4, "FutexWord lives in shared memory");

}  // namespace railshard::transport::messaging
