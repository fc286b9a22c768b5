// cluster_sim: what a job of N ranks on H hosts would cost, without processes — the real
// tuner's choice per all-reduce size and that algorithm's time in a discrete-event run over
// modelled links and cores, the start-up's store requests and ring, the sockets a rank holds
// (connected at start-up, or only the peers its collectives use), and the dispatcher's overhead
// per step (its real planning code timed here, plus the simulated all-gather of reports).
// docs/simulator.md: the model, its figures, and predictions against runs here.
//
//   cluster_sim --hosts H --ranks-per-host L [--cores C] [--cores-shared] [--sizes 8,1K,1M]
//               [--network-us A --network-gbps B] [--shm-us A --shm-gbps B]
//               [--loopback-us A --loopback-gbps B] [--reduce-gbps R] [--message-cpu-us M]
//               [--wake-cpu-us W] [--wake-per-crowding-us X] [--shm-peer-us P] [--call-cpu-us C]
//               [--yield-us Y] [--spin-us S] [--cache-kb K --reduce-far-gbps F]
//               [--store-requests-per-rank C]
//               [--store-us S]
//               [--store-trip-us T] [--store-gbps G] [--graph-reads R] [--ring-allgathers K]
//               [--sockets-per-peer S]
//               [--algorithms all|auto] [--dispatch-steps K]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "benchmarks/cli_args.h"
#include "benchmarks/sim/sim_model.h"
#include "benchmarks/sim/sim_startup.h"
#include "core/dispatch/dispatcher.h"
#include "core/progress_publisher.h"

