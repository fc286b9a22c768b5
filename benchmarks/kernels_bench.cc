// Throughput of kernels::reduce per instruction set, dtype and op, next to memcpy of the same
// destination bytes. GB/s counts every byte moved: reduce reads a and b and writes dst
// (3 x destination bytes), memcpy reads and writes (2 x). Sizes are destination bytes.
//
//   kernels_bench --benchmark_min_time=0.05 [--benchmark_filter=reduce/avx2/float/sum]
//
// Instruction sets this CPU cannot run are left out (listed in the context header).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base/types.h"
#include "kernels/cpu_features.h"
#include "kernels/reduce.h"

namespace railshard {
namespace {

constexpr size_t kSizes[] = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20,
                             size_t{256} << 20};
// memcpy also at the sizes the one-host all-reduce figures compare with (docs/benchmarks.md).
constexpr size_t kCopySizes[] = {size_t{64} << 10, size_t{1} << 20,  size_t{4} << 20,
                                 size_t{16} << 20, size_t{64} << 20, size_t{256} << 20};
constexpr size_t kMaxSize = size_t{256} << 20;
// Offsets that are not multiples of 4 KiB, so a, b and dst do not alias in the L1 (4K
// aliasing would slow the loads for reasons that real buffers rarely share).
constexpr size_t kOffsetB = 1088, kOffsetD = 2176;

struct Buffers {
  unsigned char* a;
  unsigned char* b;
  unsigned char* d;
};

// One allocation for every benchmark, filled once (which also faults every page in). The
// repeating bytes 00 3c 00 3f read as ordinary normal numbers in every dtype (f16 1.0/1.75,
// bf16 0.0078/0.5, f32 ~0.5, f64 ~3e-5), so no benchmark runs into subnormal slow paths.
Buffers& buffers() {
  static Buffers instance = [] {
    const size_t total = 3 * kMaxSize + kOffsetB + kOffsetD + 64;
    auto* base = static_cast<unsigned char*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
    if (base == nullptr) throw std::bad_alloc();
    const unsigned char pattern[4] = {0x00, 0x3c, 0x00, 0x3f};
    for (size_t i = 0; i < total; ++i) base[i] = pattern[i % 4];
    return Buffers{base, base + kMaxSize + kOffsetB, base + 2 * kMaxSize + kOffsetD};
  }();
  return instance;
}

std::string sizeName(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + "MiB"
                                    : std::to_string(bytes >> 10) + "KiB";
}

void setRate(benchmark::State& state, size_t bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(bytes_per_iteration));
  // Decimal GB/s ("12.3G/s"), as docs/ quote them; bytes_per_second is binary (GiB/s).
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(bytes_per_iteration),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::OneK::kIs1000);
}

void reduceBenchmark(benchmark::State& state, kernels::Isa isa, DataType dtype, ReduceOp op,
                     size_t bytes) {
  if (!kernels::setIsaForTesting(isa)) {
    state.SkipWithError("CPU cannot run this instruction set");
    return;
  }
  Buffers& buf = buffers();
  const size_t count = bytes / sizeOf(dtype);
  for (auto _ : state) {
    kernels::reduce(buf.d, buf.a, buf.b, count, dtype, op);
    benchmark::ClobberMemory();
  }
  setRate(state, 3 * bytes);
}

void memcpyBenchmark(benchmark::State& state, size_t bytes) {
  Buffers& buf = buffers();
  for (auto _ : state) {
    std::memcpy(buf.d, buf.a, bytes);
    benchmark::ClobberMemory();
  }
  setRate(state, 2 * bytes);
}

void registerAll() {
  std::string skipped;
  std::vector<kernels::Isa> isas;
  for (int i = 0; i < kernels::kNumIsas; ++i) {
    const auto isa = static_cast<kernels::Isa>(i);
    if (kernels::canRun(isa)) {
      isas.push_back(isa);
    } else {
      skipped += (skipped.empty() ? "" : ", ") + std::string(kernels::name(isa));
    }
  }
  benchmark::AddCustomContext("cpu_features", kernels::describe(kernels::cpuFeatures()));
  benchmark::AddCustomContext("isas_run", kernels::runnableIsas());
  benchmark::AddCustomContext("isas_not_run", skipped.empty() ? "none" : skipped + " (CPU lacks)");

  for (size_t bytes : kCopySizes) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(), [bytes](
                                                                            benchmark::State& s) {
      memcpyBenchmark(s, bytes);
    })->Unit(benchmark::kMicrosecond);
  }
  for (kernels::Isa isa : isas) {
    for (int d = 0; d < kNumDataTypes; ++d) {
      const auto dtype = static_cast<DataType>(d);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
        for (size_t bytes : kSizes) {
          const std::string name = "reduce/" + std::string(kernels::name(isa)) + "/" +
                                   std::string(railshard::name(dtype)) + "/" +
                                   std::string(railshard::name(op)) + "/" + sizeName(bytes);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
            reduceBenchmark(s, isa, dtype, op, bytes);
          })->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace railshard

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  railshard::registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
