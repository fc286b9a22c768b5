#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"
#include "benchmarks/perf_options.h"
#include "core/tracing/link_limit.h"

namespace railshard::bench {

// What allreduce_perf needs from a collective library, so that railshard and its peers (MPI,
// Gloo, NCCL) run the same sweep, fill and check the same data and print the same columns. Every
// call is collective: all ranks make it, in the same order.
class PerfBackend {
 public:
  // How combine() folds a per-rank double into one value, as nccl-tests' -a does.
  enum class Combine { kRoot, kAvg, kMin, kMax };

  virtual ~PerfBackend() = default;

  virtual std::string_view name() const = 0;
  // One line for the table header: library, version, transport and algorithm choices, so a
  // saved table says what produced it.
  virtual std::string describe() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Host of each rank, by rank; empty when the backend does not know them.
  virtual std::vector<std::string> hosts() const { return {}; }
  // The best busbw the links could carry (efficiency's denominator); gbps 0 and a description
  // saying why when unknown. Only railshard knows its cluster topology.
  virtual tracing::LinkLimit linkLimit() const {
    tracing::LinkLimit unknown;
    unknown.description = "the " + std::string(name()) + " backend knows no cluster topology";
    return unknown;
  }

  // Throws InvalidArgument "<what> is not supported by the <name> backend" when this backend
  // cannot run dtype/op; called once before the sweep, so the error comes before any output.
  virtual void checkSupported(DataType dtype, ReduceOp op) const = 0;
  // In place when send == recv. Blocks until this rank's result is in recv.
  virtual void allreduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) = 0;
  virtual void barrier() = 0;
  // Device buffers (PerfOptions::memory kDevice, which only railshard and nccl accept): the
  // stream allreduce() is ordered on, which allreduce_perf also copies its data in and out
  // on, and a wait for everything enqueued on it. allreduce() may return before the device
  // work is done; the timer stops after synchronize().
  virtual void* stream() const { return nullptr; }
  virtual void synchronize() {}
  virtual double combine(double value, Combine how) = 0;
  virtual int64_t sumInt64(int64_t value) = 0;

  // Collective teardown after the last call. Returns false when it did not finish within
  // `limit`; the caller then exits without waiting for it (results are already printed).
  virtual bool shutdown(std::chrono::milliseconds limit) {
    (void)limit;
    return true;
  }
};

// Before any backend starts: InvalidArgument when options.backend cannot take buffers of
// options.memory (mpi and gloo run on host memory only), ConfigError naming
// kernels::cuda::unavailableReason() when device buffers are asked for and no GPU is usable.
void checkMemory(const PerfOptions& options);

// The GPU this rank uses with device buffers, made current: the local rank (from
// OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK, RAILSHARD_LOCAL_RANK or SLURM_LOCALID, else `rank`)
// modulo the number of devices. Backends call it once they know their rank, before they
// create streams or communicators.
int selectDevice(int rank);

// Backends compiled into this binary, the default ("railshard") first.
std::vector<std::string> builtBackends();

// Starts the backend options.backend names (connecting to the other ranks). Throws
// InvalidArgument for an unknown name, ConfigError for one that is known but not built here.
std::unique_ptr<PerfBackend> makeBackend(const PerfOptions& options);

// The per-backend constructors behind makeBackend; the optional ones exist only when CMake
// found their library (RAILSHARD_HAVE_MPI, RAILSHARD_HAVE_GLOO, RAILSHARD_HAVE_NCCL).
std::unique_ptr<PerfBackend> makeRailshardBackend(const PerfOptions& options);
std::unique_ptr<PerfBackend> makeMpiBackend(const PerfOptions& options);
std::unique_ptr<PerfBackend> makeGlooBackend(const PerfOptions& options);
std::unique_ptr<PerfBackend> makeNcclBackend(const PerfOptions& options);  // RAILSHARD_HAVE_NCCL

// The message every backend uses for a dtype or op it cannot run.
[[noreturn]] void throwUnsupported(std::string_view backend, std::string_view what,
                                   std::string_view why = {});

}  // namespace railshard::bench
