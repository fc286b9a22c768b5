// railshard-launch: starts N ranks of a program on this host (see --help). Argument parsing
// and wiring only; the work happens in launcher/local_job.cc and the files it uses.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "core/tracing/trace_merge.h"
#include "launcher/local_job.h"
#include "launcher/process_group.h"
#include "launcher/rank_groups.h"

// The build may pass the project version; this fallback must then match project(VERSION).
#ifndef RAILSHARD_VERSION_STRING
#define RAILSHARD_VERSION_STRING "0.1.0"
#endif

namespace {

constexpr const char* kName = "railshard-launch";
constexpr int kMaxRanks = 4096;
constexpr int kUsageExit = 2;

constexpr const char* kUsage = "usage: railshard-launch -n N [options] [--] PROGRAM [ARGS...]\n";

constexpr const char* kHelp =
    "\n"
    "Starts N ranks of PROGRAM on this host (or on each of --nnodes hosts), each with "
    "RAILSHARD_RANK, RAILSHARD_WORLD_SIZE,\n"
    "RAILSHARD_LOCAL_RANK, RAILSHARD_STORE_ADDR and RAILSHARD_TOKEN set, and supervises them:\n"
    "when one rank fails the others are stopped (unless --elastic), and SIGINT/SIGTERM are\n"
    "forwarded to all. The first failure is reported in one line, e.g.\n"
    "  railshard-launch: rank 2 on host node1 failed first: exited with status 3; its last\n"
    "  error line: \"...\"\n"
    "naming how the rank ended (\"exited with status N\" or \"killed by SIGNAME\") and the last\n"
    "non-blank line it wrote to stderr.\n"
    "\n"
    "options:\n"
    "  -n, --nproc N        number of ranks, 1 to 4096 (required)\n"
    "  --store-host ADDR    address the rendezvous store listens on (default 127.0.0.1)\n"
    "  --store-port PORT    its port (default 0: any free port)\n"
    "  --nnodes N           the job spans N hosts, one railshard-launch on each with the\n"
    "                       same -n, --nnodes, --master and RAILSHARD_TOKEN (default 1)\n"
    "  --node-rank K        this host's place, 0 to N-1: it starts ranks K*n to K*n+n-1\n"
    "                       (RAILSHARD_LOCAL_RANK 0 to n-1)\n"
    "  --master HOST:PORT   with --nnodes: node 0's address; node 0's launcher hosts the\n"
    "                       rendezvous store there for every node's ranks and keeps it\n"
    "                       until every node's ranks have ended (at most 60 s after its\n"
    "                       own); torch's MASTER_PORT is PORT+1\n"
    "  --grace SECONDS      time ranks get between SIGTERM and SIGKILL when the job is\n"
    "                       stopped (default 5)\n"
    "  --no-prefix          do not put \"[rank] \" before every line a rank prints\n"
    "  --elastic            survivors carry on when a rank fails, up to --max-failures\n"
    "                       failures; the launcher then hosts the rendezvous store itself\n"
    "                       (ranks get RAILSHARD_STORE_EXTERNAL=1) and marks each failed rank\n"
    "                       in it (key railshard/lost/RANK) for Communicator::shrink()\n"
    "  --max-failures K     failures --elastic tolerates (implies --elastic; default 1);\n"
    "                       failure K+1 stops the job as without --elastic\n"
    "  --max-restarts K     a failed rank is started again, up to K times in all (implies\n"
    "                       --elastic; --max-failures defaults to K): it gets\n"
    "                       RAILSHARD_JOIN=1, railshard::init() joins the running job\n"
    "                       through the launcher's store, and the members admit it with\n"
    "                       Communicator::grow()\n"
    "  --min-ranks N        the job carries on after a failure while at least N ranks\n"
    "                       are left running, a rank being restarted included (implies\n"
    "                       --elastic; without --max-failures, any number of failures)\n"
    "  --emulate-speeds S0,S1,...\n"
    "                       real heterogeneity on one machine: rank r runs in a control\n"
    "                       group of its own with a CPU quota in proportion to Sr (the\n"
    "                       fastest at most one core, all together at most 40% of the\n"
    "                       machine's CPUs), so ranks really compute at those speeds (needs\n"
    "                       root or a delegated cgroup; one speed per rank)\n"
    "  --emulate-memory M0,M1,...\n"
    "                       rank r may use Mr bytes of memory (suffix K, M, G), its memory\n"
    "                       cgroup's limit, which the kernel enforces (as --emulate-speeds,\n"
    "                       root or a delegated cgroup; one value per rank)\n"
    "  --dump-topology FILE rank 0 writes the cluster topology graph the ranks agreed on\n"
    "                       to FILE (JSON; sets RAILSHARD_TOPO_DUMP; needs PROGRAM to\n"
    "                       call railshard::init())\n"
    "  --trace DIR          every rank records a trace of its collectives into DIR\n"
    "                       (sets RAILSHARD_TRACE; also taken from RAILSHARD_TRACE); when the\n"
    "                       job ends the ranks' files are merged into\n"
    "                       DIR/railshard-trace.json (open in ui.perfetto.dev; summarise\n"
    "                       with railshard-report DIR). Every piece of every collective is\n"
    "                       recorded: ~120 MB for a 4-rank allreduce_perf sweep\n"
    "  -h, --help           show this help and exit\n"
    "  --version            show the version and exit\n"
    "\n"
    "The job token is taken from RAILSHARD_TOKEN when it is set, else made fresh per job.\n"
    "Exit status: 0 when every rank exits 0 (--elastic: when at most K ranks failed and the\n"
    "others, at least one, exited 0); else the first failed rank's status (128 + signal\n"
    "when it was killed); 128 + signal when the launcher is interrupted; 2 for bad usage;\n"
    "127 when PROGRAM is not found.\n";

struct UsageError {
  std::string problem;
};

struct Arguments {
  railshard::launcher::LocalJobOptions job;
  std::string dump_topology;
  std::string trace;  // --trace DIR (or RAILSHARD_TRACE)
  std::optional<int> max_failures;
  std::optional<int> max_restarts;
  std::optional<int> min_ranks;
  std::vector<double> speeds;  // --emulate-speeds
  std::vector<double> memory;  // --emulate-memory, bytes
  bool help = false;
  bool version = false;
};

int parseRanks(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long ranks = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') {
    throw UsageError{"-n expects a number of ranks, got '" + value + "'"};
  }
  if (errno == ERANGE || ranks < 1 || ranks > kMaxRanks) {
    throw UsageError{"-n must be between 1 and " + std::to_string(kMaxRanks) + ", got " + value};
  }
  return static_cast<int>(ranks);
}

