#include "core/collectives/tuner.h"

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "core/collectives/two_level.h"

namespace railshard::collectives {

std::string_view name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kShmDirect:
      return "shm_direct";
    case Algorithm::kShmReduceScatterGather:
      return "shm_rsag";
    case Algorithm::kTwoLevel:
      return "two_level";
    case Algorithm::kTwoLevelDirect:
      return "two_level_direct";
    case Algorithm::kTwoLevelLeader:
      return "two_level_leader";
  }
  return "unknown";
}

bool parseAlgorithm(const std::string& text, Algorithm& out) {
  if (text.empty() || text == "auto") return false;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kShmDirect,
                      Algorithm::kShmReduceScatterGather, Algorithm::kTwoLevel,
                      Algorithm::kTwoLevelDirect, Algorithm::kTwoLevelLeader}) {
    if (name(a) == text) {
      out = a;
      return true;
    }
  }
  throw ConfigError("RAILSHARD_ALGO: unknown algorithm '" + text +
                    "' (expected auto, ring, recursive_doubling, shm_direct, shm_rsag, two_level, "
                    "two_level_direct or two_level_leader)");
}

// Figures measured on the development machine (docs/benchmarks.md): a cross-core flag
// hand-off through shared memory costs about a microsecond; loopback TCP about 30 us per
// message once the progress thread's wake-up is counted.
LinkModel shmModel() {
  return {1.0, 8.0};
}
LinkModel tcpModel() {
  return {30.0, 1.5};
}
LinkModel networkModel(const TunerInput& input) {
  return input.network.beta_gbps > 0 ? input.network : tcpModel();
}
LinkModel sharedMemoryModel(const TunerInput& input) {
  return input.shm_link.beta_gbps > 0 && input.shm_link.alpha_us > 0 ? input.shm_link : shmModel();
}

namespace {

// Every rank of a host sends in every step of a flat algorithm (and of the direct variant's
// rounds): where the host's machine has fewer cores than ranks, their messages queue for the
// cores, each waking a thread. Measured on 16 namespaced hosts x 16 ranks on 2 cores: recursive
// doubling over all 256 ranks, estimated below the leader variant from the bare α, took
// 65-100 ms against its 10 ms.
double crowding(const TunerInput& input) {
  return std::max(1.0, input.ranks_per_core);
}

// What a flat algorithm over all ranks moves through: between hosts the network, and with
// several ranks per host also loopback TCP between the ranks of a host; a step waits for the
// slower of the two.
LinkModel flatModel(const TunerInput& input) {
  const LinkModel network = networkModel(input);
  if (input.hosts < 2 || input.ranks_per_host < 2) {
    return {network.alpha_us * crowding(input), network.beta_gbps};
  }
  const LinkModel loopback = tcpModel();
  return {std::max(network.alpha_us, loopback.alpha_us) * crowding(input),
          std::min(network.beta_gbps, loopback.beta_gbps)};
}

}  // namespace
// A CPU reduction of two operands into a third, memory-bound on that machine (GB/s of vector),
// when it was not measured.
constexpr double kReduceGBps = 2.0;

double estimateMicros(Algorithm algorithm, const TunerInput& input) {
  const double n = input.world_size;
  const double bytes = static_cast<double>(input.bytes);
  auto transfer = [](double b, const LinkModel& m) { return b / (m.beta_gbps * 1e3); };  // us
  const double reduce_gbps = input.reduce_gbps > 0 ? input.reduce_gbps : kReduceGBps;
  switch (algorithm) {
    case Algorithm::kShmDirect: {
      if (!input.shm || input.bytes > input.shm_slot_bytes)
        return std::numeric_limits<double>::infinity();
      // copy in, then read all n inputs and write the result
      const LinkModel m = sharedMemoryModel(input);
      return 2 * m.alpha_us + transfer(bytes * (1 + n + 1), m);
    }
    case Algorithm::kShmReduceScatterGather: {
      if (!input.shm) return std::numeric_limits<double>::infinity();
      const LinkModel m = sharedMemoryModel(input);
      const double pieces = std::max(
          1.0, std::ceil(bytes / std::max<double>(1, static_cast<double>(input.shm_slot_bytes))));
      // copy in (n-1)/n, reduce own 1/n reading n operands, write + copy out everything
      return pieces * 3 * m.alpha_us + transfer(bytes * ((n - 1) / n + 1 + 1 + 1), m);
    }
    case Algorithm::kRing: {
      const LinkModel m = flatModel(input);
      return 2 * (n - 1) * (m.alpha_us + transfer(bytes / n, m));
    }
    case Algorithm::kRecursiveDoubling: {
      // Each round moves the whole vector as one message and reduces it only once it has
      // all arrived, so the reduction is not hidden behind the transfer as in the ring's
      // chunked pipeline. Without this term two ranks would always pick it (one round
      // against the ring's two steps) and lose ~20% on large messages over real links.
      const LinkModel m = flatModel(input);
      const double rounds = std::floor(std::log2(n));
      const bool power_of_two = std::exp2(rounds) == n;
      return (rounds + (power_of_two ? 0 : 2)) * (m.alpha_us + transfer(bytes, m)) +
             rounds * bytes / (reduce_gbps * 1e3);
    }
    case Algorithm::kTwoLevel: {
      if (!input.host_shm || input.hosts < 2) return std::numeric_limits<double>::infinity();
      const LinkModel s = sharedMemoryModel(input);
      const LinkModel m = networkModel(input);
      const double h = input.hosts;
      const double pieces = std::max(
          1.0, std::ceil(bytes / std::max<double>(1, static_cast<double>(input.shm_slot_bytes))));
      // In the host: reduce-scatter (copy in, reduce, copy out) and all-gather (copy in
      // 1/l, copy out all), about four passes over the message. Across: a ring over h ranks
      // of 1/l of it, l rings side by side sharing the host's link, so 2(h-1)/h of the
      // message leaves each host.
      const double in_host = pieces * 4 * s.alpha_us + transfer(bytes * 4, s);
      const double chunks = static_cast<double>(twoLevelChunks(input.bytes, 1));
      // The l rings side by side queue for the cores as the flat algorithms' steps do.
      const double across = 2 * (h - 1) * m.alpha_us * crowding(input) * chunks +
                            transfer(bytes * 2 * (h - 1) / h, m);
      // Chunks overlap the two: the slower one, plus one chunk of each to fill and drain.
      if (chunks <= 1) return in_host + across;
      return std::max(in_host, across) + (in_host + across) / chunks;
    }
    case Algorithm::kTwoLevelDirect:
    case Algorithm::kTwoLevelLeader: {
      if (!input.host_shm || input.hosts < 2 || input.bytes > input.shm_slot_bytes)
        return std::numeric_limits<double>::infinity();
      const LinkModel s = sharedMemoryModel(input);
      const LinkModel m = networkModel(input);
      const double l = input.ranks_per_host;
      const double rounds = std::ceil(std::log2(static_cast<double>(input.hosts)));
      const bool power_of_two = std::exp2(rounds) == input.hosts;
      const double exchanges = rounds + (power_of_two ? 0 : 2);
      // One synchronisation in the host leaves its sum with every local rank.
      const double host_sum = 2 * s.alpha_us + transfer(bytes * (l + 2), s);
      const double reductions = rounds * bytes / (reduce_gbps * 1e3);
      if (algorithm == Algorithm::kTwoLevelDirect) {
        // Every local rank exchanges the whole message across hosts at once: l copies share
        // the host's link, and its cores where there are fewer than l.
        return host_sum + exchanges * (m.alpha_us * crowding(input) + transfer(bytes * l, m)) +
               reductions;
      }
      // One rank per host across, then a broadcast in the host (the leader's copy in,
      // everyone's copy out).
      return host_sum + exchanges * (m.alpha_us + transfer(bytes, m)) + reductions +
             2 * s.alpha_us + transfer(bytes * 2, s);
    }
  }
  return std::numeric_limits<double>::infinity();
}

