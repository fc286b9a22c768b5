#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

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
  std::string backend = "railshard";    // --backend: railshard, mpi, gloo or nccl
  // --device host|cuda (also -d host|cuda): where the buffers live. kDevice: on this rank's
  // GPU, filled and checked through host copies, timed after the stream is synchronized.
  // --backend nccl implies kDevice.
  MemoryKind memory = MemoryKind::kHost;
  bool memory_given = false;  // --device (or -d host|cuda) was on the command line
  // --shared-buffers 1: host buffers from Communicator::allocateSharedBuffer (peers on the
  // host map them once and read them with plain loads; docs/benchmarks.md).
  bool shared_buffers = false;
  std::string gloo_algo = "auto";  // --gloo-algo: ring, hd or auto
  std::string json_path;           // -J: rank 0 writes the results there as JSON
  double link_gbps = 0;            // --link-gbps: efficiency's limit; 0 = the topology's
  // --progress / --no-progress: the sweep's progress line on stderr; by default only when
  // stderr is a terminal, so logs and tests stay clean.
  enum class Progress { kAuto, kOn, kOff };
  Progress progress = Progress::kAuto;
  bool help = false;
};

// "host" or "cuda", as --device spells them.
std::string_view memoryName(MemoryKind memory);

// Parses argv; throws InvalidArgument naming the bad option and value.
PerfOptions parsePerfOptions(int argc, char** argv);
std::string perfUsage();
// "32M", "1G", "8" -> bytes (nccl-tests accepts K/M/G suffixes).
size_t parseSize(const std::string& option, const std::string& value);
// The message sizes of the sweep -b..-e by -f or -i, in order (a size is bytes before
// rounding down to whole elements).
std::vector<size_t> sweepSizes(const PerfOptions& options);

}  // namespace railshard::bench