std::chrono::milliseconds parseGrace(const std::string& value) {
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 86400) {
    throw UsageError{"--grace expects a number of seconds (0 to 86400), got '" + value + "'"};
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

int parseCount(const char* option, const std::string& value) {
  try {
    return static_cast<int>(railshard::parseInteger(option, value, 0, kMaxRanks - 1));
  } catch (const railshard::ConfigError& error) {
    throw UsageError{error.what()};
  }
}

std::vector<double> parseSpeeds(const std::string& value) {
  std::vector<double> speeds;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, comma - at);
    char* end = nullptr;
    const double speed = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !std::isfinite(speed) || speed <= 0) {
      throw UsageError{"--emulate-speeds expects positive numbers separated by commas, got '" +
                       value + "'"};
    }
    speeds.push_back(speed);
    at = comma + 1;
  }
  return speeds;
}

std::vector<double> parseMemory(const std::string& value) {
  std::vector<double> limits;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    try {
      limits.push_back(static_cast<double>(
          railshard::parseBytes("--emulate-memory", value.substr(at, comma - at))));
    } catch (const railshard::ConfigError& error) {
      throw UsageError{error.what()};
    }
    if (limits.back() <= 0) throw UsageError{"--emulate-memory: a limit must be > 0"};
    at = comma + 1;
  }
  return limits;
}

