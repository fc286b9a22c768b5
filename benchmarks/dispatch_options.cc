#include "benchmarks/dispatch_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "base/error.h"
#include "benchmarks/cli_args.h"
#include "core/dispatch/policy.h"

namespace railshard::bench {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

long long parseInteger(const std::string& option, const std::string& value, long long min,
                       long long max) {
  char* end = nullptr;
  errno = 0;
  long long number = std::strtoll(value.c_str(), &end, 10);
  if (!value.empty() && end != value.c_str() && (*end == 'K' || *end == 'k')) {
    number *= 1024;
    ++end;
  } else if (!value.empty() && end != value.c_str() && (*end == 'M' || *end == 'm')) {
    number *= 1024 * 1024;
    ++end;
  }
  if (value.empty() || *end != '\0' || errno != 0 || number < min || number > max) {
    throw UsageError(option + ": expected an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + value + "'");
  }
  return number;
}

double parsePositive(const std::string& option, const std::string& value) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(number) || number <= 0) {
    throw UsageError(option + ": expected a number > 0, got '" + value + "'");
  }
  return number;
}

bool isOption(const std::string& key) {
  for (const char* option : {"--policies", "--steps", "--warmup", "--batch", "--micro", "--unit-ms",
                             "--speeds", "--slowdown", "--kill", "--grad-count", "--work", "--json",
                             "--epoch", "--stall", "--quota-change", "--watts"}) {
    if (key == option) return true;
  }
  return false;
}

}  // namespace

std::string usage() {
  return "usage: dispatch_bench [options]   (run under railshard-launch, mpirun, srun, ...)\n"
         "  --policies P,Q       policies to run in turn on the same workload (default\n"
         "                       proportional,equal); proportional, equal (= round_robin),\n"
         "                       weighted_round_robin (weights = --speeds), least_loaded\n"
         "  --steps N            steps per policy (default 30)\n"
         "  --warmup W           first W steps of each policy left out of medians (default 5)\n"
         "  --batch G            global samples per step (default 840)\n"
         "  --micro M            micro-batch: shares are whole micro-batches (default 8)\n"
         "  --unit-ms U          work per sample at speed 1, in ms (default: such that the\n"
         "                       ideal step, batch * U / sum(speeds), is 50 ms)\n"
         "  --speeds a,b,...     speed factor per rank, one per rank (default 1 each)\n"
         "  --slowdown R:F:S     from step S on (counted from 0 in each policy) rank R's speed\n"
         "                       is divided by F\n"
         "  --stall R:A:B:MS     in steps A..B-1 of each policy rank R waits MS ms for its data\n"
         "                       before computing (its loader ran dry) and reports the wait as\n"
         "                       queued work (least_loaded plans with it; proportional does not)\n"
         "  --quota-change R:S:F in step S of each policy rank R multiplies its CPU quota (its\n"
         "                       cgroup: railshard-launch --emulate-speeds) by F\n"
         "  --watts a,b,...      emulated power per rank (watts per busy core, as\n"
         "                       RAILSHARD_POWER_WATTS): the energy policy's joules per sample\n"
         "  --kill R:S[:POINT]   launch rank R kills itself (SIGKILL) in step S of the first\n"
         "                       policy; the others shrink the communicator, recover the\n"
         "                       dispatcher and finish the run (needs railshard-launch\n"
         "                       --elastic, which sets RAILSHARD_ELASTIC=1). POINT: compute\n"
         "                       (default: after computing, before the gradient all-reduce:\n"
         "                       the step is redone) or commit (after the all-reduce: the\n"
         "                       step stands). Rank 0 then checks the ledger: every sample\n"
         "                       of the epoch committed exactly once\n"
         "  --grow               at every step boundary the members admit ranks waiting to\n"
         "                       join (a rank restarted by railshard-launch --max-restarts,\n"
         "                       or started by hand with RAILSHARD_JOIN=1): grow(), the\n"
         "                       dispatcher handed over, shares from the next step\n"
         "  --grad-count N       float32 gradient elements all-reduced per step (default\n"
         "                       256K; suffixes K, M)\n"
         "  --work sleep|cpu     sleep (default): wait out the compute time, like a CPU waiting\n"
         "                       for its GPU; cpu: calibrated floating-point busy loop (ranks\n"
         "                       share cores when there are more ranks than cores)\n"
         "  --json FILE          rank 0 writes every step and a summary per policy to FILE\n"
         "  --epoch SIZE         samples per epoch (default steps * batch)\n"
         "  -h, --help\n"
         "Bad options exit with status 2.\n";
}

