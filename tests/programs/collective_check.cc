// A rank program for process-level tests: init() from whatever launched it, run verified
// all-reduces, optionally fail on purpose, report on stdout/stderr.
//
//   collective_check [--iterations N] [--count C] [--rails 1]
//                    [--die-rank R --die-after K [--die-how exit|kill|stop]]
//                    [--stop-seconds S] [--stall-rank R --stall-after K --stall-seconds S]
//                    [--elastic 1 [--grow 1]] [--timeout-ms T] [--linger-seconds S]
//                    [--pace-ms D] [--shared 1]
//
// --die-how exit (default) exits with status 3; kill raises SIGKILL on itself; stop raises
//   SIGSTOP on itself, after forking a child that sends SIGCONT --stop-seconds later.
// --stall-*: rank R sleeps S seconds before all-reduce K (alive, heartbeats flowing).
// --elastic 1: on PeerLostError, shrink() to the survivors and go on with the remaining
//   iterations (a rank written off by the others exits 1 with the error).
// --grow 1: before every iteration the ranks ask joinersWaiting() and grow() when a process
//   asked to join (a rank railshard-launch --max-restarts started again: RAILSHARD_JOIN=1);
//   rank 0 then broadcasts the iteration, and the joiner goes on from there.
// --pace-ms D: sleep D ms before every iteration (a training step's compute), so that a
//   restarted rank can join before the others are done.
// --linger-seconds S: wait S seconds before exiting after success (keeps rank 0's store up
//   for a rank that comes back late).
// --shared 1: the all-reduce buffer comes from Communicator::allocateSharedBuffer (the other
//   ranks of the host map it; without, they read it with process_vm_readv).
// --rails 1: print the transport's rails to the next rank at the end, one line each:
//   "rail NAME up=U gbps=G fraction=F bytes=B"
// Every rank prints "rank R of N ok after I allreduces over T, topology H with K host(s),
// generation G, last algorithm A" on success (T: shm, tcp, ibverbs, or "shm per host and tcp"
// or "... and ibverbs"); every error is printed with its class name.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "core/topology/topology.h"
#include "launcher/init.h"
#include "transport/transport.h"

