#include "python/csrc/dispatch_bindings.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "core/dispatch/dispatch_metrics.h"
#include "core/dispatch/dispatcher.h"
#include "core/dispatch/policy.h"
#include "launcher/load_monitor.h"

namespace py = pybind11;

namespace railshard::python {

namespace {

using dispatch::Dispatcher;
using dispatch::LoadSignals;
using RangeLists = std::vector<std::vector<std::pair<uint64_t, uint64_t>>>;

RangeLists rangesOf(const dispatch::StepPlan& plan) {
  RangeLists out(plan.ranges.size());
  for (size_t r = 0; r < plan.ranges.size(); ++r) {
    for (const auto& range : plan.ranges[r]) out[r].emplace_back(range.begin, range.end);
  }
  return out;
}

// The fields of LoadSignals by name, in one order: Python sees a dict, the sampler gathers a
// list in this order (LOAD_SIGNALS).
const std::vector<std::pair<const char*, double LoadSignals::*>>& fields() {
  static const std::vector<std::pair<const char*, double LoadSignals::*>> all = {
      {"queued_samples", &LoadSignals::queued_samples},
      {"memory_bytes", &LoadSignals::memory_bytes},
      {"memory_limit_bytes", &LoadSignals::memory_limit_bytes},
      {"gpu_utilization", &LoadSignals::gpu_utilization},
      {"gpu_memory_bytes", &LoadSignals::gpu_memory_bytes},
      {"gpu_memory_total_bytes", &LoadSignals::gpu_memory_total_bytes},
      {"cpu_quota_cores", &LoadSignals::cpu_quota_cores},
      {"cpu_throttled", &LoadSignals::cpu_throttled},
      {"power_watts", &LoadSignals::power_watts},
      {"cap_samples", &LoadSignals::cap_samples},
  };
  return all;
}

py::dict toDict(const LoadSignals& s) {
  py::dict d;
  for (const auto& [name, member] : fields()) d[name] = s.*member;
  return d;
}

LoadSignals fromDict(const py::dict& d) {
  LoadSignals s;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    bool known = false;
    for (const auto& [name, member] : fields()) {
      if (key == name) {
        s.*member = item.second.cast<double>();
        known = true;
      }
    }
    if (!known) throw py::key_error("unknown load signal '" + key + "'");
  }
  return s;
}

}  // namespace

void bindDispatcher(py::module_& m) {
  std::vector<std::string> names;
  for (const auto& [name, member] : fields()) names.emplace_back(name);
  m.attr("LOAD_SIGNALS") = names;

  py::class_<Dispatcher>(m, "Dispatcher",
                         "railshard's batch dispatcher (core/dispatch/dispatcher.h): shares each "
                         "global batch among ranks. Pure logic: every rank keeps its own copy, "
                         "feeds it the same reports and gets the same plans.")
      .def(py::init([](int world_size, uint64_t epoch_size, const std::string& policy,
                       size_t micro_batch, size_t min_micro_batches, double energy_budget) {
             dispatch::DispatchOptions options;
             options.policy = dispatch::parsePolicy(policy);
             options.micro_batch = micro_batch;
             options.min_micro_batches = min_micro_batches;
             options.energy_budget = energy_budget;
             return std::make_unique<Dispatcher>(world_size, epoch_size, options);
           }),
           py::arg("world_size"), py::arg("epoch_size"), py::arg("policy") = "proportional",
           py::arg("micro_batch") = 1, py::arg("min_micro_batches") = 0,
           py::arg("energy_budget") = 1.05)
      .def(
          "plan", [](Dispatcher& d, size_t global_batch) { return rangesOf(d.plan(global_batch)); },
          py::arg("global_batch"),
          "Plans the next step; per rank, the [begin, end) ranges of epoch positions it processes.")
      .def("samples", [](const Dispatcher& d) { return d.current().samples; })
      .def("complete_step", &Dispatcher::completeStep)
      .def("report", &Dispatcher::report, py::arg("rank"), py::arg("samples"), py::arg("seconds"),
           py::arg("energy_joules") = 0.0)
      .def(
          "set_load",
          [](Dispatcher& d, int rank, const py::dict& signals) {
            d.setLoad(rank, fromDict(signals));
          },
          py::arg("rank"), py::arg("signals"),
          "What a rank reports about its load (a dict of LOAD_SIGNALS names; missing ones 0).")
      .def(
          "load", [](const Dispatcher& d, int rank) { return toDict(d.load(rank)); },
          py::arg("rank"))
      .def("joules_per_sample", &Dispatcher::joulesPerSample, py::arg("rank"))
      .def(
          "requeue",
          [](Dispatcher& d, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
            std::vector<dispatch::Range> back;
            for (const auto& [begin, end] : ranges) back.push_back({begin, end});
            d.requeue(back);
          },
          py::arg("ranges"),
          "A completed step's ranges (every rank's) go back into the epoch, planned first.")
      .def(
          "mark_failed", [](Dispatcher& d, int rank) { return rangesOf(d.markFailed(rank)); },
          py::arg("rank"))
      .def("new_epoch", &Dispatcher::newEpoch)
      .def("epoch_done", &Dispatcher::epochDone)
      .def("assigned_all",
           [](const Dispatcher& d) { return d.assigned() == d.epochSize() && !d.hasReturned(); })
      .def("has_returned", &Dispatcher::hasReturned)
      .def("step_open", &Dispatcher::stepOpen)
      .def("completed_steps", &Dispatcher::completedSteps)
      .def("epoch_size", &Dispatcher::epochSize)
      .def("world_size", &Dispatcher::worldSize)
      .def("alive", &Dispatcher::alive, py::arg("rank"))
      .def(
          "rates", [](const Dispatcher& d) { return d.estimator().rates(); },
          "Estimated samples per second per rank.")
      .def(
          "export_metrics",
          [](const Dispatcher& d, int my_rank, int launch_rank) {
            dispatch::exportMetrics(d, my_rank, launch_rank);
          },
          py::arg("my_rank"), py::arg("launch_rank"),
          "Sets the dispatch and load gauges (RAILSHARD_METRICS / RAILSHARD_METRICS_PORT).")
      .def("fingerprint", [](const Dispatcher& d) { return d.stateFingerprint(); });

  using launcher::LoadMonitor;
  py::class_<LoadMonitor>(m, "LoadMonitor",
                          "This process's load signals (launcher/load_monitor.h), read once a "
                          "step: memory and its limit, CPU quota and throttling, GPU "
                          "utilisation and memory, power and energy.")
      .def(py::init([](int gpu_index) {
             return std::make_unique<LoadMonitor>(
                 LoadMonitor::fromConfig(Config::fromEnvironment(), gpu_index));
           }),
           py::arg("gpu_index") = -1)
      .def(
          "sample",
          [](LoadMonitor& monitor) {
            const auto sample = monitor.sample();
            return py::make_tuple(toDict(sample.signals), sample.energy_joules);
          },
          "(signals dict, joules drawn since the last sample)")
      .def_property_readonly("power_source", &LoadMonitor::powerSource)
      .def_property_readonly("has_gpu", &LoadMonitor::hasGpu);
}

}  // namespace railshard::python
