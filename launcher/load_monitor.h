#pragma once

#include "core/dispatch/collective_dispatcher.h"

namespace railshard::launcher {

// Reads this process's load signals for the dispatcher: resident memory (/proc/self/statm)
// and, when NVML can be opened (libnvidia-ml.so.1, at run time), the utilisation and memory
// in use of GPU `gpu_index`. Whatever cannot be read stays 0. queued_samples is the caller's.
class LoadMonitor {
 public:
  explicit LoadMonitor(int gpu_index = -1);
  ~LoadMonitor();
  LoadMonitor(const LoadMonitor&) = delete;
  LoadMonitor& operator=(const LoadMonitor&) = delete;

  dispatch::LoadSignals sample() const;
  bool hasGpu() const { return device_ != nullptr; }

 private:
  void* library_ = nullptr;  // dlopen handle of NVML
  void* device_ = nullptr;   // nvmlDevice_t
  void* utilization_ = nullptr;
  void* memory_ = nullptr;
};

}  // namespace railshard::launcher