BenchOptions parseOptions(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      continue;
    }
    if (arg == "--grow") {
      options.grow = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
    if (arg.find('=') == std::string::npos && !isOption(arg)) {
      throw UsageError("unknown option '" + arg + "'");
    }
    const auto option = readOption(argc, argv, i);
    if (!option) throw UsageError(arg + ": missing value");
    const std::string& key = option->key;
    const std::string& value = option->value;
    if (key == "--policies") {
      options.policies = split(value, ',');
      for (const auto& policy : options.policies) {
        try {
          dispatch::parsePolicy(policy);
        } catch (const Error& e) {
          throw UsageError("--policies: " + std::string(e.what()));
        }
      }
    } else if (key == "--steps") {
      options.steps = static_cast<int>(parseInteger(key, value, 1, 1 << 24));
    } else if (key == "--warmup") {
      options.warmup = static_cast<int>(parseInteger(key, value, 0, 1 << 24));
    } else if (key == "--batch") {
      options.batch = static_cast<size_t>(parseInteger(key, value, 1, 1LL << 40));
    } else if (key == "--micro") {
      options.micro = static_cast<size_t>(parseInteger(key, value, 1, 1LL << 40));
    } else if (key == "--unit-ms") {
      options.unit_ms = parsePositive(key, value);
    } else if (key == "--speeds") {
      options.speeds.clear();
      for (const auto& part : split(value, ',')) {
        options.speeds.push_back(parsePositive(key, part));
      }
    } else if (key == "--slowdown") {
      const auto parts = split(value, ':');
      if (parts.size() != 3) {
        throw UsageError("--slowdown: expected RANK:FACTOR:STEP (e.g. 2:2:10), got '" + value +
                         "'");
      }
      Slowdown slowdown;
      slowdown.rank = static_cast<int>(parseInteger(key + " rank", parts[0], 0, 1 << 20));
      slowdown.factor = parsePositive(key + " factor", parts[1]);
      slowdown.step = static_cast<int>(parseInteger(key + " step", parts[2], 0, 1 << 24));
      options.slowdown = slowdown;
    } else if (key == "--watts") {
      options.watts.clear();
      for (const auto& part : split(value, ',')) options.watts.push_back(parsePositive(key, part));
    } else if (key == "--stall") {
      const auto parts = split(value, ':');
      if (parts.size() != 4) {
        throw UsageError("--stall: expected RANK:FROM:TO:MS (e.g. 1:10:20:30), got '" + value +
                         "'");
      }
      Stall stall;
      stall.rank = static_cast<int>(parseInteger(key + " rank", parts[0], 0, 1 << 20));
      stall.from = static_cast<int>(parseInteger(key + " from", parts[1], 0, 1 << 24));
      stall.to = static_cast<int>(parseInteger(key + " to", parts[2], 0, 1 << 24));
      stall.ms = parsePositive(key + " ms", parts[3]);
      if (stall.to <= stall.from) {
        throw UsageError("--stall: TO must be after FROM, got '" + value + "'");
      }
      options.stall = stall;
    } else if (key == "--quota-change") {
      const auto parts = split(value, ':');
      if (parts.size() != 3) {
        throw UsageError("--quota-change: expected RANK:STEP:FACTOR (e.g. 2:20:0.5), got '" +
                         value + "'");
      }
      QuotaChange change;
      change.rank = static_cast<int>(parseInteger(key + " rank", parts[0], 0, 1 << 20));
      change.step = static_cast<int>(parseInteger(key + " step", parts[1], 0, 1 << 24));
      change.factor = parsePositive(key + " factor", parts[2]);
      options.quota_change = change;
    } else if (key == "--kill") {
      const auto parts = split(value, ':');
      if (parts.size() != 2 && parts.size() != 3) {
        throw UsageError("--kill: expected RANK:STEP[:compute|commit] (e.g. 2:12), got '" + value +
                         "'");
      }
      Kill kill;
      kill.rank = static_cast<int>(parseInteger(key + " rank", parts[0], 0, 1 << 20));
      kill.step = static_cast<int>(parseInteger(key + " step", parts[1], 0, 1 << 24));
      if (parts.size() == 3) {
        if (parts[2] == "compute") {
          kill.point = Kill::Point::kCompute;
        } else if (parts[2] == "commit") {
          kill.point = Kill::Point::kCommit;
        } else {
          throw UsageError("--kill: point must be compute or commit, got '" + parts[2] + "'");
        }
      }
      options.kill = kill;
    } else if (key == "--grad-count") {
      options.grad_count = static_cast<size_t>(parseInteger(key, value, 1, 1LL << 32));
    } else if (key == "--work") {
      if (value != "sleep" && value != "cpu") {
        throw UsageError("--work: expected sleep or cpu, got '" + value + "'");
      }
      options.cpu_work = value == "cpu";
    } else if (key == "--json") {
      if (value.empty()) throw UsageError("--json: missing file name");
      options.json = value;
    } else if (key == "--epoch") {
      options.epoch = static_cast<uint64_t>(parseInteger(key, value, 1, 1LL << 62));
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
  }
  if (options.warmup >= options.steps) {
    throw UsageError("--warmup " + std::to_string(options.warmup) +
                     " leaves no step to measure out of --steps " + std::to_string(options.steps));
  }
  if (options.slowdown && options.slowdown->step >= options.steps) {
    throw UsageError("--slowdown: step " + std::to_string(options.slowdown->step) +
                     " is past the last step (--steps " + std::to_string(options.steps) + ")");
  }
  if (options.kill && options.kill->step >= options.steps) {
    throw UsageError("--kill: step " + std::to_string(options.kill->step) +
                     " is past the last step (--steps " + std::to_string(options.steps) + ")");
  }
  return options;
}

