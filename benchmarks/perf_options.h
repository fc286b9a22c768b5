#pragma once

#include <cstddef>
#include <string>

#include "core/base/types.h"

namespace railshard::bench {

// nccl-tests' command line, as allreduce_perf understands it.
struct PerfOptions {
  size_t min_bytes = 32 << 20;
  size_t max_bytes = 32 << 20;
  size_t step_bytes = 1 << 20;          // -i: additive step, used when step_factor is 0
  double step_factor = 0;               // -f: multiplicative step
  int iters = 20;                       // -n
  int warmup_iters = 5;                 // -w
  bool check = true;                    // -c
  DataType dtype = DataType::kFloat32;  // -d
  ReduceOp op = ReduceOp::kSum;         // -o
  int average = 1;                      // -a: 0 rank 0's time, 1 mean, 2 min, 3 max over ranks
  std::string backend = "railshard";    // --backend: railshard, mpi or gloo
  std::string gloo_algo = "auto";       // --gloo-algo: ring, hd or auto
  bool help = false;
};

// Parses argv; throws InvalidArgument naming the bad option and value.
PerfOptions parsePerfOptions(int argc, char** argv);
std::string perfUsage();
// "32M", "1G", "8" -> bytes (nccl-tests accepts K/M/G suffixes).
size_t parseSize(const std::string& option, const std::string& value);

}  // namespace railshard::bench
