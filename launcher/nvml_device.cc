#include "launcher/nvml_device.h"

#include <dlfcn.h>

namespace railshard::launcher {

namespace {

// NVML's ABI for the calls used here, declared locally: the structs and signatures are fixed
// by NVML's stable C API (nvml.h is not in every CUDA toolkit install). Run on an H200 by
// scripts/gpu_check.sh; CI has no GPU.
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
using UintFn = int (*)(void*, unsigned int*);
using UllFn = int (*)(void*, unsigned long long*);

}  // namespace

NvmlDevice::NvmlDevice(int gpu_index) {
  if (gpu_index < 0) {
    why_ = "no GPU for this rank";
    return;
  }
  library_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* error = ::dlerror();
    why_ = std::string("NVML is not available (") + (error ? error : "libnvidia-ml.so.1") + ")";
    return;
  }
  auto init = reinterpret_cast<InitFn>(symbol("nvmlInit_v2"));
  auto handle = reinterpret_cast<HandleFn>(symbol("nvmlDeviceGetHandleByIndex_v2"));
  void* device = nullptr;
  if (init == nullptr || handle == nullptr || init() != 0) {
    why_ = "NVML did not initialise (no NVIDIA driver?)";
    return;
  }
  if (handle(static_cast<unsigned int>(gpu_index), &device) != 0) {
    why_ = "NVML has no GPU " + std::to_string(gpu_index);
    if (auto shutdown = reinterpret_cast<ShutdownFn>(symbol("nvmlShutdown"))) shutdown();
    return;
  }
  device_ = device;
}

NvmlDevice::~NvmlDevice() {
  if (library_ == nullptr) return;
  if (device_ != nullptr) {
    if (auto shutdown = reinterpret_cast<ShutdownFn>(symbol("nvmlShutdown"))) shutdown();
  }
  ::dlclose(library_);
}

void* NvmlDevice::symbol(const char* name) const {
  return library_ != nullptr ? ::dlsym(library_, name) : nullptr;
}

double NvmlDevice::utilization() const {
  auto fn = reinterpret_cast<UtilizationFn>(symbol("nvmlDeviceGetUtilizationRates"));
  NvmlUtilization u{};
  if (device_ == nullptr || fn == nullptr || fn(device_, &u) != 0) return -1;
  return u.gpu / 100.0;
}

double NvmlDevice::memoryUsedBytes() const {
  auto fn = reinterpret_cast<MemoryFn>(symbol("nvmlDeviceGetMemoryInfo"));
  NvmlMemory m{};
  if (device_ == nullptr || fn == nullptr || fn(device_, &m) != 0) return -1;
  return static_cast<double>(m.used);
}

double NvmlDevice::memoryTotalBytes() const {
  auto fn = reinterpret_cast<MemoryFn>(symbol("nvmlDeviceGetMemoryInfo"));
  NvmlMemory m{};
  if (device_ == nullptr || fn == nullptr || fn(device_, &m) != 0) return -1;
  return static_cast<double>(m.total);
}

double NvmlDevice::powerWatts() const {
  auto fn = reinterpret_cast<UintFn>(symbol("nvmlDeviceGetPowerUsage"));
  unsigned int milliwatts = 0;
  if (device_ == nullptr || fn == nullptr || fn(device_, &milliwatts) != 0) return -1;
  return milliwatts / 1000.0;
}

double NvmlDevice::energyJoules() const {
  auto fn = reinterpret_cast<UllFn>(symbol("nvmlDeviceGetTotalEnergyConsumption"));
  unsigned long long millijoules = 0;
  if (device_ == nullptr || fn == nullptr || fn(device_, &millijoules) != 0) return -1;
  return static_cast<double>(millijoules) / 1000.0;
}

}  // namespace railshard::launcher
