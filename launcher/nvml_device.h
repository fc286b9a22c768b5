#pragma once

#include <string>

namespace railshard::launcher {

// One GPU as NVML reports it, for the load signals: utilisation, memory, power and energy.
// NVML is opened at run time (libnvidia-ml.so.1), so the library loads where no driver is; on
// such a machine available() is false and why() says so.
class NvmlDevice {
 public:
  explicit NvmlDevice(int gpu_index);
  ~NvmlDevice();
  NvmlDevice(const NvmlDevice&) = delete;
  NvmlDevice& operator=(const NvmlDevice&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& why() const { return why_; }

  // Each is -1 when NVML cannot tell (an older GPU, a call that failed).
  double utilization() const;  // 0..1 over NVML's last sample period
  double memoryUsedBytes() const;
  double memoryTotalBytes() const;
  double powerWatts() const;    // the board's draw now
  double energyJoules() const;  // drawn since the driver loaded (Volta and later)

 private:
  void* symbol(const char* name) const;

  void* library_ = nullptr;
  void* device_ = nullptr;
  std::string why_;
};

}  // namespace railshard::launcher