uint16_t parsePort(const std::string& value) {
  try {
    return static_cast<uint16_t>(railshard::parseInteger("--store-port", value, 0, 65535));
  } catch (const railshard::ConfigError& error) {
    throw UsageError{error.what()};
  }
}

// Options come first; the first argument that is not one (or follows "--") is the program,
// so "railshard-launch -n 2 python -u train.py" needs no "--".
Arguments parseArguments(int argc, char** argv) {
  Arguments args;
  std::optional<int> ranks;
  int i = 1;
  while (i < argc) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    ++i;

    // Splits "--name=value" and "-nVALUE"; otherwise the value is the next argument.
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      const auto eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    } else if (arg.size() > 2) {
      name = arg.substr(0, 2);
      inline_value = arg.substr(2);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i >= argc) throw UsageError{"option " + name + " needs a value"};
      return argv[i++];
    };
    auto noValue = [&] {
      if (inline_value) throw UsageError{"option " + name + " takes no value"};
    };

    if (name == "-n" || name == "--nproc") {
      ranks = parseRanks(value());
    } else if (name == "--store-host") {
      args.job.store_host = value();
      if (args.job.store_host.empty()) throw UsageError{"--store-host needs an address"};
    } else if (name == "--store-port") {
      args.job.store_port = parsePort(value());
    } else if (name == "--nnodes") {
      args.job.nnodes = parseCount("--nnodes", value());
      if (args.job.nnodes < 1) throw UsageError{"--nnodes must be at least 1"};
    } else if (name == "--node-rank") {
      args.job.node_rank = parseCount("--node-rank", value());
    } else if (name == "--master") {
      args.job.master = value();
    } else if (name == "--grace") {
      args.job.grace = parseGrace(value());
    } else if (name == "--dump-topology") {
      args.dump_topology = value();
      if (args.dump_topology.empty()) throw UsageError{"--dump-topology needs a file name"};
    } else if (name == "--trace") {
      args.trace = value();
      if (args.trace.empty()) throw UsageError{"--trace needs a directory"};
    } else if (name == "--elastic") {
      noValue();
      args.job.elastic = true;
    } else if (name == "--max-failures") {
      args.max_failures = parseCount("--max-failures", value());
    } else if (name == "--max-restarts") {
      args.max_restarts = parseCount("--max-restarts", value());
    } else if (name == "--min-ranks") {
      args.min_ranks = parseCount("--min-ranks", value());
    } else if (name == "--emulate-speeds") {
      args.speeds = parseSpeeds(value());
    } else if (name == "--emulate-memory") {
      args.memory = parseMemory(value());
    } else if (name == "--no-prefix") {
      noValue();
      args.job.prefix_output = false;
    } else if (name == "-h" || name == "--help") {
      noValue();
      args.help = true;
      return args;
    } else if (name == "--version") {
      noValue();
      args.version = true;
      return args;
    } else {
      throw UsageError{"unknown option '" + arg + "'"};
    }
  }
  if (!ranks) throw UsageError{"missing -n N (the number of ranks to start)"};
  if (i >= argc) throw UsageError{"no program given"};
  args.job.world_size = *ranks;
  if (args.job.node_rank >= args.job.nnodes) {
    throw UsageError{"--node-rank must be below --nnodes (" + std::to_string(args.job.nnodes) +
                     "), got " + std::to_string(args.job.node_rank)};
  }
  if (args.job.nnodes > 1) {
    if (args.job.master.empty()) throw UsageError{"--nnodes > 1 needs --master HOST:PORT"};
    if (args.job.nnodes * *ranks > kMaxRanks) {
      throw UsageError{"--nnodes x -n is more than " + std::to_string(kMaxRanks) + " ranks"};
    }
  } else if (!args.job.master.empty() || args.job.node_rank != 0) {
    throw UsageError{"--master and --node-rank need --nnodes > 1"};
  }
  if (!args.speeds.empty() && args.speeds.size() != static_cast<size_t>(*ranks)) {
    throw UsageError{"--emulate-speeds gives " + std::to_string(args.speeds.size()) +
                     " speeds for " + std::to_string(*ranks) + " ranks"};
  }
  if (!args.memory.empty() && args.memory.size() != static_cast<size_t>(*ranks)) {
    throw UsageError{"--emulate-memory gives " + std::to_string(args.memory.size()) +
                     " limits for " + std::to_string(*ranks) + " ranks"};
  }
  if (args.job.nnodes > 1 &&
      (args.max_failures || args.max_restarts || args.min_ranks || args.job.elastic)) {
    throw UsageError{"--nnodes > 1 runs without --elastic (and its options) for now"};
  }
  if (args.max_failures) {
    args.job.elastic = true;
    args.job.max_failures = *args.max_failures;
  }
  if (args.max_restarts) {
    args.job.elastic = true;
    args.job.max_restarts = *args.max_restarts;
    if (!args.max_failures) args.job.max_failures = std::max(1, *args.max_restarts);
  }
  if (args.min_ranks) {
    if (*args.min_ranks < 1 || *args.min_ranks > *ranks) {
      throw UsageError{"--min-ranks must be between 1 and -n (" + std::to_string(*ranks) +
                       "), got " + std::to_string(*args.min_ranks)};
    }
    args.job.elastic = true;
    args.job.min_ranks = *args.min_ranks;
    // The floor decides; restarts still count against --max-failures when it is given.
    if (!args.max_failures) args.job.max_failures = std::numeric_limits<int>::max();
  }
  args.job.command.assign(argv + i, argv + argc);
  return args;
}

