#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace railshard {

// All deadlines are on the monotonic clock: wall-clock jumps must not fire or stall them.
using Clock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;
using Deadline = Clock::time_point;

inline Deadline deadlineAfter(Duration timeout) {
  return Clock::now() + timeout;
}

inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "1.25 s", for error messages.
inline std::string formatSeconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f s", seconds);
  return text;
}

inline int millisUntil(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(left);
}

}  // namespace railshard
