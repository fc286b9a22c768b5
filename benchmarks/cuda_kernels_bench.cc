// cuda_kernels_bench: throughput of kernels::cuda::reduce next to a device-to-device
// cudaMemcpyAsync of the same size, on device 0.
//
//   cuda_kernels_bench [--max-bytes N] [--min-bytes N] [--iters N] [--warmup N]
//                      [--json FILE] [--require-device]
//
// N takes K/M/G suffixes (powers of 1024). Sizes double from --min-bytes (1 MiB) to
// --max-bytes (256 MiB); each size is the destination buffer, `a` and `b` are as large. GB/s
// counts every byte moved (1e9 bytes/s): reduce reads a and b and writes dst (3 x bytes),
// the copy reads and writes (2 x bytes). Each sample is timed with CUDA events around enough
// back-to-back launches to cover ~64 MiB of destination bytes, so launch gaps do not dominate
// small sizes; the table shows the median of --iters samples after --warmup.
//
// Without a usable device it prints "cuda_kernels_bench: skipped: <reason>" and exits 0, or
// 77 (the ctest/automake "skipped" code) with --require-device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/types.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/reduce.h"

namespace {

namespace gpu = railshard::kernels::cuda;
using railshard::DataType;
using railshard::ReduceOp;

constexpr size_t kMiB = size_t{1} << 20;

struct Options {
  size_t min_bytes = kMiB;
  size_t max_bytes = 256 * kMiB;
  int iters = 20;
  int warmup = 3;
  std::string json;
  bool require_device = false;
};

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "cuda_kernels_bench: %s\nusage: cuda_kernels_bench [--max-bytes N] [--min-bytes N] "
               "[--iters N] [--warmup N] [--json FILE] [--require-device]\n",
               problem);
  std::exit(2);
}

size_t parseBytes(const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text) usage("bad byte count");
  size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = size_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = size_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = size_t{1} << 30;
  if (scale != 1) ++end;
  if (*end == 'i' || *end == 'B') ++end;  // "MiB", "MB"
  if (*end == 'B') ++end;
  if (*end != '\0') usage("bad byte count");
  return static_cast<size_t>(value) * scale;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--max-bytes") {
      options.max_bytes = parseBytes(value());
    } else if (arg == "--min-bytes") {
      options.min_bytes = parseBytes(value());
    } else if (arg == "--iters") {
      options.iters = std::max(1, std::atoi(value()));
    } else if (arg == "--warmup") {
      options.warmup = std::max(0, std::atoi(value()));
    } else if (arg == "--json") {
      options.json = value();
    } else if (arg == "--require-device") {
      options.require_device = true;
    } else {
      usage(("unknown argument " + arg).c_str());
    }
  }
  if (options.min_bytes == 0 || options.min_bytes > options.max_bytes) usage("bad size range");
  return options;
}

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
  }
}