namespace railshard::sim {
namespace {

struct Options {
  int hosts = 1;
  int ranks_per_host = 8;
  ClusterModel model;
  StartupModel startup;
  std::vector<size_t> sizes = {8, 1024, 64 << 10, 1 << 20, 16 << 20};
  bool all_algorithms = false;
  int sockets_per_peer = 1;
  int dispatch_steps = 20;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "cluster_sim: %s (see the top of benchmarks/sim/cluster_sim.cc)\n",
               why.c_str());
  std::exit(2);
}

double number(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    const double v = std::stod(value, &used);
    if (used != value.size() || v < 0) throw std::invalid_argument(value);
    return v;
  } catch (const std::exception&) {
    usage(key + ": '" + value + "' is not a non-negative number");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cores-shared") {
      o.model.cores_shared_by_hosts = true;
      continue;
    }
    const auto opt = bench::readOption(argc, argv, i);
    if (!opt) usage(arg + " needs a value");
    const std::string& k = opt->key;
    const std::string& v = opt->value;
    if (k == "--hosts")
      o.hosts = static_cast<int>(number(k, v));
    else if (k == "--ranks-per-host")
      o.ranks_per_host = static_cast<int>(number(k, v));
    else if (k == "--cores")
      o.model.cores = static_cast<int>(number(k, v));
    else if (k == "--network-us")
      o.model.network.alpha_us = number(k, v);
    else if (k == "--network-gbps")
      o.model.network.beta_gbps = number(k, v) / 8;
    else if (k == "--loopback-us")
      o.model.loopback.alpha_us = number(k, v);
    else if (k == "--loopback-gbps")
      o.model.loopback.beta_gbps = number(k, v) / 8;
    else if (k == "--shm-us")
      o.model.shm.alpha_us = number(k, v);
    else if (k == "--shm-gbps")
      o.model.shm.beta_gbps = number(k, v) / 8;
    else if (k == "--reduce-gbps")
      o.model.reduce_gbps = number(k, v) / 8;
    else if (k == "--message-cpu-us")
      o.model.message_cpu_us = number(k, v);
    else if (k == "--wake-cpu-us")
      o.model.wake_cpu_us = number(k, v);
    else if (k == "--wake-per-crowding-us")
      o.model.wake_per_crowding_us = number(k, v);
    else if (k == "--shm-peer-us")
      o.model.shm_peer_us = number(k, v);
    else if (k == "--call-cpu-us")
      o.model.call_cpu_us = number(k, v);
    else if (k == "--cache-kb")
      o.model.cache_bytes = static_cast<size_t>(number(k, v) * 1024);
    else if (k == "--reduce-far-gbps")
      o.model.reduce_far_gbps = number(k, v) / 8;
    else if (k == "--yield-us")
      o.model.yield_us = number(k, v);
    else if (k == "--spin-us")
      o.model.spin_us = number(k, v);
    else if (k == "--store-requests-per-rank")
      o.startup.store_requests_per_rank = number(k, v);
    else if (k == "--store-us")
      o.startup.store_service_us = number(k, v);
    else if (k == "--store-trip-us")
      o.startup.store_round_trip_us = number(k, v);
    else if (k == "--graph-reads")
      o.startup.graph_reads = static_cast<int>(number(k, v));
    else if (k == "--store-gbps")
      o.startup.store_gbps = number(k, v);
    else if (k == "--ring-allgathers")
      o.startup.ring_allgathers = static_cast<int>(number(k, v));
    else if (k == "--sockets-per-peer")
      o.sockets_per_peer = static_cast<int>(number(k, v));
    else if (k == "--dispatch-steps")
      o.dispatch_steps = static_cast<int>(number(k, v));
    else if (k == "--algorithms") {
      if (v != "all" && v != "auto") usage("--algorithms: 'all' or 'auto', not '" + v + "'");
      o.all_algorithms = v == "all";
    } else if (k == "--sizes") {
      o.sizes.clear();
      size_t at = 0;
      while (at <= v.size()) {
        const size_t comma = std::min(v.find(',', at), v.size());
        o.sizes.push_back(parseBytes("--sizes", v.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      usage("unknown option " + k);
    }
  }
  if (o.hosts < 1 || o.ranks_per_host < 1) usage("--hosts and --ranks-per-host must be >= 1");
  o.model.ranks_per_host.assign(static_cast<size_t>(o.hosts), o.ranks_per_host);
  return o;
}

std::string sizeText(size_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// The real dispatcher's planning for `n` ranks of unequal speed, timed here: microseconds per
// step (median), what every rank computes after the step's all-gather of reports.
double dispatchPlanMicros(int n, int steps) {
  dispatch::DispatchOptions options;
  const size_t batch = static_cast<size_t>(n) * 32;
  dispatch::Dispatcher d(n, batch * static_cast<size_t>(steps + 1), options);
  std::vector<double> times;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const auto& plan = d.plan(batch);
    for (int r = 0; r < n; ++r) {
      d.report(r, static_cast<double>(plan.samples[static_cast<size_t>(r)]), 0.1 * (1 + r % 4));
    }
    d.completeStep();
    times.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int run(const Options& o) {
  const ClusterModel& model = o.model;
  const collectives::HostLayout layout = model.layout();
  const int n = layout.worldSize();
  std::printf(
      "# cluster_sim: %s (%d ranks), %s cores%s; network %.1f us %.2f Gbit/s, shm %.2f us "
      "%.1f Gbit/s, message CPU %.1f us, wake %.1f us\n",
      layout.describe().c_str(), n,
      model.cores > 0 ? std::to_string(model.cores).c_str() : "one per rank",
      model.cores_shared_by_hosts ? " shared by all hosts" : " per host", model.network.alpha_us,
      model.network.beta_gbps * 8, model.shm.alpha_us, model.shm.beta_gbps * 8,
      model.message_cpu_us, model.wake_cpu_us);
  std::printf("\n| size | tuner's choice | predicted us | messages | peers across |%s\n",
              o.all_algorithms ? " every algorithm (us) |" : "");
  std::printf("|---|---|---|---|---|%s\n", o.all_algorithms ? "---|" : "");
  std::vector<std::set<int>> first_use(static_cast<size_t>(n));
  for (const size_t bytes : o.sizes) {
    const auto input = tunerInput(model, layout, bytes);
    const auto choice = collectives::chooseAllreduce(input, "auto", false);
    const SimResult r =
        simulate(model, layout, allreducePrograms(choice.algorithm, model, layout, bytes));
    size_t most = 0;
    for (size_t rank = 0; rank < r.peers.size(); ++rank) {
      first_use[rank].insert(r.peers[rank].begin(), r.peers[rank].end());
      most = std::max(most, r.peers[rank].size());
    }
    std::string every;
    if (o.all_algorithms) {
      for (auto a :
           {collectives::Algorithm::kRing, collectives::Algorithm::kRecursiveDoubling,
            collectives::Algorithm::kShmDirect, collectives::Algorithm::kShmReduceScatterGather,
            collectives::Algorithm::kTwoLevel, collectives::Algorithm::kTwoLevelDirect,
            collectives::Algorithm::kTwoLevelLeader}) {
        if (!std::isfinite(collectives::estimateMicros(a, input))) continue;
        const SimResult each = simulate(model, layout, allreducePrograms(a, model, layout, bytes));
        every += " " + std::string(collectives::name(a)) + "=" +
                 std::to_string(static_cast<long>(each.micros));
      }
      every += " |";
    }
    std::printf("| %s | %s | %.0f | %zu | %zu |%s\n", sizeText(bytes).c_str(),
                std::string(collectives::name(choice.algorithm)).c_str(), r.micros, r.messages,
                most, every.c_str());
  }
  // The sockets the all-reduces alone open on first use, before the dispatcher's gather adds
  // its peers.
  size_t most_allreduce = 0;
  for (const auto& peers : first_use) most_allreduce = std::max(most_allreduce, peers.size());
  // The dispatcher: an all-gather of 128 bytes per rank, then every rank plans the step.
  const SimResult gather = simulate(model, layout, allgatherPrograms(model, layout, 128));
  for (size_t rank = 0; rank < gather.peers.size(); ++rank) {
    first_use[rank].insert(gather.peers[rank].begin(), gather.peers[rank].end());
  }
  const double plan_us = dispatchPlanMicros(n, o.dispatch_steps);
  std::printf(
      "\ndispatcher per step: all-gather of reports %.0f us (simulated) + planning %.0f us "
      "(the real Dispatcher, timed here)\n",
      gather.micros, plan_us);
  const StartupResult s = simulateStartup(model, layout, o.startup);
  std::printf(
      "start-up: %.0f store requests (%.1f per rank), store %.3f s, ring all-gathers "
      "%.3f s\n",
      s.store_requests, o.startup.store_requests_per_rank, s.store_us / 1e6, s.ring_us / 1e6);
  std::printf(
      "start-up: the cluster graph's copies, %.3g GB out of the store (%.3f s at %.0f Gbit/s)\n",
      s.store_bytes_out / 1e9, s.store_send_us / 1e6, o.startup.store_gbps);
  // While the job runs: the progress records (core/progress_publisher.h decides how often).
  const double records = n / std::chrono::duration<double>(publishPeriodFor(n)).count();
  std::printf("while running: %.0f progress records a second at the store (%.0f%% of its core)\n",
              records, records * o.startup.store_service_us / 1e4);
  size_t most_first = 0;
  for (const auto& peers : first_use) most_first = std::max(most_first, peers.size());
  const int full_mesh = (n - layout.maxLocal()) * o.sockets_per_peer;
  const auto sockets = static_cast<size_t>(o.sockets_per_peer);
  std::printf(
      "sockets per rank (the most any rank holds), plus 1 to the store: %d connected at "
      "start-up (RAILSHARD_TCP_CONNECT=eager: every rank of the other hosts); on first use "
      "(lazy, auto above 64 ranks) %zu for these all-reduces, %zu with the dispatcher's "
      "all-gather of reports\n",
      full_mesh, most_allreduce * sockets, most_first * sockets);
  return 0;
}

}  // namespace
}  // namespace railshard::sim

int main(int argc, char** argv) {
  try {
    return railshard::sim::run(railshard::sim::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_sim: %s\n", e.what());
    return 1;
  }
}
