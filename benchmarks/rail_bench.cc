// rail_bench: a timeline of one all-reduce size over time, with the rail scheduler's view of
// every rail after each iteration — to watch striping adapt when a rail's rate changes or a
// rail goes down and comes back. Every rank loops in-place float-sum all-reduces of --bytes
// for --seconds and checks every element of every result exactly; rank 0 records per
// iteration: time since start, iteration time, bus bandwidth, and for each rail to peer 1
// (RailStatus from Transport::rails()) whether it is up, its estimated Gbit/s and its share.
// It prints a line about every 0.5 s and writes every row to --csv.
//
//   testbed.sh job NAME rail_bench --bytes 16M --seconds 12 --csv timeline.csv
//   railshard-launch -n 2 rail_bench --seconds 5
//
// CSV columns: t_s,iter_s,busbw_gbs, then per rail <name>_up,<name>_gbps,<name>_fraction
// (rails in the order they first appeared; empty cells for a rail not reported in that row).
// Exit status: 0; 1 when any result was wrong (or on any error); 2 for a bad command line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "benchmarks/cli_args.h"
#include "benchmarks/perf_options.h"
#include "core/communicator.h"
#include "launcher/init.h"
#include "transport/transport.h"

namespace railshard::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr double kPrintEverySeconds = 0.5;

struct RailBenchOptions {
  size_t bytes = 16 << 20;
  double seconds = 10;
  long max_iters = 1000000;  // a bound on the loop besides time
  std::string csv;
  bool help = false;
};

std::string usage() {
  return "usage: rail_bench [options]\n"
         "  --bytes SIZE       all-reduce size (default 16M; suffixes K, M, G)\n"
         "  --seconds S        how long to loop (default 10)\n"
         "  --max-iters N      stop after N iterations at the latest (default 1000000)\n"
         "  --csv FILE         rank 0 writes one row per iteration to FILE\n"
         "  -h, --help\n"
         "Run with 2+ ranks (railshard-launch, testbed.sh job, mpirun); rank 0 prints the\n"
         "timeline and the rails to peer 1.\n";
}

RailBenchOptions parseOptions(int argc, char** argv) {
  RailBenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      continue;
    }
    const auto option = readOption(argc, argv, i);
    if (!option) throw UsageError(arg + ": missing value");
    const std::string& key = option->key;
    const std::string& value = option->value;
    if (key == "--bytes") {
      try {
        options.bytes = parseSize(key, value);
      } catch (const InvalidArgument& e) {
        throw UsageError(e.what());
      }
      if (options.bytes < sizeof(float)) throw UsageError("--bytes: must be at least 4");
    } else if (key == "--seconds") {
      char* end = nullptr;
      options.seconds = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(options.seconds > 0) || options.seconds > 1e6) {
        throw UsageError("--seconds: expected a positive number, got '" + value + "'");
      }
    } else if (key == "--max-iters") {
      char* end = nullptr;
      options.max_iters = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || options.max_iters < 1) {
        throw UsageError("--max-iters: expected a positive integer, got '" + value + "'");
      }
    } else if (key == "--csv") {
      options.csv = value;
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
  }
  return options;
}

// Rank r's input element i at iteration `iter`: small integers, so every partial sum in any
// order is exact in float and the result can be checked with ==.
inline float inputValue(int rank, size_t i, long iter) {
  return static_cast<float>(rank + 1 + static_cast<int>((i * 7 + static_cast<size_t>(iter)) % 16));
}

inline float expectedValue(int size, size_t i, long iter) {
  return static_cast<float>(size * (size + 1) / 2 +
                            size * static_cast<int>((i * 7 + static_cast<size_t>(iter)) % 16));
}

void fill(std::vector<float>& buffer, int rank, long iter) {
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = inputValue(rank, i, iter);
}

size_t countWrong(const std::vector<float>& buffer, int size, long iter) {
  size_t wrong = 0;
  for (size_t i = 0; i < buffer.size(); ++i) {
    if (buffer[i] != expectedValue(size, i, iter)) ++wrong;
  }
  return wrong;
}

