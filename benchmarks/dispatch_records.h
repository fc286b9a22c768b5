#pragma once

// dispatch_bench's records of a run, and how rank 0 reports them (dispatch_report.cc): the
// step table's summaries, the ledger lines, the final line, the --json document.

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "benchmarks/dispatch_ledger.h"
#include "benchmarks/dispatch_options.h"

namespace railshard::bench {

constexpr double kRecoveryRatio = 1.10;  // --slowdown: "recovered" within this of the ideal

struct StepRecord {
  std::string policy;
  int step = 0;
  std::vector<size_t> shares;
  std::vector<double> compute_ms;
  double step_ms = 0;
  double ideal_ms = 0;
  double allreduce_ms = 0;  // the all-reduce of the rank that came to it last
  // What nextStep() adds to the step: the all-gather as the rank that came to it last saw it
  // (the others' time in it is mostly waiting for that rank) plus the slowest planning.
  double overhead_us = 0;
  double gather_us = 0;        // that all-gather, as the last rank to reach it saw it
  double plan_us = 0;          // planning, slowest rank
  double overhead_max_us = 0;  // nextStep() on the rank that spent longest in it, waiting included
  int live_ranks = 0;
  bool redo = false;  // the step was redone after a failure (this is the redo's timing)
  double joules = 0;  // drawn by every rank over the step (0: no power source)
  double ratio() const { return step_ms / ideal_ms; }
  double ratioWithAllreduce() const { return step_ms / (ideal_ms + allreduce_ms); }
};

struct Summary {
  std::string policy;
  double median_ratio = 0;
  double median_ratio_with_allreduce = 0;
  double median_step_ms = 0;
  double median_ideal_ms = 0;
  double median_allreduce_ms = 0;
  double median_overhead_us = 0;
  double median_overhead_max_us = 0;
  std::optional<int> recovery_steps;  // with --slowdown; empty when it never recovered
  double samples_per_joule = 0;       // over the steps after the warm-up; 0: no power source
  // With a failure: the first one's step, the first step the survivors ran (redone or
  // planned afresh), medians before and after it, and when steps came back within
  // kRecoveryRatio of the survivors' ideal (steps after the survivors' first; empty: never).
  std::optional<int> failure_step;
  int survivors_first_step = 0;
  double before_median_step_ms = 0;
  double before_median_ratio = 0;
  double after_median_step_ms = 0;
  double after_median_ideal_ms = 0;
  double after_median_ratio = 0;
  std::optional<int> reconverge_steps;
  double failure_cost_ms = 0;  // caught + shrink + recover, on rank 0
  // With an admission (--grow): the first grown step, steps from it until a step within 5%
  // of the median before the failure (empty: never), and the median of the steps after that.
  std::optional<int> growth_step;
  std::optional<int> regain_steps;
  double after_growth_median_step_ms = 0;
};

// One lost peer as the survivors handled it.
struct FailureEvent {
  std::vector<int> lost;  // launch ranks
  int step = 0;           // the step the survivors were in when they caught the error
  std::string error;      // what the collective raised (this rank's view)
  double caught_ms = 0;   // from the start of the failed attempt to the error
  double shrink_ms = 0;
  double recover_ms = 0;
  uint64_t committed = 0;  // steps that stand (the first step run by the survivors)
  bool redo = false;       // that step was redone with the lost ranks' ranges moved
  bool undo = false;       // this rank undid an applied step
  int survivors = 0;
  double survivors_ideal_ms = 0;  // a full batch on the survivors
};

// One admission of joiners, as rank 0 saw it.
struct GrowthEvent {
  int step = 0;            // the first step the grown group runs
  std::vector<int> slots;  // the joiners' launcher slots
  std::vector<int> launch_ranks;
  double grow_ms = 0;   // Communicator::grow()
  double admit_ms = 0;  // CollectiveDispatcher::admit() + the bench's hand-over
  int ranks = 0;        // after it
};

// What one policy's run produced (records and ledger on rank 0 of the final communicator).
struct PolicyRun {
  std::vector<StepRecord> records;
  std::vector<FailureEvent> failures;
  std::vector<GrowthEvent> growths;
  std::vector<Ledger::Epoch> ledger;
  bool ledger_consistent = true;  // every survivor holds the same ledger
};

double median(std::vector<double> values);

// "1,2,4" of values printed with `format`.

template <typename T>
std::string joined(const std::vector<T>& values, const char* format) {
  std::string out;
  char buffer[64];
  for (size_t i = 0; i < values.size(); ++i) {
    std::snprintf(buffer, sizeof(buffer), format, values[i]);
    if (i) out += ',';
    out += buffer;
  }
  return out;
}

// Medians after the warm-up, and what followed a slowdown, a failure and an admission.
Summary summarise(const BenchOptions& options, const std::string& policy, const PolicyRun& run);
void printSummary(const BenchOptions& options, const Summary& s);
// The ledger lines of one policy; returns whether the ledger is right.
bool printLedger(const std::string& policy, const PolicyRun& run);
// "proportional: 1.03x ideal, equal: 2.29x ideal -> proportional is 2.2x faster per step"
void printFinalLine(const std::vector<Summary>& summaries);
nlohmann::ordered_json toJson(const BenchOptions& options, int world,
                              const std::vector<double>& iterations_per_ms,
                              const std::vector<StepRecord>& records,
                              const std::vector<Summary>& summaries,
                              const std::vector<PolicyRun>& runs);

}  // namespace railshard::bench
