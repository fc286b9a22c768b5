// connect_bench: what a job pays to connect its ranks, and what the connections pin — the
// figures behind RAILSHARD_IB_CONNECT (eager: every RDMA lane at start-up; lazy: when a pair
// first talks). Every rank times init(), its first all-reduce (where lazy lanes are
// connected) and the median of the next --iters, checks every element of every result
// exactly, and reads the memory its process has pinned (VmPin in /proc/self/status: ibv_reg_mr
// pins the registered rings). Rank 0 prints one line with the slowest rank's times, the
// largest and mean pinned memory, and how many RDMA lanes were up on all ranks together.
//
//   rxe_hosts.sh job 2 connect_bench --bytes 1M         (benchmarks/testbed/rdma/connect.sh)
//   railshard-launch -n 4 connect_bench
//
// Exit status: 0; 1 when a result was wrong (or on any error); 2 for a bad command line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "benchmarks/cli_args.h"
#include "core/communicator.h"
#include "launcher/init.h"
#include "transport/transport.h"

namespace railshard::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double msSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
}

// Pinned memory of this process in MiB (VmPin; 0 where the kernel does not report it).
double pinnedMib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmPin:") {
      double kib = 0;
      status >> kib;
      return kib / 1024.0;
    }
    std::getline(status, key);
  }
  return 0;
}

// One in-place float-sum all-reduce of `count` elements, checked against the scalar sum.
bool allreduceExact(Communicator& comm, size_t count, int iteration) {
  std::vector<float> data(count);
  const auto value = [&](int rank, size_t i) {
    return static_cast<float>((rank + 1) % 7 + (i % 13) + iteration % 5);
  };
  for (size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
  comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
  for (size_t i = 0; i < count; ++i) {
    float expected = 0;
    for (int r = 0; r < comm.size(); ++r) expected += value(r, i);
    if (data[i] != expected) {
      std::fprintf(stderr, "connect_bench: rank %d: iteration %d element %zu is %g, not %g\n",
                   comm.rank(), iteration, i, static_cast<double>(data[i]),
                   static_cast<double>(expected));
      return false;
    }
  }
  return true;
}

int run(int argc, char** argv) {
  size_t bytes = 1 << 20;
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    const auto option = readOption(argc, argv, i);
    if (!option) {
      std::fprintf(stderr, "usage: connect_bench [--bytes SIZE] [--iters N]\n");
      return 2;
    }
    if (option->key == "--bytes") {
      bytes = parseBytes("--bytes", option->value);
    } else if (option->key == "--iters") {
      iters = std::max(1, std::stoi(option->value));
    } else {
      std::fprintf(stderr, "connect_bench: unknown option %s\n", option->key.c_str());
      return 2;
    }
  }
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  const auto start = SteadyClock::now();
  std::unique_ptr<Communicator> comm = init();
  const double create_ms = msSince(start);
  const auto first_start = SteadyClock::now();
  bool exact = allreduceExact(*comm, count, 0);
  const double first_ms = msSince(first_start);
  std::vector<double> steady;
  for (int i = 1; i <= iters && exact; ++i) {
    const auto t = SteadyClock::now();
    exact = allreduceExact(*comm, count, i);
    steady.push_back(msSince(t));
  }
  std::sort(steady.begin(), steady.end());
  const double steady_ms = steady.empty() ? 0 : steady[steady.size() / 2];
  double lanes_up = 0;
  for (const auto& rail : comm->transport().rails()) {
    if (rail.up && rail.remote.rfind("qpn ", 0) == 0) ++lanes_up;  // an RDMA lane
  }
  const double pinned = pinnedMib();
  // Slowest rank and largest pin (max), mean pin and lanes (sum), and whether all were exact.
  double worst[4] = {create_ms, first_ms, steady_ms, pinned};
  double total[3] = {pinned, lanes_up, exact ? 0.0 : 1.0};
  comm->allreduce(worst, 4, DataType::kFloat64, ReduceOp::kMax);
  comm->allreduce(total, 3, DataType::kFloat64, ReduceOp::kSum);
  if (comm->rank() == 0) {
    std::printf(
        "connect_bench: %d ranks, %zu-byte all-reduce: init %.1f ms, first all-reduce %.1f ms, "
        "then %.2f ms (median of %d; slowest rank each); pinned %.1f MiB per rank at most "
        "(mean %.1f); %d RDMA lanes up; %s\n",
        comm->size(), count * sizeof(float), worst[0], worst[1], worst[2], iters, worst[3],
        total[0] / comm->size(), static_cast<int>(total[1]),
        total[2] == 0 ? "every result exact" : "WRONG RESULTS");
  }
  comm->barrier();
  return total[2] == 0 ? 0 : 1;
}

}  // namespace
}  // namespace railshard::bench

int main(int argc, char** argv) {
  try {
    return railshard::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "connect_bench: %s\n", e.what());
    return 1;
  }
}
