#include "transport/messaging/futex_word.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace railshard::transport::messaging {
namespace {

// Shared (not FUTEX_PRIVATE_FLAG): the word is mapped by several processes.
long futex(std::atomic<uint32_t>* address, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(address), op, value, timeout, nullptr, 0);
}

}  // namespace

void FutexWord::store(uint32_t value, std::atomic<uint32_t>& sleepers) {
  // seq_cst store then seq_cst load of the sleeper count: a waiter increments the count before
  // its final check of the word, so one of the two sides sees the other.
  value_.store(value, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) wakeAll();
}

void FutexWord::bump(std::atomic<uint32_t>& sleepers) {
  value_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) wakeAll();
}

void FutexWord::wakeAll() {
  futex(&value_, FUTEX_WAKE, INT_MAX, nullptr);
}

void FutexWord::sleepWhile(uint32_t seen, Duration max_wait, std::atomic<uint32_t>& sleepers) {
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(max_wait).count();
  timespec timeout{static_cast<time_t>(nanos / 1000000000), static_cast<long>(nanos % 1000000000)};
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (value_.load(std::memory_order_seq_cst) == seen) futex(&value_, FUTEX_WAIT, seen, &timeout);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace railshard::transport::messaging
