// allreduce_perf: nccl-tests' all_reduce_perf for railshard and its peers — same options,
// same columns (time, algbw, busbw, #wrong for out-of-place then in-place), same footer. Rank 0
// prints. --backend picks the library that runs the all-reduce (benchmarks/perf_backend.h);
// sizes, data, validation and timing are this file's, identical for every backend.
//
// Beyond nccl-tests: an efficiency column (in-place busbw against the link limit of the
// cluster topology, or --link-gbps), -J FILE for the results as JSON, and a progress line on
// stderr when it is a terminal.
//
//   railshard-launch -n 4 allreduce_perf -b 8 -e 64M -f 4
//   mpirun -np 4 allreduce_perf -b 8 -e 64M -f 4
//   mpirun -np 4 allreduce_perf --backend mpi -b 8 -e 64M -f 4
//   railshard-launch -n 4 allreduce_perf --backend gloo -b 8 -e 64M -f 4
//   railshard-launch -n 4 allreduce_perf --device cuda -b 8 -e 64M -f 4
//   railshard-launch -n 4 allreduce_perf --backend nccl -b 8 -e 64M -f 4
//
// --device cuda (and --backend nccl) put the buffers on each rank's GPU; the data are filled
// and checked through host copies, and every timed loop ends with a stream synchronize, so
// the time covers the device work, as nccl-tests' does.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "benchmarks/perf_backend.h"
#include "benchmarks/perf_data.h"
#include "benchmarks/perf_json.h"
#include "benchmarks/perf_options.h"
#include "benchmarks/perf_progress.h"
#include "benchmarks/perf_results.h"
#include "kernels/cuda/device_runtime.h"

#ifndef RAILSHARD_VERSION_STRING
#define RAILSHARD_VERSION_STRING "unknown"
#endif

