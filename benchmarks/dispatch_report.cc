#include "benchmarks/dispatch_records.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/dispatch/policy.h"

namespace railshard::bench {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Summary summarise(const BenchOptions& options, const std::string& policy, const PolicyRun& run) {
  const std::vector<StepRecord>& records = run.records;
  Summary s;
  s.policy = policy;
  std::vector<double> ratio, ratio_ar, step_ms, ideal_ms, allreduce_ms, overhead_us,
      overhead_max_us;
  double samples = 0;
  double joules = 0;
  for (const auto& r : records) {
    if (r.step < options.warmup) continue;
    for (const size_t n : r.shares) samples += static_cast<double>(n);
    joules += r.joules;
    ratio.push_back(r.ratio());
    ratio_ar.push_back(r.ratioWithAllreduce());
    step_ms.push_back(r.step_ms);
    ideal_ms.push_back(r.ideal_ms);
    allreduce_ms.push_back(r.allreduce_ms);
    overhead_us.push_back(r.overhead_us);
    overhead_max_us.push_back(r.overhead_max_us);
  }
  s.median_ratio = median(ratio);
  s.median_ratio_with_allreduce = median(ratio_ar);
  s.median_step_ms = median(step_ms);
  s.median_ideal_ms = median(ideal_ms);
  s.median_allreduce_ms = median(allreduce_ms);
  s.median_overhead_us = median(overhead_us);
  s.median_overhead_max_us = median(overhead_max_us);
  s.samples_per_joule = joules > 0 ? samples / joules : 0;
  if (options.slowdown) {
    // Steps after the slowdown until the first one within kRecoveryRatio of the new ideal
    // (0: the step the rank slowed down was already within it).
    for (const auto& r : records) {
      if (r.step >= options.slowdown->step && r.ratio() <= kRecoveryRatio) {
        s.recovery_steps = r.step - options.slowdown->step;
        break;
      }
    }
  }
  if (!run.failures.empty()) {
    const FailureEvent& f = run.failures.front();
    s.failure_step = f.step;
    s.survivors_first_step = static_cast<int>(f.committed);
    s.failure_cost_ms = f.caught_ms + f.shrink_ms + f.recover_ms;
    std::vector<double> before_ms, before_ratio, after_ms, after_ideal, after_ratio;
    for (const auto& r : records) {
      if (r.step >= options.warmup && r.step < s.survivors_first_step) {
        before_ms.push_back(r.step_ms);
        before_ratio.push_back(r.ratio());
      }
      // On the survivors: until an admission grows the group again.
      if (r.step > s.survivors_first_step &&
          (run.growths.empty() || r.step < run.growths.front().step)) {
        after_ms.push_back(r.step_ms);
        after_ideal.push_back(r.ideal_ms);
        after_ratio.push_back(r.ratio());
      }
      if (!s.reconverge_steps && r.step >= s.survivors_first_step && r.ratio() <= kRecoveryRatio) {
        s.reconverge_steps = r.step - s.survivors_first_step;
      }
    }
    s.before_median_step_ms = median(before_ms);
    s.before_median_ratio = median(before_ratio);
    s.after_median_step_ms = median(after_ms);
    s.after_median_ideal_ms = median(after_ideal);
    s.after_median_ratio = median(after_ratio);
  }
  if (!run.growths.empty() && s.before_median_step_ms > 0) {
    s.growth_step = run.growths.front().step;
    std::vector<double> after;
    for (const auto& r : records) {
      if (r.step < *s.growth_step) continue;
      if (!s.regain_steps && r.step_ms <= 1.05 * s.before_median_step_ms) {
        s.regain_steps = r.step - *s.growth_step;
      }
      if (s.regain_steps) after.push_back(r.step_ms);
    }
    s.after_growth_median_step_ms = median(after);
  }
  return s;
}

void printSummary(const BenchOptions& options, const Summary& s) {
  std::printf(
      "# %s: median after %d warm-up steps: %.3fx ideal (%.3fx ideal+allreduce), step "
      "%.1f ms (ideal %.1f, all-reduce %.2f), dispatch overhead %.0f us = %.3f%% of the "
      "step (%.0f us = %.3f%% waiting included)",
      s.policy.c_str(), options.warmup, s.median_ratio, s.median_ratio_with_allreduce,
      s.median_step_ms, s.median_ideal_ms, s.median_allreduce_ms, s.median_overhead_us,
      s.median_overhead_us / 1e3 / s.median_step_ms * 100, s.median_overhead_max_us,
      s.median_overhead_max_us / 1e3 / s.median_step_ms * 100);
  if (s.samples_per_joule > 0) std::printf("; %.2f samples per joule", s.samples_per_joule);
  if (options.slowdown) {
    if (s.recovery_steps) {
      std::printf("; within %.2fx of the new ideal %d steps after the slowdown", kRecoveryRatio,
                  *s.recovery_steps);
    } else {
      std::printf("; never back within %.2fx of the new ideal", kRecoveryRatio);
    }
  }
  std::printf("\n");
  if (s.failure_step) {
    std::printf(
        "# %s: failure in step %d: before it %.1f ms per step (%.3fx ideal); the failure cost "
        "%.1f ms (caught + shrink + recover)",
        s.policy.c_str(), *s.failure_step, s.before_median_step_ms, s.before_median_ratio,
        s.failure_cost_ms);
    if (s.after_median_step_ms > 0) {
      std::printf(
          "; after step %d, on the survivors: %.1f ms per step, survivors' ideal %.1f ms "
          "(%.3fx)",
          s.survivors_first_step, s.after_median_step_ms, s.after_median_ideal_ms,
          s.after_median_ratio);
    }
    if (s.reconverge_steps) {
      std::printf("; re-converged within %.2fx of the survivors' ideal %d steps after step %d\n",
                  kRecoveryRatio, *s.reconverge_steps, s.survivors_first_step);
    } else {
      std::printf("; never back within %.2fx of the survivors' ideal\n", kRecoveryRatio);
    }
  }
  if (s.growth_step) {
    if (s.regain_steps) {
      std::printf(
          "# %s: grown again before step %d: within 5%% of the step time before the failure "
          "(%.1f ms) %d steps after it; from then on %.1f ms per step\n",
          s.policy.c_str(), *s.growth_step, s.before_median_step_ms, *s.regain_steps,
          s.after_growth_median_step_ms);
    } else {
      std::printf("# %s: grown again before step %d: never back within 5%% of %.1f ms\n",
                  s.policy.c_str(), *s.growth_step, s.before_median_step_ms);
    }
  }
}

// "# ledger (proportional): epoch 0: 8400 samples, each processed exactly once (0 missing,
// 0 duplicated); rank 2 lost at step 12". Returns whether the ledger is right.
bool printLedger(const std::string& policy, const PolicyRun& run) {
  bool ok = run.ledger_consistent;
  std::string lost;
  for (const auto& f : run.failures) {
    for (const int r : f.lost) {
      lost += "; rank ";
      lost += std::to_string(r);
      lost += " lost at step ";
      lost += std::to_string(f.step);
    }
  }
  for (const auto& e : run.ledger) {
    ok = ok && e.ok();
    if (e.ok()) {
      std::printf(
          "# ledger (%s): epoch %llu: %llu samples, each processed exactly once (0 missing, 0 "
          "duplicated)%s\n",
          policy.c_str(), static_cast<unsigned long long>(e.epoch),
          static_cast<unsigned long long>(e.expected), lost.c_str());
    } else {
      std::printf(
          "# ledger (%s): epoch %llu: %llu samples, NOT each processed exactly once (%llu "
          "missing, %llu duplicated, %llu beyond the samples handed out)%s\n",
          policy.c_str(), static_cast<unsigned long long>(e.epoch),
          static_cast<unsigned long long>(e.expected), static_cast<unsigned long long>(e.missing),
          static_cast<unsigned long long>(e.duplicated), static_cast<unsigned long long>(e.outside),
          lost.c_str());
    }
  }
  if (!run.ledger_consistent) {
    std::printf("# ledger (%s): the survivors' ledgers differ\n", policy.c_str());
  }
  return ok;
}

// "proportional: 1.03x ideal, equal: 2.29x ideal -> proportional is 2.2x faster per step"
void printFinalLine(const std::vector<Summary>& summaries) {
  std::string line;
  for (const auto& s : summaries) {
    char part[128];
    std::snprintf(part, sizeof(part), "%s%s: %.2fx ideal", line.empty() ? "" : ", ",
                  s.policy.c_str(), s.median_ratio);
    line += part;
  }
  const Summary* proportional = nullptr;
  const Summary* equal = nullptr;
  for (const auto& s : summaries) {
    const auto policy = dispatch::parsePolicy(s.policy);
    if (!proportional && policy == dispatch::Policy::kProportional) proportional = &s;
    if (!equal && policy == dispatch::Policy::kRoundRobin) equal = &s;
  }
  if (proportional && equal && proportional->median_step_ms > 0) {
    char part[160];
    std::snprintf(part, sizeof(part), " -> %s is %.2fx faster per step than %s",
                  proportional->policy.c_str(),
                  equal->median_step_ms / proportional->median_step_ms, equal->policy.c_str());
    line += part;
  }
  std::printf("%s\n", line.c_str());
}

nlohmann::ordered_json toJson(const BenchOptions& options, int world,
                              const std::vector<double>& iterations_per_ms,
                              const std::vector<StepRecord>& records,
                              const std::vector<Summary>& summaries,
                              const std::vector<PolicyRun>& runs) {
  nlohmann::ordered_json j;
  j["world_size"] = world;
  j["speeds"] = options.speeds;
  j["batch"] = options.batch;
  j["micro"] = options.micro;
  j["unit_ms"] = options.unit_ms;
  j["steps_per_policy"] = options.steps;
  j["warmup"] = options.warmup;
  j["grad_count"] = options.grad_count;
  j["work"] = options.cpu_work ? "cpu" : "sleep";
  if (options.cpu_work) j["cpu_iterations_per_ms"] = iterations_per_ms;
  j["epoch"] = options.epoch;
  j["policies"] = options.policies;
  if (options.slowdown) {
    j["slowdown"] = {{"rank", options.slowdown->rank},
                     {"factor", options.slowdown->factor},
                     {"step", options.slowdown->step}};
  } else {
    j["slowdown"] = nullptr;
  }
  if (options.kill) {
    j["kill"] = {{"rank", options.kill->rank},
                 {"step", options.kill->step},
                 {"point", options.kill->point == Kill::Point::kCompute ? "compute" : "commit"}};
  } else {
    j["kill"] = nullptr;
  }
  auto& steps = j["steps"] = nlohmann::ordered_json::array();
  for (const auto& r : records) {
    steps.push_back({{"policy", r.policy},
                     {"step", r.step},
                     {"shares", r.shares},
                     {"compute_ms", r.compute_ms},
                     {"step_ms", r.step_ms},
                     {"joules", r.joules},
                     {"ideal_ms", r.ideal_ms},
                     {"ratio", r.ratio()},
                     {"allreduce_ms", r.allreduce_ms},
                     {"ratio_to_ideal_plus_allreduce", r.ratioWithAllreduce()},
                     {"overhead_us", r.overhead_us},
                     {"gather_us", r.gather_us},
                     {"plan_us", r.plan_us},
                     {"overhead_max_us", r.overhead_max_us},
                     {"live_ranks", r.live_ranks},
                     {"redo", r.redo}});
  }
  auto& summary = j["summary"] = nlohmann::ordered_json::array();
  for (const auto& s : summaries) {
    nlohmann::ordered_json o = {
        {"policy", s.policy},
        {"dispatch_policy", std::string(dispatch::name(dispatch::parsePolicy(s.policy)))},
        {"median_ratio_to_ideal", s.median_ratio},
        {"median_ratio_to_ideal_plus_allreduce", s.median_ratio_with_allreduce},
        {"median_step_ms", s.median_step_ms},
        {"samples_per_joule", s.samples_per_joule},
        {"median_ideal_ms", s.median_ideal_ms},
        {"median_allreduce_ms", s.median_allreduce_ms},
        {"median_overhead_us", s.median_overhead_us},
        {"overhead_percent", s.median_overhead_us / 1e3 / s.median_step_ms * 100},
        {"median_overhead_max_us", s.median_overhead_max_us},
        {"overhead_max_percent", s.median_overhead_max_us / 1e3 / s.median_step_ms * 100}};
    if (options.slowdown) {
      o["recovery_steps"] =
          s.recovery_steps ? nlohmann::ordered_json(*s.recovery_steps) : nlohmann::ordered_json();
    }
    const size_t index = static_cast<size_t>(&s - summaries.data());
    if (index < runs.size()) {
      const PolicyRun& run = runs[index];
      auto& failures = o["failures"] = nlohmann::ordered_json::array();
      for (const auto& f : run.failures) {
        failures.push_back({{"lost_ranks", f.lost},
                            {"step", f.step},
                            {"error", f.error},
                            {"caught_ms", f.caught_ms},
                            {"shrink_ms", f.shrink_ms},
                            {"recover_ms", f.recover_ms},
                            {"steps_standing", f.committed},
                            {"redo", f.redo},
                            {"survivors", f.survivors},
                            {"survivors_ideal_ms", f.survivors_ideal_ms}});
      }
      auto& growths = o["growths"] = nlohmann::ordered_json::array();
      for (const auto& g : run.growths) {
        growths.push_back({{"slots", g.slots},
                           {"launch_ranks", g.launch_ranks},
                           {"first_step", g.step},
                           {"grow_ms", g.grow_ms},
                           {"admit_ms", g.admit_ms},
                           {"ranks", g.ranks}});
      }
      if (s.growth_step) {
        o["after_growth"] = {
            {"growth_step", *s.growth_step},
            {"regain_steps",
             s.regain_steps ? nlohmann::ordered_json(*s.regain_steps) : nlohmann::ordered_json()},
            {"after_regain_median_step_ms", s.after_growth_median_step_ms}};
      }
      if (s.failure_step) {
        o["after_failure"] = {
            {"failure_step", *s.failure_step},
            {"survivors_first_step", s.survivors_first_step},
            {"before_median_step_ms", s.before_median_step_ms},
            {"before_median_ratio", s.before_median_ratio},
            {"failure_cost_ms", s.failure_cost_ms},
            {"after_median_step_ms", s.after_median_step_ms},
            {"after_median_ideal_ms", s.after_median_ideal_ms},
            {"after_median_ratio", s.after_median_ratio},
            {"reconverge_steps", s.reconverge_steps ? nlohmann::ordered_json(*s.reconverge_steps)
                                                    : nlohmann::ordered_json()}};
      }
      auto& ledger = o["ledger"] = nlohmann::ordered_json::array();
      bool ok = run.ledger_consistent;
      for (const auto& e : run.ledger) {
        ok = ok && e.ok();
        ledger.push_back({{"epoch", e.epoch},
                          {"samples", e.expected},
                          {"exactly_once", e.once},
                          {"missing", e.missing},
                          {"duplicated", e.duplicated},
                          {"beyond", e.outside}});
      }
      o["ledger_ok"] = ok;
      o["ledger_consistent"] = run.ledger_consistent;
    }
    summary.push_back(std::move(o));
  }
  return j;
}

}  // namespace railshard::bench