// Median seconds per call of `body` (which enqueues one operation on `stream`).
template <typename Body>
double medianSeconds(const Options& options, size_t bytes, gpu::Stream stream, Body body) {
  const int reps = static_cast<int>(std::max<size_t>(1, 64 * kMiB / bytes));
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  auto* s = static_cast<cudaStream_t>(stream);
  std::vector<double> samples;
  for (int i = 0; i < options.warmup + options.iters; ++i) {
    check(cudaEventRecord(start, s), "cudaEventRecord");
    for (int r = 0; r < reps; ++r) body();
    check(cudaEventRecord(stop, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i >= options.warmup) samples.push_back(static_cast<double>(ms) * 1e-3 / reps);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

struct Row {
  size_t bytes;
  std::string kernel;  // "copy" or "reduce"
  std::string dtype;
  std::string op;
  double seconds;
  double gbps;
  double ratio;  // reduce GB/s / copy GB/s of the same size, in %; 100 for the copy
};

void writeJson(const std::string& path, const std::string& device, const Options& options,
               const std::vector<Row>& rows) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw std::runtime_error("cannot write " + path);
  std::fprintf(file, "{\n  \"device\": \"%s\",\n  \"iters\": %d,\n  \"warmup\": %d,\n",
               device.c_str(), options.iters, options.warmup);
  std::fprintf(file, "  \"rows\": [\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(file,
                 "    {\"bytes\": %zu, \"kernel\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\", "
                 "\"time_us\": %.3f, \"gbps\": %.2f, \"ratio_to_copy_pct\": %.1f}%s\n",
                 r.bytes, r.kernel.c_str(), r.dtype.c_str(), r.op.c_str(), r.seconds * 1e6, r.gbps,
                 r.ratio, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(file, "  ]\n}\n");
  std::fclose(file);
}

int run(const Options& options) {
  if (!gpu::available()) {
    std::printf("cuda_kernels_bench: skipped: %s\n", gpu::unavailableReason().c_str());
    return options.require_device ? 77 : 0;
  }
  gpu::setDevice(0);
  const std::string device = gpu::deviceName(0);
  std::printf(
      "cuda_kernels_bench on %s; median of %d (after %d warm-up); GB/s = 1e9 B/s, "
      "reduce 3 x bytes, copy 2 x bytes\n\n",
      device.c_str(), options.iters, options.warmup);

  void* a = gpu::allocateDevice(options.max_bytes);
  void* b = gpu::allocateDevice(options.max_bytes);
  void* dst = gpu::allocateDevice(options.max_bytes);
  gpu::Stream stream = gpu::createStream();
  // 0x3c in every byte is an ordinary finite value in every float type (f32 ~0.0115,
  // f16/bf16 ~1.06 / ~0.0115): no NaN or Inf in the timed data.
  gpu::memsetAsync(a, 0x3c, options.max_bytes, stream);
  gpu::memsetAsync(b, 0x3c, options.max_bytes, stream);
  gpu::synchronizeStream(stream);

  struct Case {
    DataType dtype;
    ReduceOp op;
  };
  const Case cases[] = {{DataType::kFloat32, ReduceOp::kSum},
                        {DataType::kBFloat16, ReduceOp::kSum},
                        {DataType::kFloat16, ReduceOp::kSum},
                        {DataType::kFloat32, ReduceOp::kMax}};

  std::vector<Row> rows;
  std::printf("%12s  %-8s %-9s %-4s %12s %10s %9s\n", "bytes", "kernel", "dtype", "op", "time_us",
              "GB/s", "vs copy");
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    const double copy_s =
        medianSeconds(options, bytes, stream, [&] { gpu::copyAsync(dst, a, bytes, stream); });
    const double copy_gbps = 2.0 * static_cast<double>(bytes) / copy_s / 1e9;
    rows.push_back({bytes, "copy", "-", "-", copy_s, copy_gbps, 100.0});
    for (const Case& c : cases) {
      const size_t count = bytes / railshard::sizeOf(c.dtype);
      const double s = medianSeconds(options, bytes, stream,
                                     [&] { gpu::reduce(dst, a, b, count, c.dtype, c.op, stream); });
      const double gbps = 3.0 * static_cast<double>(bytes) / s / 1e9;
      rows.push_back({bytes, "reduce", std::string(railshard::name(c.dtype)),
                      std::string(railshard::name(c.op)), s, gbps, 100.0 * gbps / copy_gbps});
    }
    for (size_t i = rows.size() - 5; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%12zu  %-8s %-9s %-4s %12.2f %10.1f %8.1f%%\n", r.bytes, r.kernel.c_str(),
                  r.dtype.c_str(), r.op.c_str(), r.seconds * 1e6, r.gbps, r.ratio);
    }
    std::fflush(stdout);
    if (bytes > options.max_bytes / 2) break;  // no overflow past SIZE_MAX/2
  }
  gpu::destroyStream(stream);
  gpu::freeDevice(a);
  gpu::freeDevice(b);
  gpu::freeDevice(dst);
  if (!options.json.empty()) writeJson(options.json, device, options, rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuda_kernels_bench: %s\n", error.what());
    return 1;
  }
}
