#include "benchmarks/perf_backend.h"

#include "core/base/error.h"

namespace railshard::bench {

std::vector<std::string> builtBackends() {
  std::vector<std::string> names{"railshard"};
#ifdef RAILSHARD_HAVE_MPI
  names.push_back("mpi");
#endif
#ifdef RAILSHARD_HAVE_GLOO
  names.push_back("gloo");
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
  throw InvalidArgument("--backend: unknown backend '" + name +
                        "' (known: railshard, mpi, gloo; built: " + joined(builtBackends()) + ")");
}

void throwUnsupported(std::string_view backend, std::string_view what, std::string_view why) {
  std::string message =
      std::string(what) + " is not supported by the " + std::string(backend) + " backend";
  if (!why.empty()) message += " (" + std::string(why) + ")";
  throw InvalidArgument(message);
}

}  // namespace railshard::bench