// The checks that need the world size.
void checkAgainstWorld(BenchOptions& options, int world) {
  if (options.speeds.empty()) options.speeds.assign(static_cast<size_t>(world), 1.0);
  if (options.speeds.size() != static_cast<size_t>(world)) {
    throw UsageError("--speeds: " + std::to_string(options.speeds.size()) + " speeds given for " +
                     std::to_string(world) + " ranks (one per rank)");
  }
  if (options.slowdown && options.slowdown->rank >= world) {
    throw UsageError("--slowdown: rank " + std::to_string(options.slowdown->rank) +
                     " does not exist (world size " + std::to_string(world) + ")");
  }
  if (options.kill && options.kill->rank >= world) {
    throw UsageError("--kill: rank " + std::to_string(options.kill->rank) +
                     " does not exist (world size " + std::to_string(world) + ")");
  }
  if (options.kill && world < 2) throw UsageError("--kill: needs at least 2 ranks");
  // Without an elastic launcher the killed rank ends the whole job (status 137), which would
  // read as the benchmark failing; say so before any rank starts.
  if (options.kill && std::getenv("RAILSHARD_ELASTIC") == nullptr) {
    throw UsageError(
        "--kill: needs railshard-launch --elastic (or --max-restarts), which keeps the job "
        "going when the rank dies (RAILSHARD_ELASTIC=1 where a supervisor of your own does); "
        "this launcher would stop every rank");
  }
  if (!options.watts.empty() && options.watts.size() != static_cast<size_t>(world)) {
    throw UsageError("--watts: " + std::to_string(options.watts.size()) + " values given for " +
                     std::to_string(world) + " ranks (one per rank)");
  }
  if (options.stall && options.stall->rank >= world) {
    throw UsageError("--stall: rank " + std::to_string(options.stall->rank) + " does not exist (" +
                     std::to_string(world) + " ranks)");
  }
  if (options.quota_change && options.quota_change->rank >= world) {
    throw UsageError("--quota-change: rank " + std::to_string(options.quota_change->rank) +
                     " does not exist (" + std::to_string(world) + " ranks)");
  }
  double sum = 0;
  for (double s : options.speeds) sum += s;
  if (options.unit_ms == 0) {
    options.unit_ms = kDefaultIdealStepMs * sum / static_cast<double>(options.batch);
  }
  if (options.epoch == 0) options.epoch = static_cast<uint64_t>(options.steps) * options.batch;
}

}  // namespace railshard::bench
