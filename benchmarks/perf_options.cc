#include "benchmarks/perf_options.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "benchmarks/cli_args.h"

namespace railshard::bench {

size_t parseSize(const std::string& option, const std::string& value) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (value.empty() || end == value.c_str() || number < 0) {
    throw InvalidArgument(option + ": expected a size like 8, 64K, 32M or 1G, got '" + value + "'");
  }
  double multiplier = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k") {
    multiplier = 1024.0;
  } else if (suffix == "M" || suffix == "m") {
    multiplier = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g") {
    multiplier = 1024.0 * 1024 * 1024;
  } else if (!suffix.empty()) {
    throw InvalidArgument(option + ": unknown size suffix '" + suffix + "' in '" + value + "'");
  }
  return static_cast<size_t>(number * multiplier);
}

namespace {

// --device's values; -d accepts them too (see perfUsage()).
bool parseMemory(const std::string& value, MemoryKind& memory) {
  if (value == "host" || value == "cuda") {
    memory = value == "host" ? MemoryKind::kHost : MemoryKind::kDevice;
    return true;
  }
  return false;
}

int parseInt(const std::string& option, const std::string& value, int min, int max) {
  char* end = nullptr;
  const long number = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || number < min || number > max) {
    throw InvalidArgument(option + ": expected an integer in [" + std::to_string(min) + ", " +
                          std::to_string(max) + "], got '" + value + "'");
  }
  return static_cast<int>(number);
}

}  // namespace

std::string_view memoryName(MemoryKind memory) {
  return memory == MemoryKind::kDevice ? "cuda" : "host";
}

std::vector<size_t> sweepSizes(const PerfOptions& options) {
  std::vector<size_t> sizes;
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    sizes.push_back(bytes);
    const size_t next = options.step_factor > 0
                            ? static_cast<size_t>(static_cast<double>(bytes) * options.step_factor)
                            : bytes + options.step_bytes;
    if (next <= bytes) break;  // -b 0 with -f, or an overflow: the sweep ends here
    bytes = next;
  }
  return sizes;
}

std::string perfUsage() {
  return "usage: allreduce_perf [options]\n"
         "  -b, --minbytes SIZE    smallest message (default 32M; suffixes K, M, G)\n"
         "  -e, --maxbytes SIZE    largest message (default 32M)\n"
         "  -i, --stepbytes SIZE   additive step between sizes (default 1M)\n"
         "  -f, --stepfactor F     multiplicative step between sizes (overrides -i)\n"
         "  -n, --iters N          timed iterations per size (default 20)\n"
         "  -w, --warmup_iters N   untimed iterations per size (default 5)\n"
         "  -c, --check 0|1        validate results (default 1)\n"
         "  -d, --datatype T       float, double, half, bfloat16, int32, int64, uint8 (default "
         "float)\n"
         "  --device host|cuda     where the buffers live (default host); cuda: this rank's GPU\n"
         "                         (local rank modulo the GPUs), data copied in and out for the\n"
         "                         checks, time taken after synchronizing the stream. -d cuda and\n"
         "                         -d host mean the same (no datatype has those names; any other\n"
         "                         -d value is the datatype, as in nccl-tests)\n"
         "  --shared-buffers 0|1   1: host buffers from Communicator::allocateSharedBuffer, which\n"
         "                         the other ranks of a host map once (default 0)\n"
         "  -o, --op OP            sum, prod, min, max, avg (default sum)\n"
         "  -a, --average 0..3     report rank 0's (0), mean (1), min (2) or max (3) time\n"
         "  --backend NAME         railshard (default), mpi, gloo or nccl: the library that runs\n"
         "                         the all-reduce; same sizes, data, checks and columns.\n"
         "                         mpi and gloo take host buffers only; nccl device buffers\n"
         "                         only (it implies --device cuda)\n"
         "  --gloo-algo A          gloo only: ring (gloo::allreduce), hd (halving-doubling)\n"
         "                         or auto (hd below 4 MiB, ring from there; default)\n"
         "  -J, --json FILE        rank 0 also writes the configuration, link limit and\n"
         "                         every row to FILE as JSON\n"
         "  --link-gbps X          link limit in Gbit/s for the efficiency column (default:\n"
         "                         the slowest ring hop of the cluster topology, railshard\n"
         "                         backend only; no column when unknown)\n"
         "  --progress, --no-progress\n"
         "                         progress line on stderr (default: when it is a terminal)\n"
         "  -h, --help\n"
         "Run under railshard-launch, mpirun, srun or torchrun; rank 0 prints the table.\n"
         "--backend mpi runs under mpirun only; --backend gloo under any of them.\n";
}

