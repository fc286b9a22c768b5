#include "benchmarks/perf_backend.h"

#include <algorithm>
#include <cstdlib>

#include "base/error.h"
#include "kernels/cuda/device_runtime.h"

namespace railshard::bench {

std::vector<std::string> builtBackends() {
  std::vector<std::string> names{"railshard"};
#ifdef RAILSHARD_HAVE_MPI
  names.push_back("mpi");
#endif
#ifdef RAILSHARD_HAVE_GLOO
  names.push_back("gloo");
#endif
#ifdef RAILSHARD_HAVE_NCCL
  names.push_back("nccl");
#endif
  return names;
}

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace

std::unique_ptr<PerfBackend> makeBackend(const PerfOptions& options) {
  const std::string& name = options.backend;
  if (name == "railshard") return makeRailshardBackend(options);
  if (name == "mpi") {
#ifdef RAILSHARD_HAVE_MPI
    return makeMpiBackend(options);
#else
    throw ConfigError(
        "--backend mpi: this allreduce_perf was built without MPI (CMake found no MPI C "
        "library; apt-get install libopenmpi-dev and reconfigure). Built: " +
        joined(builtBackends()));
#endif
  }
  if (name == "gloo") {
#ifdef RAILSHARD_HAVE_GLOO
    return makeGlooBackend(options);
#else
    throw ConfigError(
        "--backend gloo: this allreduce_perf was built without Gloo (CMake found no Gloo "
        "package; apt-get install libgloo-dev and reconfigure). Built: " +
        joined(builtBackends()));
#endif
  }
  if (name == "nccl") {
#ifdef RAILSHARD_HAVE_NCCL
    return makeNcclBackend(options);
#else
    throw ConfigError(
        "--backend nccl: this allreduce_perf was built without NCCL (CMake found no nccl.h/"
        "libnccl with a CUDA toolkit; see RAILSHARD_WITH_NCCL). Built: " +
        joined(builtBackends()));
#endif
  }
  throw InvalidArgument("--backend: unknown backend '" + name +
                        "' (known: railshard, mpi, gloo, nccl; built: " + joined(builtBackends()) +
                        ")");
}

void checkMemory(const PerfOptions& options) {
  if (options.memory != MemoryKind::kDevice) return;
  const std::string what = options.memory_given ? "--device cuda" : "--backend nccl";
  if (options.backend == "mpi" || options.backend == "gloo") {
    throwUnsupported(options.backend, "--device cuda", "it all-reduces host memory only");
  }
  const auto built = builtBackends();
  if (std::find(built.begin(), built.end(), options.backend) == built.end()) {
    return;  // makeBackend's error (unknown, or built without it) says more than "no GPU"
  }
  if (!kernels::cuda::available()) {
    throw ConfigError(what + " needs a CUDA device: " + kernels::cuda::unavailableReason());
  }
}

int selectDevice(int rank) {
  int local = rank;
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "RAILSHARD_LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long parsed = std::strtol(value, &end, 10);
    if (*end == '\0' && parsed >= 0) {
      local = static_cast<int>(parsed);
      break;
    }
  }
  const int count = kernels::cuda::deviceCount();
  if (count <= 0) throw ConfigError("no CUDA device: " + kernels::cuda::unavailableReason());
  const int device = local % count;
  kernels::cuda::setDevice(device);
  return device;
}

void throwUnsupported(std::string_view backend, std::string_view what, std::string_view why) {
  std::string message =
      std::string(what) + " is not supported by the " + std::string(backend) + " backend";
  if (!why.empty()) message += " (" + std::string(why) + ")";
  throw InvalidArgument(message);
}

}  // namespace railshard::bench
