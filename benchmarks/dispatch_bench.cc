// dispatch_bench: what the dispatcher buys on ranks of unequal speed. Every rank "computes" its
// share of a global batch — real work scaled by a per-rank speed factor — then all-reduces a
// gradient buffer weighted by its sample count, as a data-parallel training step does. Each
// policy in --policies runs the same workload in turn, with a fresh CollectiveDispatcher, so
// `proportional` and `equal` are compared side by side in one run. Rank 0 prints every step and
// a summary: step time against the ideal (total work / sum of speeds: every rank busy all step).
//
//   railshard-launch -n 3 dispatch_bench --speeds 1,2,4
//   railshard-launch -n 3 dispatch_bench --speeds 1,2,4 --slowdown 2:2:12 --json out.json
//   railshard-launch --elastic -n 4 dispatch_bench --speeds 1,2,4,2 --kill 2:12
//   railshard-launch --max-restarts 1 -n 4 dispatch_bench --speeds 1,2,4,2 --kill 2:12 --grow
//
// --kill: the rank dies mid-step; the survivors shrink the communicator, recover the dispatcher
// (the step is redone or replanned) and finish; the per-sample ledger must show every sample
// of the epoch exactly once (exit status 1 otherwise). The ledger is what the ranks report:
// each step's processed sample ids, summed by an all-reduce the step commits after
// (benchmarks/dispatch_ledger.h). --grow: the launcher's restarted rank joins at a step
// boundary (grow() + CollectiveDispatcher::admit()) and gets shares from the next step.
//
// --work sleep (default) models a GPU server: its CPU waits while the device computes, so a
// rank's speed is its own whatever the other ranks do. --work cpu burns calibrated
// floating-point work instead, the same number of operations per sample on every rank (the
// fastest core's calibration): with more ranks than cores they share cores, and under
// railshard-launch --emulate-speeds each rank's CPU quota sets its real speed.
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "benchmarks/dispatch_growth.h"
#include "benchmarks/dispatch_ledger.h"
#include "benchmarks/dispatch_options.h"
#include "benchmarks/dispatch_records.h"
#include "benchmarks/dispatch_work.h"
#include "core/communicator.h"
#include "core/dispatch/collective_dispatcher.h"
#include "core/dispatch/policy.h"
#include "core/dispatch/sample_weighted.h"
#include "launcher/cgroup.h"
#include "launcher/environment.h"
#include "launcher/init.h"
#include "launcher/load_monitor.h"
#include "launcher/rank_groups.h"

