#pragma once

// Where the process-level dispatcher tests (dispatch_bench_test, dispatch_elastic_test,
// dispatch_signals_test) find benchmarks/dispatch_bench and railshard-launch.
#include <string>

#include <gtest/gtest.h>

namespace railshard::test {

#ifdef RAILSHARD_DISPATCH_BENCH_BIN
inline const std::string kBench = RAILSHARD_DISPATCH_BENCH_BIN;
#else
inline const std::string kBench;
#endif
inline const std::string kLaunch = RAILSHARD_LAUNCH_BIN;

}  // namespace railshard::test

#define SKIP_UNLESS_BUILT()                                           \
  do {                                                                \
    if (::railshard::test::kBench.empty()) {                          \
      GTEST_SKIP() << "dispatch_bench is not built (benchmarks off)"; \
    }                                                                 \
  } while (0)