// Joins the ranks' trace files; a job whose ranks wrote none (no railshard collective ran, or
// every rank died) gets a note, not a failure.
void mergeTrace(const std::string& dir) {
  const std::string out = dir + "/railshard-trace.json";
  try {
    const auto result = railshard::tracing::writeMergedTrace(dir, out);
    for (const auto& warning : result.warnings)
      std::fprintf(stderr, "railshard-launch: trace: %s\n", warning.c_str());
    // A trace records every piece of every collective: a long run's fills a disk. Say what
    // this one takes (the ranks' files and the merged one).
    std::error_code ec;
    uintmax_t bytes = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.path().filename().string().rfind("railshard-trace", 0) == 0) {
        const uintmax_t size = entry.file_size(ec);
        if (!ec) bytes += size;
      }
    }
    std::fprintf(stderr,
                 "railshard-launch: trace of %d rank%s (%zu events) in %s; %.1f MB in %s "
                 "(trace short runs); summary: railshard-report %s\n",
                 result.ranks, result.ranks == 1 ? "" : "s", result.events, out.c_str(),
                 static_cast<double>(bytes) / 1e6, dir.c_str(), dir.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "railshard-launch: trace: not merged: %s\n", error.what());
  }
}

void printError(const std::string& line) {
  const std::string text = std::string(kName) + ": " + line + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

// Descriptors 0-2 must be open: otherwise the first pipe or socket lands there and is then
// clobbered when it becomes a rank's stdio.
void ensureStdioOpen() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) ::close(null_fd);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensureStdioOpen();
  Arguments args;
  try {
    args = parseArguments(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "%s: %s\n%sTry '%s --help' for more information.\n", kName,
                 error.problem.c_str(), kUsage, kName);
    return kUsageExit;
  }
  if (args.help) {
    std::fputs(kUsage, stdout);
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (args.version) {
    std::printf("%s (railshard) %s\n", kName, RAILSHARD_VERSION_STRING);
    return 0;
  }

  if (const char* token = std::getenv("RAILSHARD_TOKEN"); token != nullptr) {
    args.job.token = token;  // empty means unset: runLocalJob makes a fresh one
  }
  if (args.job.nnodes > 1 && args.job.token.empty()) {
    std::fprintf(stderr,
                 "%s: --nnodes %d: set RAILSHARD_TOKEN to the same value on every node (the "
                 "job's shared secret; e.g. RAILSHARD_TOKEN=$(openssl rand -hex 16))\n",
                 kName, args.job.nnodes);
    return kUsageExit;
  }
  args.job.notice = printError;
  if (!args.dump_topology.empty()) {
    // Absolute, because ranks may change directory; removed first, so that its absence
    // afterwards means no rank wrote it.
    std::string path = args.dump_topology;
    if (path[0] != '/') {
      char cwd[4096];
      if (::getcwd(cwd, sizeof(cwd)) != nullptr) path = std::string(cwd) + "/" + path;
    }
    ::unlink(path.c_str());
    ::setenv("RAILSHARD_TOPO_DUMP", path.c_str(), 1);
    args.dump_topology = path;
  }
  if (args.trace.empty()) {
    if (const char* env = std::getenv("RAILSHARD_TRACE"); env != nullptr) args.trace = env;
  }
  if (!args.trace.empty()) {
    // Absolute (ranks may change directory); last run's rank files go, so that the merge
    // shows this job only.
    std::error_code ec;
    args.trace = std::filesystem::absolute(args.trace, ec).lexically_normal().string();
    std::filesystem::create_directories(args.trace, ec);
    for (const auto& entry : std::filesystem::directory_iterator(args.trace, ec)) {
      const std::string file = entry.path().filename().string();
      if (file.rfind("railshard-trace-rank", 0) == 0) std::filesystem::remove(entry.path(), ec);
    }
    ::setenv("RAILSHARD_TRACE", args.trace.c_str(), 1);
  }
  try {
    // Declared before the job runs and destroyed after it: the groups go once the ranks have.
    std::unique_ptr<railshard::launcher::RankGroups> speed_groups;
    std::unique_ptr<railshard::launcher::RankGroups> memory_groups;
    if (!args.speeds.empty() || !args.memory.empty()) {
      args.job.cgroup_procs.resize(static_cast<size_t>(args.job.world_size));
    }
    if (!args.speeds.empty()) {
      const auto cores = railshard::launcher::coresForSpeeds(
          args.speeds, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
      speed_groups = std::make_unique<railshard::launcher::RankGroups>(
          "cpu", cores.size(), [&](const railshard::launcher::cgroup::Location& group, size_t r) {
            railshard::launcher::cgroup::setCpuQuota(group, cores[r],
                                                     railshard::launcher::RankGroups::kPeriodUs);
          });
      std::string line =
          "--emulate-speeds: ranks 0.." + std::to_string(cores.size() - 1) + " get CPU quotas of";
      for (size_t r = 0; r < cores.size(); ++r) {
        char text[32];
        std::snprintf(text, sizeof(text), "%s %.3f", r == 0 ? "" : ",", cores[r]);
        line += text;
        args.job.cgroup_procs[r].push_back(speed_groups->procsFile(r));
      }
      printError(line + " cores (" + speed_groups->parentDir() + ")");
    }
    if (!args.memory.empty()) {
      memory_groups = std::make_unique<railshard::launcher::RankGroups>(
          "memory", args.memory.size(),
          [&](const railshard::launcher::cgroup::Location& group, size_t r) {
            railshard::launcher::cgroup::setMemoryLimit(group, args.memory[r]);
          });
      std::string line =
          "--emulate-memory: ranks 0.." + std::to_string(args.memory.size() - 1) + " may use";
      for (size_t r = 0; r < args.memory.size(); ++r) {
        char text[32];
        std::snprintf(text, sizeof(text), "%s %.0f MiB", r == 0 ? "" : ",",
                      args.memory[r] / (1 << 20));
        line += text;
        args.job.cgroup_procs[r].push_back(memory_groups->procsFile(r));
      }
      printError(line + " (" + memory_groups->parentDir() + ")");
    }
    const int status = railshard::launcher::runLocalJob(args.job);
    if (!args.trace.empty()) mergeTrace(args.trace);
    if (!args.dump_topology.empty() && ::access(args.dump_topology.c_str(), F_OK) != 0) {
      printError("--dump-topology: no rank wrote " + args.dump_topology +
                 " (does the program call railshard::init()?)");
    }
    return status;
  } catch (const railshard::launcher::SpawnError& error) {
    printError(error.what());
    return error.errorNumber() == ENOENT ? 127 : 126;
  } catch (const std::exception& error) {
    printError(error.what());
    return 1;
  }
}
