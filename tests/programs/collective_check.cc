// A rank program for process-level tests: init() from whatever launched it, run a few
// verified collectives, optionally die on purpose, report on stdout/stderr.
//
//   collective_check [--iterations N] [--die-rank R --die-after K] [--count C] [--rails 1]
//
// --rails 1: print the transport's rails to the next rank at the end, one line each:
//   "rail NAME up=U gbps=G fraction=F bytes=B"
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/topology/topology.h"
#include "launcher/init.h"
#include "transport/transport.h"

int main(int argc, char** argv) {
  int iterations = 20;
  int die_rank = -1;
  int die_after = 0;
  size_t count = 100000;
  bool print_rails = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (key == "--iterations") iterations = value;
    if (key == "--die-rank") die_rank = value;
    if (key == "--die-after") die_after = value;
    if (key == "--count") count = static_cast<size_t>(value);
    if (key == "--rails") print_rails = value != 0;
  }
  try {
    auto comm = railshard::init();
    const int rank = comm->rank();
    const int size = comm->size();
    std::vector<int64_t> data(count);
    for (int it = 0; it < iterations; ++it) {
      if (rank == die_rank && it == die_after) {
        std::fprintf(stderr, "rank %d exiting on purpose at iteration %d\n", rank, it);
        std::fflush(stderr);
        ::_exit(3);
      }
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<int64_t>(i) * (rank + 1) + it;
      comm->allreduce(data.data(), count, railshard::DataType::kInt64, railshard::ReduceOp::kSum);
      const int64_t factor = static_cast<int64_t>(size) * (size + 1) / 2;
      for (size_t i = 0; i < count; ++i) {
        const int64_t expected = static_cast<int64_t>(i) * factor + static_cast<int64_t>(it) * size;
        if (data[i] != expected) {
          std::fprintf(stderr, "rank %d: wrong result at iteration %d element %zu\n", rank, it, i);
          return 2;
        }
      }
    }
    if (print_rails) {
      for (const auto& rail : comm->transport().rails()) {
        if (rail.peer != (rank + 1) % size) continue;
        std::printf("rail %s up=%d gbps=%.4f fraction=%.4f bytes=%llu\n", rail.name.c_str(),
                    rail.up ? 1 : 0, rail.gbps, rail.fraction,
                    static_cast<unsigned long long>(rail.bytes_sent));
      }
    }
    const auto* topology = comm->topology();
    std::printf("rank %d of %d ok after %d allreduces over %s, topology %s with %zu host(s)\n",
                rank, size, iterations, comm->usesSharedMemory() ? "shm" : "tcp",
                topology ? topology->hash().c_str() : "none",
                topology ? topology->hosts().size() : size_t{0});
    return 0;
  } catch (const railshard::PeerLostError& e) {
    std::fprintf(stderr, "PeerLostError: %s\n", e.what());
  } catch (const railshard::ConfigError& e) {
    std::fprintf(stderr, "ConfigError: %s\n", e.what());
  } catch (const railshard::Error& e) {
    std::fprintf(stderr, "Error: %s\n", e.what());
  }
  return 1;
}