struct RailSample {
  std::string name;
  bool up = false;
  double gbps = 0;
  double fraction = 0;
};

struct Row {
  double t = 0;
  double iter_s = 0;
  double busbw_gbs = 0;
  std::vector<RailSample> rails;
};

// The rails to `peer` as the transport reports them now (none for transports without rails).
std::vector<RailSample> railsTo(Communicator& comm, int peer) {
  std::vector<RailSample> out;
  for (const auto& rail : comm.transport().rails()) {
    if (rail.peer != peer) continue;
    out.push_back({rail.name, rail.up, rail.gbps, rail.fraction});
  }
  return out;
}

// Every row, one column group per rail name in order of first appearance.
void writeCsv(const std::string& path, const std::vector<Row>& rows) {
  std::vector<std::string> names;
  for (const auto& row : rows) {
    for (const auto& rail : row.rails) {
      if (std::find(names.begin(), names.end(), rail.name) == names.end()) {
        names.push_back(rail.name);
      }
    }
  }
  std::ofstream out(path);
  if (!out) throw Error("--csv: cannot write '" + path + "'");
  out << "t_s,iter_s,busbw_gbs";
  for (const auto& name : names)
    out << ',' << name << "_up," << name << "_gbps," << name << "_fraction";
  out << '\n';
  char cell[64];
  for (const auto& row : rows) {
    std::snprintf(cell, sizeof(cell), "%.6f,%.6f,%.4f", row.t, row.iter_s, row.busbw_gbs);
    out << cell;
    for (const auto& name : names) {
      const auto it = std::find_if(row.rails.begin(), row.rails.end(),
                                   [&](const RailSample& r) { return r.name == name; });
      if (it == row.rails.end()) {
        out << ",,,";
        continue;
      }
      std::snprintf(cell, sizeof(cell), ",%d,%.4f,%.4f", it->up ? 1 : 0, it->gbps, it->fraction);
      out << cell;
    }
    out << '\n';
  }
  out.flush();
  if (!out) throw Error("--csv: writing '" + path + "' failed");
}

