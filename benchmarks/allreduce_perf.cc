// allreduce_perf: nccl-tests' all_reduce_perf for railshard and its peers — same options,
// same columns (time, algbw, busbw, #wrong for out-of-place then in-place), same footer. Rank 0
// prints. --backend picks the library that runs the all-reduce (benchmarks/perf_backend.h);
// sizes, data, validation and timing are this file's, identical for every backend.
//
//   railshard-launch -n 4 allreduce_perf -b 8 -e 64M -f 4
//   mpirun -np 4 allreduce_perf -b 8 -e 64M -f 4
//   mpirun -np 4 allreduce_perf --backend mpi -b 8 -e 64M -f 4
//   railshard-launch -n 4 allreduce_perf --backend gloo -b 8 -e 64M -f 4
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "benchmarks/perf_backend.h"
#include "benchmarks/perf_data.h"
#include "benchmarks/perf_options.h"
#include "core/base/error.h"

namespace railshard::bench {
namespace {

struct Result {
  double seconds = 0;  // per iteration, combined over ranks per -a
  size_t wrong = 0;
};

// nccl-tests' definitions: algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce,
// the traffic each rank's links must carry, comparable across world sizes. GB = 1e9 bytes.
double busFactor(int size) {
  return size > 1 ? 2.0 * (size - 1) / size : 0.0;
}

// -a: 0 rank 0's time, 1 mean, 2 min, 3 max.
PerfBackend::Combine combineFor(int average) {
  switch (average) {
    case 0:
      return PerfBackend::Combine::kRoot;
    case 2:
      return PerfBackend::Combine::kMin;
    case 3:
      return PerfBackend::Combine::kMax;
    default:
      return PerfBackend::Combine::kAvg;
  }
}

Result runOne(PerfBackend& comm, const PerfOptions& options, size_t count, bool in_place,
              std::vector<uint8_t>& send, std::vector<uint8_t>& recv) {
  const size_t bytes = count * sizeOf(options.dtype);
  void* out = recv.data();
  const void* in = in_place ? out : send.data();
  Result result;
  if (options.check) {
    fillInput(in_place ? out : send.data(), count, options.dtype, options.op, comm.rank());
    if (!in_place) std::memset(out, 0, bytes);
    comm.allreduce(in, out, count, options.dtype, options.op);
    const auto wrong =
        static_cast<int64_t>(countWrong(out, count, options.dtype, options.op, comm.size()));
    result.wrong = static_cast<size_t>(comm.sumInt64(wrong));
  }
  for (int i = 0; i < options.warmup_iters; ++i) {
    comm.allreduce(in, out, count, options.dtype, options.op);
  }
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options.iters; ++i) {
    comm.allreduce(in, out, count, options.dtype, options.op);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.seconds = comm.combine(elapsed / options.iters, combineFor(options.average));
  return result;
}

void printColumns(const Result& r, size_t bytes, int size) {
  const double algbw = r.seconds > 0 ? static_cast<double>(bytes) / r.seconds / 1e9 : 0;
  const double us = r.seconds * 1e6;
  // nccl-tests' time precision: fewer decimals as the number grows.
  char time[32];
  std::snprintf(time, sizeof(time), us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
  std::printf("  %7s  %6.2f  %6.2f  %6zu", time, algbw, algbw * busFactor(size), r.wrong);
}

int run(int argc, char** argv) {
  const PerfOptions options = parsePerfOptions(argc, argv);
  if (options.help) {
    std::fputs(perfUsage().c_str(), stdout);
    // Scripts and tests read this line to learn which --backend values this build accepts.
    std::string built;
    for (const auto& backend : builtBackends()) built += " " + backend;
    std::printf("Backends built in:%s\n", built.c_str());
    return 0;
  }
  auto comm = makeBackend(options);
  // Before any output: a dtype or op this backend cannot run is an error, not a bad table.
  comm->checkSupported(options.dtype, options.op);
  const int rank = comm->rank();
  const int size = comm->size();
  const size_t element = sizeOf(options.dtype);

  if (rank == 0) {
    std::printf(
        "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d "
        "agg iters: 1 validation: %d graph: 0\n",
        options.min_bytes, options.max_bytes,
        options.step_factor > 0
            ? (std::to_string(static_cast<int>(options.step_factor)) + "(factor)").c_str()
            : (std::to_string(options.step_bytes) + "(bytes)").c_str(),
        options.warmup_iters, options.iters, options.check ? 1 : 0);
    std::printf("#\n# Using %s\n", comm->describe().c_str());
  }
  // Every rank reports where it runs, like nccl-tests' device list.
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      std::printf("#  Rank %2d Pid %6d on %10s device cpu\n", rank, static_cast<int>(::getpid()),
                  host);
      std::fflush(stdout);
    }
    comm->barrier();
  }
  if (rank == 0) {
    std::printf("#\n");
    std::printf(
        "#                                                              out-of-place               "
        "        in-place          \n");
    std::printf(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
        "time   algbw   busbw #wrong\n");
    std::printf(
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
        "(us)  (GB/s)  (GB/s)       \n");
  }

  std::vector<uint8_t> send(std::max<size_t>(options.max_bytes, element));
  std::vector<uint8_t> recv(send.size());
  double busbw_sum = 0;
  int sizes = 0;
  size_t total_wrong = 0;
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    const size_t count = bytes / element;
    const size_t used = count * element;
    const Result out_of_place = runOne(*comm, options, count, false, send, recv);
    const Result in_place = runOne(*comm, options, count, true, send, recv);
    total_wrong += out_of_place.wrong + in_place.wrong;
    if (rank == 0) {
      std::printf("%12zu  %12zu  %8s  %6s  %6i", used, count,
                  std::string(name(options.dtype)).c_str(), std::string(name(options.op)).c_str(),
                  -1);
      printColumns(out_of_place, used, size);
      printColumns(in_place, used, size);
      std::printf("\n");
      std::fflush(stdout);
      const double algbw =
          in_place.seconds > 0 ? static_cast<double>(used) / in_place.seconds / 1e9 : 0;
      busbw_sum += algbw * busFactor(size);
      ++sizes;
    }
    const size_t next = options.step_factor > 0
                            ? static_cast<size_t>(static_cast<double>(bytes) * options.step_factor)
                            : bytes + options.step_bytes;
    if (next <= bytes) break;
    bytes = next;
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %zu %s\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g \n", sizes > 0 ? busbw_sum / sizes : 0.0);
    std::printf("#\n");
    std::fflush(stdout);
  }
  comm->barrier();
  const int code = total_wrong == 0 ? 0 : 1;
  if (!comm->shutdown(std::chrono::seconds(10))) {
    // The table is printed and checked; a peer library stuck closing its connections must not
    // turn a finished run into a hang (see GlooBackend::teardown).
    std::fprintf(stderr,
                 "allreduce_perf: %s backend teardown did not finish within 10 s; "
                 "exiting without it\n",
                 std::string(comm->name()).c_str());
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

}  // namespace
}  // namespace railshard::bench

int main(int argc, char** argv) {
  try {
    return railshard::bench::run(argc, argv);
  } catch (const std::exception& e) {
    // railshard::Error and the peers' own exceptions (gloo::Exception) alike.
    std::fprintf(stderr, "allreduce_perf: %s\n", e.what());
    return 1;
  }
}