namespace railshard::bench {
namespace {

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

PerfMeasurement runOne(PerfBackend& comm, const PerfOptions& options, size_t count, bool in_place,
                       PerfBuffers& buffers) {
  void* out = buffers.recv();
  const void* in = in_place ? out : buffers.send();
  PerfMeasurement result;
  if (options.check) {
    buffers.fill(count, options.dtype, options.op, comm.rank(), in_place);
    comm.allreduce(in, out, count, options.dtype, options.op);
    comm.synchronize();
    const auto wrong =
        static_cast<int64_t>(buffers.wrong(count, options.dtype, options.op, comm.size()));
    result.wrong = static_cast<size_t>(comm.sumInt64(wrong));
  }
  for (int i = 0; i < options.warmup_iters; ++i) {
    comm.allreduce(in, out, count, options.dtype, options.op);
  }
  comm.synchronize();
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options.iters; ++i) {
    comm.allreduce(in, out, count, options.dtype, options.op);
  }
  // Device work may still be queued (NCCL returns at enqueue): the time includes it.
  comm.synchronize();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.seconds = comm.combine(elapsed / options.iters, combineFor(options.average));
  return result;
}

void printColumns(const PerfMeasurement& r, size_t bytes, int size) {
  const double algbw = algbwGBps(r, bytes);
  const double us = r.seconds * 1e6;
  // nccl-tests' time precision: fewer decimals as the number grows.
  char time[32];
  std::snprintf(time, sizeof(time), us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
  std::printf("  %7s  %6.2f  %6.2f  %6zu", time, algbw, algbw * busFactor(size), r.wrong);
}

// The limit efficiency is measured against: --link-gbps, else what the backend's topology says.
tracing::LinkLimit chooseLimit(const PerfOptions& options, const PerfBackend& comm,
                               std::string& source) {
  if (options.link_gbps > 0) {
    tracing::LinkLimit given;
    given.gbps = options.link_gbps;
    given.description = "--link-gbps";
    source = "--link-gbps";
    return given;
  }
  source = "topology";
  return comm.linkLimit();
}

// -J's file, opened by rank 0 before the sweep so that a path that cannot be written fails
// the run at once rather than after it. Every rank learns rank 0's errno (collectively), so
// all stop together with the same message, whichever of them the launcher reports first.
std::ofstream openJson(const PerfOptions& options, PerfBackend& comm) {
  std::ofstream file;
  int64_t error = 0;
  if (comm.rank() == 0 && !options.json_path.empty()) {
    file.open(options.json_path, std::ios::trunc);
    if (!file) error = errno != 0 ? errno : EIO;
  }
  error = comm.sumInt64(error);
  if (error != 0) {
    throw ConfigError("-J " + options.json_path +
                      ": cannot open for writing: " + std::strerror(static_cast<int>(error)));
  }
  return file;
}

// "cpu", or "cuda:0 NVIDIA H200 (sm_90, 139.8 GiB)" for device buffers.
std::string deviceDescription(const PerfOptions& options) {
  if (options.memory != MemoryKind::kDevice) return "cpu";
  const int device = kernels::cuda::currentDevice();
  return "cuda:" + std::to_string(device) + " " + kernels::cuda::deviceName(device);
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
  // Before any rank starts: a backend that cannot take these buffers, or no GPU for them.
  checkMemory(options);
  auto comm = makeBackend(options);
  // Before any output: a dtype or op this backend cannot run is an error, not a bad table.
  comm->checkSupported(options.dtype, options.op);
  const int rank = comm->rank();
  const int size = comm->size();
  const size_t element = sizeOf(options.dtype);
  std::ofstream json = openJson(options, *comm);
  std::string limit_source;
  const tracing::LinkLimit limit = chooseLimit(options, *comm, limit_source);
  // One rank moves no byte over any link: no efficiency to state (it would read 0 %).
  const bool efficiency_known = limit.gbps > 0 && size > 1;
  if (size == 1 && rank == 0) {
    std::fprintf(stderr,
                 "allreduce_perf: only 1 rank: the all-reduce moves no bytes (busbw 0, algbw "
                 "a local copy or nothing); start it under railshard-launch -n N, mpirun -np N "
                 "or torchrun\n");
  }

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
    if (size == 1) std::printf("# alone: 1 rank, nothing crosses a link (see stderr)\n");
    std::printf("# memory: %s\n", options.memory == MemoryKind::kDevice
                                      ? "cuda (device buffers; time after a stream synchronize)"
                                      : "host");
    if (efficiency_known) {
      std::printf("# link limit: %g Gbit/s (%s); eff = in-place busbw x 8 / limit, in %%\n",
                  limit.gbps, limit.description.c_str());
    } else {
      std::printf("# link limit: unknown (%s)\n", limit.description.c_str());
    }
  }
  // Every rank reports where it runs, like nccl-tests' device list.
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      std::printf("#  Rank %2d Pid %6d on %10s device %s\n", rank, static_cast<int>(::getpid()),
                  host, deviceDescription(options).c_str());
      std::fflush(stdout);
    }
    comm->barrier();
  }
  if (rank == 0) {
    std::printf("#\n");
    // nccl-tests' columns unchanged; eff (when known) is appended, so parsers that split a
    // row into its first 13 words keep working.
    std::printf(
        "#                                                              out-of-place               "
        "        in-place          \n");
    std::printf(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
        "time   algbw   busbw #wrong%s\n",
        efficiency_known ? "     eff" : "");
    std::printf(
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
        "(us)  (GB/s)  (GB/s)       %s\n",
        efficiency_known ? "     (%)" : "");
  }

  PerfBuffers buffers(std::max<size_t>(options.max_bytes, element), options.memory, comm->stream(),
                      options.shared_buffers);
  const std::vector<size_t> sweep = sweepSizes(options);
  const bool progress_on = options.progress == PerfOptions::Progress::kAuto
                               ? stderrIsTerminal()
                               : options.progress == PerfOptions::Progress::kOn;
  ProgressLine progress(rank == 0 && progress_on, sweep.size());
  std::vector<PerfRow> rows;
  double busbw_sum = 0;
  size_t total_wrong = 0;
  bool json_failed = false;
  for (size_t i = 0; i < sweep.size(); ++i) {
    PerfRow row;
    row.count = sweep[i] / element;
    row.bytes = row.count * element;
    progress.show(i, row.bytes, "out-of-place");
    row.out_of_place = runOne(*comm, options, row.count, false, buffers);
    progress.show(i, row.bytes, "in-place");
    row.in_place = runOne(*comm, options, row.count, true, buffers);
    progress.clear();
    total_wrong += row.out_of_place.wrong + row.in_place.wrong;
    if (rank == 0) {
      std::printf("%12zu  %12zu  %8s  %6s  %6i", row.bytes, row.count,
                  std::string(name(options.dtype)).c_str(), std::string(name(options.op)).c_str(),
                  -1);
      printColumns(row.out_of_place, row.bytes, size);
      printColumns(row.in_place, row.bytes, size);
      const double busbw = busbwGBps(row.in_place, row.bytes, size);
      if (efficiency_known) std::printf("  %6.1f", 100 * efficiency(busbw, limit.gbps));
      std::printf("\n");
      std::fflush(stdout);
      busbw_sum += busbw;
      rows.push_back(row);
    }
  }
  if (rank == 0) {
    const double avg_busbw = rows.empty() ? 0.0 : busbw_sum / static_cast<double>(rows.size());
    std::printf("# Out of bounds values : %zu %s\n", total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g \n", avg_busbw);
    if (efficiency_known) {
      std::printf("# Avg efficiency       : %.1f %% of %g Gbit/s\n",
                  100 * efficiency(avg_busbw, limit.gbps), limit.gbps);
    }
    std::printf("#\n");
    std::fflush(stdout);
    if (json.is_open()) {
      PerfRunInfo info;
      info.backend = std::string(comm->name());
      info.description = comm->describe();
      info.version = RAILSHARD_VERSION_STRING;
      info.ranks = size;
      info.hosts = comm->hosts();
      info.limit = limit;
      info.limit_source = limit_source;
      writePerfJson(json, options, info, rows);
      json.close();
      if (!json) {
        // Not thrown: the other ranks are about to meet rank 0 in the barrier below.
        std::fprintf(stderr, "allreduce_perf: -J %s: writing failed: %s\n",
                     options.json_path.c_str(), std::strerror(errno));
        json_failed = true;
      }
    }
  }
  comm->barrier();
  const int code = total_wrong == 0 && !json_failed ? 0 : 1;
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