// "rail0 up 1.87 Gbit/s 79% | rail1 DOWN 0.00 Gbit/s 0%"
std::string describeRails(const std::vector<RailSample>& rails) {
  std::string line;
  char part[160];
  for (const auto& rail : rails) {
    std::snprintf(part, sizeof(part), " | %s %s %.2f Gbit/s %3.0f%%", rail.name.c_str(),
                  rail.up ? "up" : "DOWN", rail.gbps, rail.fraction * 100);
    line += part;
  }
  return line;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int run(int argc, char** argv) {
  const RailBenchOptions options = parseOptions(argc, argv);
  if (options.help) {
    std::printf("%s", usage().c_str());
    return 0;
  }
  auto comm = init();
  const int rank = comm->rank();
  const int size = comm->size();
  const size_t count = options.bytes / sizeof(float);
  const size_t bytes = count * sizeof(float);
  const double bus_factor = size > 1 ? 2.0 * (size - 1) / size : 0.0;
  const int peer = size > 1 ? 1 : -1;  // rank 0 watches its rails to rank 1
  std::vector<float> buffer(count);
  std::vector<Row> rows;

  if (rank == 0) {
    std::printf("# rail_bench: %d ranks, %zu bytes per all-reduce (float sum, in place), %.1f s\n",
                size, bytes, options.seconds);
    std::printf(
        "# t_s: seconds since start; busbw = bytes/time * 2(n-1)/n (GB/s = 1e9 B/s), "
        "mean over the iterations since the last line; rails to rank %d\n",
        peer);
    std::fflush(stdout);
  }

  // Rank 0 decides whether to run another iteration and tells the others with a 1-element
  // broadcast, so every rank runs the same number of all-reduces and none is left waiting.
  comm->barrier();
  const auto start = SteadyClock::now();
  long iter = 0;
  size_t wrong = 0;
  size_t wrong_iters = 0;
  double last_print = 0;
  long iters_since_print = 0;
  double seconds_since_print = 0;
  int32_t go = 1;

  // Rank 0 writes what it has even when an iteration fails (a rail taken out too late, a lost
  // peer), since the timeline up to the failure is what one wants to look at then.
  auto saveCsv = [&] {
    if (rank == 0 && !options.csv.empty()) writeCsv(options.csv, rows);
  };
  try {
    while (true) {
      if (rank == 0) {
        const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
        go = elapsed < options.seconds && iter < options.max_iters ? 1 : 0;
      }
      comm->broadcast(&go, 1, DataType::kInt32, 0);
      if (!go) break;

      fill(buffer, rank, iter);
      const auto begin = SteadyClock::now();
      comm->allreduce(buffer.data(), count, DataType::kFloat32, ReduceOp::kSum);
      const auto end = SteadyClock::now();
      const size_t bad = countWrong(buffer, size, iter);
      if (bad) {
        if (wrong_iters < 5) {
          std::fprintf(stderr, "rail_bench: rank %d: iteration %ld: %zu of %zu elements wrong\n",
                       rank, iter, bad, count);
        }
        wrong += bad;
        ++wrong_iters;
      }
      ++iter;

      if (rank == 0) {
        Row row;
        row.t = std::chrono::duration<double>(end - start).count();
        row.iter_s = std::chrono::duration<double>(end - begin).count();
        row.busbw_gbs = row.iter_s > 0 ? bytes / row.iter_s / 1e9 * bus_factor : 0;
        if (peer >= 0) row.rails = railsTo(*comm, peer);
        ++iters_since_print;
        seconds_since_print += row.iter_s;
        if (row.t - last_print >= kPrintEverySeconds) {
          const double mean_busbw = seconds_since_print > 0
                                        ? bytes * static_cast<double>(iters_since_print) /
                                              seconds_since_print / 1e9 * bus_factor
                                        : 0;
          std::printf("t=%6.2fs iter %5ld  %8.2f ms  busbw %6.3f GB/s%s\n", row.t, iter,
                      seconds_since_print / static_cast<double>(iters_since_print) * 1e3,
                      mean_busbw, describeRails(row.rails).c_str());
          std::fflush(stdout);
          last_print = row.t;
          iters_since_print = 0;
          seconds_since_print = 0;
        }
        rows.push_back(std::move(row));
      }
    }
  } catch (...) {
    try {
      saveCsv();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rail_bench: %s\n", e.what());
    }
    throw;
  }
  saveCsv();

  int64_t total_wrong = static_cast<int64_t>(wrong);
  comm->allreduce(&total_wrong, 1, DataType::kInt64, ReduceOp::kSum);

  if (rank == 0) {
    std::vector<double> busbw;
    busbw.reserve(rows.size());
    for (const auto& row : rows) busbw.push_back(row.busbw_gbs);
    const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
    std::printf(
        "# %ld iterations in %.2f s; busbw median %.3f GB/s, max %.3f GB/s; %lld wrong "
        "elements%s%s\n",
        iter, elapsed, median(busbw),
        busbw.empty() ? 0.0 : *std::max_element(busbw.begin(), busbw.end()),
        static_cast<long long>(total_wrong), options.csv.empty() ? "" : "; rows in ",
        options.csv.c_str());
    std::fflush(stdout);
  }
  if (total_wrong > 0) {
    std::fprintf(stderr,
                 "rail_bench: rank %d: %lld wrong elements over all ranks (%zu here, in %zu of "
                 "%ld iterations)\n",
                 rank, static_cast<long long>(total_wrong), wrong, wrong_iters, iter);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace railshard::bench

int main(int argc, char** argv) {
  try {
    return railshard::bench::run(argc, argv);
  } catch (const railshard::bench::UsageError& e) {
    std::fprintf(stderr, "rail_bench: %s\n%s", e.what(), railshard::bench::usage().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rail_bench: %s\n", e.what());
    return 1;
  }
}
