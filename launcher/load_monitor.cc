#include "launcher/load_monitor.h"

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>

#include "base/logging.h"

namespace railshard::launcher {

namespace {

// NVML's ABI for the three calls used here, declared locally: the structs are fixed by NVML's
// stable C API (nvml.h is not part of every CUDA toolkit install, and loading at run time
// keeps the library usable where no driver exists). Untested here: no GPU on the build host.
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
using InitFn = int (*)();
using ShutdownFn = int (*)();
using HandleFn = int (*)(unsigned int, void**);
using UtilizationFn = int (*)(void*, NvmlUtilization*);
using MemoryFn = int (*)(void*, NvmlMemory*);

}  // namespace

LoadMonitor::LoadMonitor(int gpu_index) {
  if (gpu_index < 0) return;
  library_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    RS_LOG_DEBUG("load monitor: NVML not available ({}); no GPU signals", ::dlerror());
    return;
  }
  auto init = reinterpret_cast<InitFn>(::dlsym(library_, "nvmlInit_v2"));
  auto handle = reinterpret_cast<HandleFn>(::dlsym(library_, "nvmlDeviceGetHandleByIndex_v2"));
  utilization_ = ::dlsym(library_, "nvmlDeviceGetUtilizationRates");
  memory_ = ::dlsym(library_, "nvmlDeviceGetMemoryInfo");
  void* device = nullptr;
  if (init == nullptr || handle == nullptr || init() != 0 ||
      handle(static_cast<unsigned int>(gpu_index), &device) != 0) {
    RS_LOG_DEBUG("load monitor: NVML has no GPU {}", gpu_index);
    return;
  }
  device_ = device;
}

LoadMonitor::~LoadMonitor() {
  if (library_ == nullptr) return;
  if (device_ != nullptr) {
    if (auto shutdown = reinterpret_cast<ShutdownFn>(::dlsym(library_, "nvmlShutdown"))) {
      shutdown();
    }
  }
  ::dlclose(library_);
}

dispatch::LoadSignals LoadMonitor::sample() const {
  dispatch::LoadSignals signals;
  std::ifstream statm("/proc/self/statm");
  long long pages_total = 0;
  long long pages_resident = 0;
  if (statm >> pages_total >> pages_resident) {
    signals.memory_bytes =
        static_cast<double>(pages_resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  }
  if (device_ != nullptr) {
    NvmlUtilization utilization{};
    if (utilization_ != nullptr &&
        reinterpret_cast<UtilizationFn>(utilization_)(device_, &utilization) == 0) {
      signals.gpu_utilization = utilization.gpu / 100.0;
    }
    NvmlMemory memory{};
    if (memory_ != nullptr && reinterpret_cast<MemoryFn>(memory_)(device_, &memory) == 0) {
      signals.gpu_memory_bytes = static_cast<double>(memory.used);
    }
  }
  return signals;
}

}  // namespace railshard::launcher