namespace railshard::bench {
namespace {

std::vector<double> speedsAt(const BenchOptions& options, int step) {
  std::vector<double> speeds = options.speeds;
  if (options.slowdown && step >= options.slowdown->step) {
    speeds[static_cast<size_t>(options.slowdown->rank)] /= options.slowdown->factor;
  }
  return speeds;
}

// Who is who across re-formations of the communicator, kept across policies.
struct Membership {
  HandOver state;       // slots by launch rank; what a joiner was handed
  int my_slot = 0;      // this process's launcher slot (its speed)
  bool joiner = false;  // this process joined a running job (a restarted rank)
  std::optional<dispatch::CollectiveDispatcher> joined;  // a joiner's, for its first policy
  int slot(int launch_rank) const { return state.slots.at(static_cast<size_t>(launch_rank)); }
};

long long wallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs `steps` steps of one policy on every rank; every rank keeps the records (whoever is
// rank 0 at the end prints them). With `kill` this is where a rank dies and the others carry
// on: `comm` is replaced by the shrunk communicator. With --grow the members admit joiners
// (restarted ranks) at step boundaries and `comm` is replaced by the grown one; a joiner
// enters here with the dispatcher it was handed (m.joined).
PolicyRun runPolicy(std::unique_ptr<Communicator>& comm, const BenchOptions& options,
                    size_t policy_index, double iterations_per_ms, std::vector<float>& grad,
                    launcher::LoadMonitor& monitor, const std::optional<Kill>& kill,
                    Membership& m) {
  const std::string& label = options.policies[policy_index];
  const auto world = options.speeds.size();  // launcher slots
  dispatch::DispatchOptions dispatch_options =
      dispatch::DispatchOptions::fromConfig(comm->config());
  dispatch_options.policy = dispatch::parsePolicy(label);
  dispatch_options.micro_batch = options.micro;
  // A joiner was handed its dispatcher; the others make one. Dispatcher ranks map to launch
  // ranks through dispatcher.launchRanks() (joiners appended as they come).
  std::optional<dispatch::CollectiveDispatcher> made;
  if (!m.joined) {
    // Static weights are what a user who knows the hardware would configure.
    if (dispatch_options.policy == dispatch::Policy::kWeightedRoundRobin) {
      for (const int r : comm->worldRanks()) {
        dispatch_options.weights.push_back(options.speeds[m.slot(r)]);
      }
    }
    made.emplace(*comm, options.epoch, dispatch_options);
  }
  dispatch::CollectiveDispatcher& dispatcher = m.joined ? *m.joined : *made;
  const std::vector<int>& members = dispatcher.launchRanks();

  PolicyRun run;
  Ledger ledger;
  // A joiner enters between the members' admission and their next step.
  bool entering = m.joined.has_value();
  if (entering) {
    ledger = std::move(m.state.ledger);
  } else {
    comm->barrier();
  }
  int live_printed = comm->size();
  constexpr size_t kStats = 6;  // compute, gather, plan, all-reduce, step (s), energy (J)
  const int max_failures = static_cast<int>(world) - 1;
  while (dispatcher.committedSteps() < static_cast<uint64_t>(options.steps)) {
    if (options.grow && !entering && !dispatcher.state().redoPending() &&
        comm->joinersWaiting() > 0) {
      // A step boundary with someone waiting (a restarted rank): admit it, hand it the
      // dispatcher, the ledger and where the run is.
      GrowthEvent event;
      const auto grow_start = SteadyClock::now();
      std::unique_ptr<Communicator> grown = comm->grow();
      event.grow_ms = secondsOf(grow_start) * 1e3;
      const auto admit_start = SteadyClock::now();
      const auto admission = dispatcher.admit(*grown);
      for (const int d : admission.joined) {
        event.launch_ranks.push_back(members[static_cast<size_t>(d)]);
      }
      if (admission.recovery) {
        // A member did not come to the grow (it died at the boundary): as after a failure.
        ledger.rollback(admission.recovery->committed);
        std::erase_if(run.records, [&](const StepRecord& r) {
          return static_cast<uint64_t>(r.step) >= admission.recovery->committed;
        });
      }
      m.state.policy = policy_index;
      m.state.iterations_per_ms = iterations_per_ms;
      m.state.ledger = ledger;
      handOver(*grown, true, m.my_slot, m.state);
      event.admit_ms = secondsOf(admit_start) * 1e3;
      comm = std::move(grown);
      event.step = static_cast<int>(dispatcher.committedSteps());
      event.ranks = comm->size();
      for (const int r : event.launch_ranks) event.slots.push_back(m.slot(r));
      if (comm->rank() == 0) {
        std::printf(
            "# admitted slot(s) %s as launch rank(s) %s before step %d: grow %.1f ms, "
            "dispatcher + state hand-over %.1f ms; %d ranks, at %lld us\n",
            joined(event.slots, "%d").c_str(), joined(event.launch_ranks, "%d").c_str(), event.step,
            event.grow_ms, event.admit_ms, event.ranks, wallMicros());
        std::fflush(stdout);
      }
      run.growths.push_back(std::move(event));
    }
    entering = false;
    const auto start = SteadyClock::now();
    const bool redo = dispatcher.state().redoPending();
    int step = static_cast<int>(dispatcher.committedSteps());
    try {
      const auto& ranges = dispatcher.nextStep(options.batch);
      step = static_cast<int>(dispatcher.plan().step);
      const std::vector<double> speeds = speedsAt(options, step);
      const int me = m.slot(comm->worldRank());
      const double gather = dispatcher.lastGatherSeconds();
      const double plan = dispatcher.lastPlanSeconds();
      uint64_t samples = 0;
      for (const auto& range : ranges) samples += range.size();
      if (options.quota_change && options.quota_change->rank == me &&
          options.quota_change->step == step) {
        changeOwnQuota(options.quota_change->factor, me, step);
      }
      // Waiting for data is not compute: it is reported as queued work instead.
      double stalled = 0;
      if (options.stall && options.stall->rank == me && step >= options.stall->from &&
          step < options.stall->to) {
        const auto stall_start = SteadyClock::now();
        work(options.stall->ms, false, iterations_per_ms);
        stalled = secondsOf(stall_start);
      }
      const auto compute_start = SteadyClock::now();
      work(static_cast<double>(samples) * options.unit_ms / speeds[static_cast<size_t>(me)],
           options.cpu_work, iterations_per_ms);
      const double compute = secondsOf(compute_start);
      // A restarted rank has its slot's number but does not die again.
      const bool dies = kill && !m.joiner && kill->rank == me && kill->step == step;
      const auto die = [&] {
        std::printf("# slot %d kills itself in step %d at %lld us\n", me, step, wallMicros());
        std::fflush(stdout);
        ::raise(SIGKILL);
      };
      if (dies && kill->point == Kill::Point::kCompute) die();
      launcher::LoadMonitor::Sample load = monitor.sample();
      // The data wait as samples it could have computed meanwhile, at this step's rate.
      if (stalled > 0 && compute > 0) {
        load.signals.queued_samples = stalled * static_cast<double>(samples) / compute;
      }
      dispatcher.finishStep(static_cast<double>(samples), compute, load.signals,
                            load.energy_joules);
      const auto allreduce_start = SteadyClock::now();
      dispatch::allreduceSampleMean(*comm, grad.data(), grad.size(), DataType::kFloat32,
                                    dispatcher.mySamples(), dispatcher.stepSamples());
      const double allreduce = secondsOf(allreduce_start);
      const double step_seconds = secondsOf(start);
      // The step's ledger: the sample ids each rank processed, summed over the ranks. Part
      // of the step: it commits only once this all-reduce succeeded too.
      std::vector<int32_t> counts = Ledger::marks(options.epoch, ranges);
      comm->allreduce(counts.data(), counts.size(), DataType::kInt32, ReduceOp::kSum);
      // The gradient step is applied: the step's samples are in the model.
      dispatcher.commitStep();
      ledger.commit(dispatcher.dispatcher().epoch(), dispatcher.plan().step, counts);
      if (dies && kill->point == Kill::Point::kCommit) die();

      // Outside the timed region: every rank's numbers to every rank, for the records.
      const double mine[kStats] = {compute,   gather,       plan,
                                   allreduce, step_seconds, load.energy_joules};
      const auto n = static_cast<size_t>(comm->size());
      std::vector<double> all(n * kStats);
      comm->allgather(mine, all.data(), kStats, DataType::kFloat64);
      const std::vector<int> launch = comm->worldRanks();

      StepRecord record;
      record.policy = label;
      record.step = step;
      record.redo = redo;
      record.live_ranks = comm->size();
      record.shares.assign(world, 0);
      for (size_t r = 0; r < members.size(); ++r) {
        // A dead rank and the rank restarted in its slot share a column (one has 0).
        record.shares[static_cast<size_t>(m.slot(members[r]))] += dispatcher.plan().samples[r];
      }
      double speed_sum = 0;
      for (const int r : launch) speed_sum += speeds[static_cast<size_t>(m.slot(r))];
      record.ideal_ms = static_cast<double>(dispatcher.stepSamples()) * options.unit_ms / speed_sum;
      record.step_ms = all[4] * 1e3;  // rank 0's view
      record.allreduce_ms = all[3] * 1e3;
      record.compute_ms.assign(world, 0);
      for (size_t r = 0; r < n; ++r) {
        const double* stats = &all[r * kStats];
        record.compute_ms[static_cast<size_t>(m.slot(launch[r]))] = stats[0] * 1e3;
        record.joules += stats[5];
        record.gather_us = r == 0 ? stats[1] * 1e6 : std::min(record.gather_us, stats[1] * 1e6);
        record.plan_us = std::max(record.plan_us, stats[2] * 1e6);
        record.overhead_max_us = std::max(record.overhead_max_us, (stats[1] + stats[2]) * 1e6);
        // Ranks that finished computing early wait inside the all-reduce; the one that came
        // last measured the all-reduce itself.
        record.allreduce_ms = std::min(record.allreduce_ms, stats[3] * 1e3);
      }
      record.overhead_us = record.gather_us + record.plan_us;
      if (comm->rank() == 0) {
        std::printf("%-14s %4d%s %-*s  %-*s  %8.1f  %8.1f  %6.3f  %9.2f  %6.0f  %7.0f\n",
                    label.c_str(), step, redo ? "r" : " ", static_cast<int>(world * 5),
                    joined(record.shares, "%zu").c_str(), static_cast<int>(world * 7),
                    joined(record.compute_ms, "%.1f").c_str(), record.step_ms, record.ideal_ms,
                    record.ratio(), record.allreduce_ms, record.overhead_us,
                    record.overhead_max_us);
        if (record.live_ranks != live_printed) {
          // When the job is going again after a loss or an admission (restart_times-style
          // stamps: one host, one wall clock).
          std::printf("# first step on %d ranks (step %d) done at %lld us\n", record.live_ranks,
                      step, wallMicros());
        }
        std::fflush(stdout);
      }
      live_printed = record.live_ranks;
      run.records.push_back(std::move(record));
    } catch (const Error& e) {
      // A lost peer (PeerLostError, or a TimeoutError naming who never came): carry on with
      // the survivors. Anything else (a mismatch, a bad argument) is a bug: stop.
      if (dynamic_cast<const PeerLostError*>(&e) == nullptr &&
          dynamic_cast<const TimeoutError*>(&e) == nullptr) {
        throw;
      }
      if (static_cast<int>(run.failures.size()) >= max_failures) throw;
      FailureEvent event;
      event.step = step;
      event.error = e.what();
      event.caught_ms = secondsOf(start) * 1e3;
      const auto shrink_start = SteadyClock::now();
      std::unique_ptr<Communicator> survivors = comm->shrink();
      event.shrink_ms = secondsOf(shrink_start) * 1e3;
      const dispatch::Recovery recovery = dispatcher.recover(*survivors);
      event.recover_ms = dispatcher.lastRecoverSeconds() * 1e3;
      comm = std::move(survivors);
      for (const int r : recovery.failed) event.lost.push_back(members[static_cast<size_t>(r)]);
      event.committed = recovery.committed;
      event.redo = recovery.redo;
      event.undo = recovery.undo_last_step;
      event.survivors = comm->size();
      double speed_sum = 0;
      const std::vector<double> speeds = speedsAt(options, static_cast<int>(recovery.committed));
      for (const int r : comm->worldRanks()) speed_sum += speeds[static_cast<size_t>(m.slot(r))];
      event.survivors_ideal_ms = static_cast<double>(options.batch) * options.unit_ms / speed_sum;
      // Back to the last consistent state: the ledger (and the model, had it one) loses the
      // steps that were undone; the gradient buffer, which a failed in-place all-reduce may
      // have left half-reduced, is this rank's own again (every rank's mean is 1).
      ledger.rollback(recovery.committed);
      std::erase_if(run.records, [&](const StepRecord& r) {
        return static_cast<uint64_t>(r.step) >= recovery.committed;
      });
      std::fill(grad.begin(), grad.end(), 1.0f);
      if (comm->rank() == 0) {
        std::string lost;
        for (const int r : event.lost) {
          lost += lost.empty() ? "rank " : ", ";
          lost += std::to_string(r);
        }
        std::printf(
            "# %s lost in step %d (caught after %.1f ms: %s); shrink %.1f ms, recover %.2f ms; "
            "%d survivors; steps 0..%lld stand, step %llu %s; survivors' ideal step %.1f ms\n",
            lost.c_str(), event.step, event.caught_ms, event.error.c_str(), event.shrink_ms,
            event.recover_ms, event.survivors, static_cast<long long>(event.committed) - 1,
            static_cast<unsigned long long>(event.committed),
            event.redo ? "is redone with the lost ranges moved to the survivors"
                       : "is planned afresh among the survivors",
            event.survivors_ideal_ms);
        std::fflush(stdout);
      }
      run.failures.push_back(std::move(event));
    }
  }

  // Every survivor must hold the same ledger (they committed and rolled back alike).
  const uint64_t mine = ledger.fingerprint();
  std::vector<uint64_t> theirs(static_cast<size_t>(comm->size()));
  comm->allgather(&mine, theirs.data(), sizeof(mine), DataType::kUInt8);
  for (const uint64_t f : theirs) run.ledger_consistent = run.ledger_consistent && f == mine;
  const dispatch::Dispatcher& d = dispatcher.dispatcher();
  run.ledger = ledger.check(options.epoch, d.epoch(), d.assigned());
  return run;
}

int run(int argc, char** argv) {
  BenchOptions options = parseOptions(argc, argv);
  if (options.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  const long long started_us = wallMicros();
  // Checked against the launch's world before anyone connects: every rank fails alike at once
  // (after init() a rank still connecting would see rank 0's store vanish and fail otherwise).
  const launcher::LaunchEnvironment env =
      launcher::detectEnvironment(launcher::processEnvironment());
  checkAgainstWorld(options, env.size);
  auto comm = init();
  const int rank = comm->rank();
  const int world = comm->size();
  // A restarted rank (railshard-launch --max-restarts) joined a running job in init(): its
  // communicator is of a later generation. Its launcher slot says whose speed it has.
  Membership m;
  m.joiner = comm->generation() > 0;
  m.my_slot = m.joiner ? env.rank : comm->worldRank();
  for (int r = 0; r < world; ++r) m.state.slots.push_back(r);
  if (m.joiner) {
    // The members' grow() admitted this process; their admit() and hand-over follow.
    const long long admitted_us = wallMicros();
    m.joined.emplace(dispatch::CollectiveDispatcher::joined(*comm));
    handOver(*comm, false, m.my_slot, m.state);
    std::printf(
        "# slot %d rejoined as launch rank %d (dispatcher rank %d) before step %llu: process "
        "started at %lld us, admitted at %lld us, handed its state at %lld us (%s)\n",
        m.my_slot, comm->worldRank(), m.joined->myRank(),
        static_cast<unsigned long long>(m.joined->committedSteps()), started_us, admitted_us,
        wallMicros(), describeLinks(*comm).c_str());
    std::fflush(stdout);
  }

  if (options.kill && rank == 0) {
    std::printf("# --kill: rank %d kills itself in step %d (%s)\n", options.kill->rank,
                options.kill->step,
                options.kill->point == Kill::Point::kCompute
                    ? "after computing, before the gradient all-reduce"
                    : "after the gradient all-reduce");
  }
  std::ofstream json_file;
  if (rank == 0 && !options.json.empty()) {
    // Opened now so that a bad path fails before the run, not after it.
    json_file.open(options.json);
    if (!json_file) throw Error("--json: cannot write '" + options.json + "'");
  }
  // Calibration is collective: a joiner takes the first member's (one host, one kind of core).
  double iterations_per_ms =
      m.joiner ? m.state.iterations_per_ms : (options.cpu_work ? calibrate(*comm) : 0);
  std::vector<double> all_iterations_per_ms(static_cast<size_t>(world));
  if (!m.joiner) {
    comm->allgather(&iterations_per_ms, all_iterations_per_ms.data(), 1, DataType::kFloat64);
    // A sample is the same work everywhere: the fastest core's calibration. Ranks the
    // machine makes slower (railshard-launch --emulate-speeds, a busy core) take longer.
    iterations_per_ms =
        *std::max_element(all_iterations_per_ms.begin(), all_iterations_per_ms.end());
  }
  // Every rank's gradient holds the mean 1.0; the sample-weighted mean keeps it 1.0, which is
  // checked at the end.
  std::vector<float> grad(options.grad_count, 1.0f);

  if (rank == 0) {
    double sum = 0;
    for (double s : options.speeds) sum += s;
    std::printf(
        "# dispatch_bench: %d ranks, speeds %s, batch %zu (micro-batch %zu), %.4f ms "
        "per sample at speed 1, work %s, all-reduce of %zu floats per step\n",
        world, joined(options.speeds, "%g").c_str(), options.batch, options.micro, options.unit_ms,
        options.cpu_work ? "cpu" : "sleep", options.grad_count);
    std::printf("# ideal step = batch * unit / sum(speeds) = %.1f ms",
                static_cast<double>(options.batch) * options.unit_ms / sum);
    if (options.slowdown) {
      std::printf("; from step %d rank %d runs %gx slower", options.slowdown->step,
                  options.slowdown->rank, options.slowdown->factor);
    }
    if (options.cpu_work) {
      std::printf("\n# cpu work: spin iterations per ms, each rank alone on a core: %s",
                  joined(all_iterations_per_ms, "%.0f").c_str());
    }
    std::printf(
        "\n# ratio = step / ideal. allred_ms: the all-reduce of the rank that reached it last. "
        "ovh_us: nextStep's all-gather (as the last rank to reach it saw it) + planning; "
        "ovh_max: the longest nextStep of any rank, waiting for the others included\n");
    std::printf("%-14s %4s  %-*s  %-*s  %8s  %8s  %6s  %9s  %6s  %7s\n", "# policy", "step",
                world * 5, "shares", world * 7, "compute_ms", "step_ms", "ideal_ms", "ratio",
                "allred_ms", "ovh_us", "ovh_max");
    std::fflush(stdout);
  }

  // This rank's load signals each step (memory, CPU quota and throttling, power); the queue
  // is --stall's.
  launcher::LoadMonitor::Options monitoring = launcher::LoadMonitor::fromConfig(comm->config(), -1);
  if (!options.watts.empty())
    monitoring.emulated_watts = options.watts[static_cast<size_t>(m.my_slot)];
  launcher::LoadMonitor monitor(monitoring);
  std::vector<StepRecord> records;
  std::vector<Summary> summaries;
  std::vector<PolicyRun> runs;
  bool ledgers_ok = true;
  for (size_t p = m.joiner ? m.state.policy : 0; p < options.policies.size(); ++p) {
    const std::string& policy = options.policies[p];
    // The kill happens once, in the first policy; later ones run on the survivors.
    PolicyRun policy_run = runPolicy(comm, options, p, iterations_per_ms, grad, monitor,
                                     runs.empty() ? options.kill : std::nullopt, m);
    summaries.push_back(summarise(options, policy, policy_run));
    // Every rank checks (they hold the same ledger); rank 0 prints.
    bool ok = policy_run.ledger_consistent;
    for (const auto& e : policy_run.ledger) ok = ok && e.ok();
    ledgers_ok = ledgers_ok && ok;
    if (comm->rank() == 0) {
      printSummary(options, summaries.back());
      printLedger(policy, policy_run);
      std::fflush(stdout);
    }
    records.insert(records.end(), policy_run.records.begin(), policy_run.records.end());
    runs.push_back(std::move(policy_run));
    m.joined.reset();  // a joiner's later policies start fresh, as everyone's
  }

  for (const float g : {grad.front(), grad.back()}) {
    if (std::fabs(g - 1.0f) > 1e-3f) {
      throw Error("gradient mean drifted to " + std::to_string(g) +
                  " (expected 1): sample weighting is wrong");
    }
  }
  if (comm->rank() == 0) {
    printFinalLine(summaries);
    // Rank 0 of the end may not be the one that opened the file (launch rank 0 can be killed).
    if (!json_file.is_open() && !options.json.empty()) json_file.open(options.json);
    if (!options.json.empty()) {
      if (!json_file) throw Error("--json: cannot write '" + options.json + "'");
      json_file << toJson(options, world, all_iterations_per_ms, records, summaries, runs).dump(2)
                << "\n";
      json_file.close();
      if (!json_file) throw Error("--json: writing '" + options.json + "' failed");
    }
    std::fflush(stdout);
  }
  comm->barrier();
  if (!ledgers_ok) {
    std::fprintf(stderr, "dispatch_bench: the ledger shows samples not processed exactly once\n");
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
    std::fprintf(stderr, "dispatch_bench: %s\n(dispatch_bench --help lists the options)\n",
                 e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dispatch_bench: %s\n", e.what());
    return 1;
  }
}