TunerChoice chooseAllreduce(const TunerInput& input, const std::string& forced, bool explain) {
  Algorithm forced_algorithm;
  if (!(forced.empty() || forced == "auto") && parseAlgorithm(forced, forced_algorithm)) {
    const bool needs_shm = forced_algorithm == Algorithm::kShmDirect ||
                           forced_algorithm == Algorithm::kShmReduceScatterGather;
    if (needs_shm && !input.shm) {
      throw ConfigError("RAILSHARD_ALGO=" + forced +
                        " needs shared memory, which this communicator does not have "
                        "(ranks on several hosts, or RAILSHARD_TRANSPORT=tcp)");
    }
    const bool needs_hosts = forced_algorithm == Algorithm::kTwoLevel ||
                             forced_algorithm == Algorithm::kTwoLevelDirect ||
                             forced_algorithm == Algorithm::kTwoLevelLeader;
    if (needs_hosts && !input.host_shm) {
      throw ConfigError("RAILSHARD_ALGO=" + forced +
                        " needs several hosts whose ranks share memory, which this "
                        "communicator does not have (one host, one rank per host, or "
                        "RAILSHARD_TRANSPORT=tcp)");
    }
    const bool one_slot = forced_algorithm == Algorithm::kTwoLevelDirect ||
                          forced_algorithm == Algorithm::kTwoLevelLeader;
    if (one_slot && input.bytes > input.shm_slot_bytes) {
      return {Algorithm::kTwoLevel, "RAILSHARD_ALGO=" + forced + ", message larger than a slot"};
    }
    // shm_direct only fits messages up to one slot; larger ones fall back to shm_rsag.
    if (forced_algorithm == Algorithm::kShmDirect && input.bytes > input.shm_slot_bytes) {
      return {Algorithm::kShmReduceScatterGather,
              "RAILSHARD_ALGO=shm_direct, message larger than a slot"};
    }
    return {forced_algorithm, "RAILSHARD_ALGO=" + forced};
  }
  // The stream (and its locale) only when asked: building it costs more than a small
  // shared-memory all-reduce.
  std::optional<std::ostringstream> reason;
  if (explain) reason.emplace();
  Algorithm best = Algorithm::kRing;
  double best_cost = std::numeric_limits<double>::infinity();
  for (Algorithm a : {Algorithm::kShmDirect, Algorithm::kShmReduceScatterGather, Algorithm::kRing,
                      Algorithm::kRecursiveDoubling, Algorithm::kTwoLevel,
                      Algorithm::kTwoLevelDirect, Algorithm::kTwoLevelLeader}) {
    // One host with a segment: shared memory only. Loopback TCP moves the same bytes through
    // the same memory plus the kernel, so it wins only when a start-up measurement was
    // unlucky (a loaded moment inflates the hand-off time); and every collective on one host
    // then goes through the segment, whose header check catches ranks that call different
    // collectives (over two channels each side would wait for its deadline instead).
    const bool over_tcp = a == Algorithm::kRing || a == Algorithm::kRecursiveDoubling;
    if (input.shm && over_tcp) continue;
    const double cost = estimateMicros(a, input);
    if (!std::isfinite(cost)) continue;
    if (reason) *reason << name(a) << "=" << cost << "us ";
    if (cost < best_cost) {
      best_cost = cost;
      best = a;
    }
  }
  return {best, reason ? reason->str() : std::string()};
}

}  // namespace railshard::collectives