namespace {

struct Options {
  int iterations = 20;
  int die_rank = -1;
  int die_after = 0;
  std::string die_how = "exit";
  double stop_seconds = 5;
  int stall_rank = -1;
  int stall_after = 0;
  double stall_seconds = 0;
  size_t count = 100000;
  bool print_rails = false;
  bool shared = false;
  bool elastic = false;
  bool grow = false;
  double pace_ms = 0;
  long timeout_ms = -1;
  double linger_seconds = 0;
};

// Wall-clock microseconds: comparable between the ranks of one host, so a benchmark can
// subtract "failing on purpose at" from "caught at".
long long wallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void dieOnPurpose(int rank, int iteration, const Options& options) {
  std::fprintf(stderr, "rank %d failing on purpose (%s) at iteration %d, at %lld us\n", rank,
               options.die_how.c_str(), iteration, wallMicros());
  std::fflush(stderr);
  if (options.die_how == "kill") ::raise(SIGKILL);
  if (options.die_how == "stop") {
    const pid_t self = ::getpid();
    if (::fork() == 0) {
      // The child wakes the parent later: a real SIGSTOP/SIGCONT pair with bounded duration.
      std::this_thread::sleep_for(std::chrono::duration<double>(options.stop_seconds));
      ::kill(self, SIGCONT);
      ::_exit(0);
    }
    ::raise(SIGSTOP);
    std::fprintf(stderr, "rank %d continued after SIGSTOP\n", rank);
    return;
  }
  ::_exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  const long long started = wallMicros();
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string text = argv[i + 1];
    const int value = std::atoi(argv[i + 1]);
    if (key == "--iterations") options.iterations = value;
    if (key == "--die-rank") options.die_rank = value;
    if (key == "--die-after") options.die_after = value;
    if (key == "--die-how") options.die_how = text;
    if (key == "--stop-seconds") options.stop_seconds = std::atof(text.c_str());
    if (key == "--stall-rank") options.stall_rank = value;
    if (key == "--stall-after") options.stall_after = value;
    if (key == "--stall-seconds") options.stall_seconds = std::atof(text.c_str());
    if (key == "--count") options.count = static_cast<size_t>(value);
    if (key == "--rails") options.print_rails = value != 0;
    if (key == "--shared") options.shared = value != 0;
    if (key == "--elastic") options.elastic = value != 0;
    if (key == "--grow") options.grow = value != 0;
    if (key == "--pace-ms") options.pace_ms = value;
    if (key == "--timeout-ms") options.timeout_ms = std::atol(text.c_str());
    if (key == "--linger-seconds") options.linger_seconds = std::atof(text.c_str());
  }
  const auto timeout = options.timeout_ms > 0 ? std::chrono::milliseconds(options.timeout_ms)
                                              : railshard::Communicator::kDefaultTimeout;
  try {
    auto comm = railshard::init();
    const size_t count = options.count;
    std::vector<int64_t> own(options.shared ? 0 : count);
    const std::unique_ptr<void, void (*)(void*)> shared(
        options.shared ? railshard::Communicator::allocateSharedBuffer(std::max<size_t>(1, count) *
                                                                       sizeof(int64_t))
                       : nullptr,
        [](void* p) {
          if (p != nullptr) railshard::Communicator::freeSharedBuffer(p);
        });
    int64_t* data = options.shared ? static_cast<int64_t*>(shared.get()) : own.data();
    int it = 0;
    // Rank 0 of a grown group hands the iteration it is at to the joiners.
    const auto takeIteration = [&](const char* how) {
      int64_t at = it;
      comm->broadcast(&at, 1, railshard::DataType::kInt64, 0, timeout);
      it = static_cast<int>(at);
      std::fprintf(stderr,
                   "launch rank %d is rank %d of %d in generation %d (%s at iteration %d, at %lld "
                   "us; process started at %lld us)\n",
                   comm->worldRank(), comm->rank(), comm->size(), comm->generation(), how, it,
                   wallMicros(), started);
    };
    const char* join = std::getenv("RAILSHARD_JOIN");
    // A joiner enters the iteration the members are in after their joinersWaiting() and
    // grow(): it skips that question once.
    bool asked = join != nullptr && std::string(join) == "1";
    if (asked) takeIteration("joined");
    while (it < options.iterations) {
      if (comm->worldRank() == options.die_rank && it == options.die_after) {
        dieOnPurpose(comm->rank(), it, options);
      }
      if (comm->worldRank() == options.stall_rank && it == options.stall_after) {
        std::this_thread::sleep_for(std::chrono::duration<double>(options.stall_seconds));
      }
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options.pace_ms));
      const int rank = comm->rank();
      try {
        if (options.grow && !asked && comm->joinersWaiting(timeout) > 0) {
          comm = comm->grow();
          takeIteration("grew");
        }
        asked = false;
        for (size_t i = 0; i < count; ++i) {
          data[i] = static_cast<int64_t>(i) * (comm->rank() + 1) + it;
        }
        comm->allreduce(data, count, railshard::DataType::kInt64, railshard::ReduceOp::kSum,
                        timeout);
      } catch (const railshard::PeerLostError& e) {
        std::fprintf(stderr, "rank %d caught PeerLostError at %lld us\n", rank, wallMicros());
        if (!options.elastic) throw;
        std::fprintf(stderr, "rank %d: PeerLostError at iteration %d, shrinking: %s\n", rank, it,
                     e.what());
        const auto shrink_start = std::chrono::steady_clock::now();
        comm = comm->shrink();
        const double shrink_ms = std::chrono::duration<double, std::milli>(
                                     std::chrono::steady_clock::now() - shrink_start)
                                     .count();
        std::fprintf(
            stderr,
            "launch rank %d is rank %d of %d in generation %d (shrink %.1f ms, at %lld us)\n",
            comm->worldRank(), comm->rank(), comm->size(), comm->generation(), shrink_ms,
            wallMicros());
        // The survivors need not have failed in the same iteration: a rank whose partners
        // had all sent finishes the collective another rank was still in when the loss was
        // reported to it. Resume together from the earliest one (redoing is harmless here).
        int64_t resume = it;
        comm->allreduce(&resume, 1, railshard::DataType::kInt64, railshard::ReduceOp::kMin,
                        timeout);
        it = static_cast<int>(resume);
        continue;  // this iteration again, on the survivors
      }
      const int size = comm->size();
      const int64_t factor = static_cast<int64_t>(size) * (size + 1) / 2;
      for (size_t i = 0; i < count; ++i) {
        const int64_t expected = static_cast<int64_t>(i) * factor + static_cast<int64_t>(it) * size;
        if (data[i] != expected) {
          std::fprintf(stderr, "rank %d: wrong result at iteration %d element %zu\n", rank, it, i);
          return 2;
        }
      }
      ++it;
    }
    const int rank = comm->rank();
    const int size = comm->size();
    if (options.print_rails) {
      for (const auto& rail : comm->transport().rails()) {
        if (rail.peer != (rank + 1) % size) continue;
        std::printf("rail %s up=%d gbps=%.4f fraction=%.4f bytes=%llu\n", rail.name.c_str(),
                    rail.up ? 1 : 0, rail.gbps, rail.fraction,
                    static_cast<unsigned long long>(rail.bytes_sent));
      }
    }
    const auto* topology = comm->topology();
    std::string over = "shm";
    if (!comm->usesSharedMemory()) {
      over = comm->transport().name();  // between hosts: "tcp" or "ibverbs"
      if (comm->usesHostSharedMemory()) over = "shm per host and " + over;
    }
    std::printf(
        "rank %d of %d ok after %d allreduces over %s, topology %s with %zu host(s), "
        "generation %d, last algorithm %s\n",
        rank, size, options.iterations, over.c_str(), topology ? topology->hash().c_str() : "none",
        topology ? topology->hosts().size() : size_t{0}, comm->generation(),
        std::string(comm->lastAlgorithm()).c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(options.linger_seconds));
    return 0;
  } catch (const railshard::PeerLostError& e) {
    std::fprintf(stderr, "PeerLostError: %s\n", e.what());
  } catch (const railshard::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
  } catch (const railshard::MismatchError& e) {
    std::fprintf(stderr, "MismatchError: %s\n", e.what());
  } catch (const railshard::InvalidArgument& e) {
    std::fprintf(stderr, "InvalidArgument: %s\n", e.what());
  } catch (const railshard::ConfigError& e) {
    std::fprintf(stderr, "ConfigError: %s\n", e.what());
  } catch (const railshard::Error& e) {
    std::fprintf(stderr, "Error: %s\n", e.what());
  }
  return 1;
}
