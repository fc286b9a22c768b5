#pragma once

#include <pybind11/pybind11.h>

namespace railshard::python {

// railshard._C.Dispatcher (core/dispatch/dispatcher.h, for the ThroughputSampler) and
// railshard._C.LoadMonitor (launcher/load_monitor.h, the signals each rank reports).
void bindDispatcher(pybind11::module_& m);

}  // namespace railshard::python