PerfOptions parsePerfOptions(int argc, char** argv) {
  PerfOptions options;
  bool step_factor_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      continue;
    }
    if (arg == "--progress" || arg == "--no-progress") {
      options.progress =
          arg == "--progress" ? PerfOptions::Progress::kOn : PerfOptions::Progress::kOff;
      continue;
    }
    const auto option = readOption(argc, argv, i);
    if (!option) throw InvalidArgument(arg + ": missing value");
    const std::string& key = option->key;
    const std::string& value = option->value;
    if (key == "-b" || key == "--minbytes") {
      options.min_bytes = parseSize(key, value);
    } else if (key == "-e" || key == "--maxbytes") {
      options.max_bytes = parseSize(key, value);
    } else if (key == "-i" || key == "--stepbytes") {
      options.step_bytes = parseSize(key, value);
    } else if (key == "-f" || key == "--stepfactor") {
      char* end = nullptr;
      options.step_factor = std::strtod(value.c_str(), &end);
      if (*end != '\0' || options.step_factor <= 1) {
        throw InvalidArgument(key + ": expected a factor > 1, got '" + value + "'");
      }
      step_factor_set = true;
    } else if (key == "-n" || key == "--iters") {
      options.iters = parseInt(key, value, 1, 1 << 24);
    } else if (key == "-w" || key == "--warmup_iters") {
      options.warmup_iters = parseInt(key, value, 0, 1 << 24);
    } else if (key == "-c" || key == "--check") {
      options.check = parseInt(key, value, 0, 1) == 1;
    } else if (key == "--device") {
      if (!parseMemory(value, options.memory)) {
        throw InvalidArgument(key + ": expected host or cuda, got '" + value + "'");
      }
      options.memory_given = true;
    } else if (key == "--shared-buffers") {
      options.shared_buffers = parseInt(key, value, 0, 1) == 1;
    } else if (key == "-d" && parseMemory(value, options.memory)) {
      options.memory_given = true;  // nccl-tests' -d is the datatype; host/cuda name none
    } else if (key == "-d" || key == "--datatype") {
      const auto dtype = parseDataType(value);
      if (!dtype) throw InvalidArgument(key + ": unknown datatype '" + value + "'");
      options.dtype = *dtype;
    } else if (key == "-o" || key == "--op") {
      const auto op = parseReduceOp(value);
      if (!op) throw InvalidArgument(key + ": unknown op '" + value + "'");
      options.op = *op;
    } else if (key == "-a" || key == "--average") {
      options.average = parseInt(key, value, 0, 3);
    } else if (key == "--backend") {
      // Checked against what is built when the backend is made, so the error can list them.
      options.backend = value;
    } else if (key == "--gloo-algo") {
      if (value != "ring" && value != "hd" && value != "auto") {
        throw InvalidArgument(key + ": expected ring, hd or auto, got '" + value + "'");
      }
      options.gloo_algo = value;
    } else if (key == "-J" || key == "--json") {
      if (value.empty()) throw InvalidArgument(key + ": expected a file name, got ''");
      options.json_path = value;
    } else if (key == "--link-gbps") {
      char* end = nullptr;
      options.link_gbps = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(options.link_gbps > 0) ||
          !std::isfinite(options.link_gbps)) {
        throw InvalidArgument(key + ": expected a speed in Gbit/s > 0, got '" + value + "'");
      }
    } else {
      throw InvalidArgument("unknown option '" + arg + "'\n" + perfUsage());
    }
  }
  if (options.backend == "nccl") {
    // NCCL all-reduces device memory only; staging through the host would measure copies.
    if (options.memory_given && options.memory == MemoryKind::kHost) {
      throw InvalidArgument(
          "--backend nccl runs on device buffers only: drop --device host (nccl implies "
          "--device cuda)");
    }
    options.memory = MemoryKind::kDevice;
  }
  if (!step_factor_set && options.step_bytes == 0) {
    throw InvalidArgument("-i: step must be > 0");
  }
  if (options.max_bytes < options.min_bytes) {
    throw InvalidArgument("-e " + std::to_string(options.max_bytes) + " is smaller than -b " +
                          std::to_string(options.min_bytes));
  }
  return options;
}

}  // namespace railshard::bench
