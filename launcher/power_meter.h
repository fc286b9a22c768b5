#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "launcher/nvml_device.h"

namespace railshard::launcher {

// The energy one rank draws, from the best source the machine has:
//  1. its GPU (NVML): the energy counter, else the board's power times the interval;
//  2. the CPU packages' RAPL counters (/sys/class/powercap/intel-rapl:N/energy_uj), shared
//     out by CPU time: this process gets (its CPU time) / (every CPU's busy time, /proc/stat)
//     of the packages' energy -- the rule a host with several ranks needs;
//  3. a declared draw per busy core (RAILSHARD_POWER_WATTS): an emulated source for machines
//     that report none, energy = watts x this process's CPU time -- said so wherever shown;
//  4. none: energy 0 (unknown), never invented.
class PowerMeter {
 public:
  struct Options {
    const NvmlDevice* gpu = nullptr;  // this rank's GPU, when it has one
    std::string powercap_root = "/sys/class/powercap";
    std::string proc = "/proc";
    double emulated_watts = 0;  // RAILSHARD_POWER_WATTS; 0 = off
  };
  explicit PowerMeter(Options options);

  struct Reading {
    double joules = 0;  // drawn since the previous sample() (0 the first time, or no source)
    double watts = 0;   // joules / the interval
  };
  Reading sample();
  // "NVML (GPU energy counter)", "RAPL package-0 (shared by CPU time)",
  // "RAILSHARD_POWER_WATTS=20 W per busy core (emulated)" or "none".
  const std::string& source() const { return source_; }
  bool available() const { return kind_ != Kind::kNone; }

 private:
  enum class Kind { kNone, kNvmlEnergy, kNvmlPower, kRapl, kEmulated };
  struct Zone {
    std::string counter;  // .../energy_uj
    double range = 0;     // max_energy_range_uj: the counter wraps there
    double last = -1;
  };
  double readCpuSeconds() const;   // this process, user + system
  double readBusySeconds() const;  // every CPU, from /proc/stat

  Options options_;
  Kind kind_ = Kind::kNone;
  std::string source_ = "none";
  std::vector<Zone> zones_;
  std::chrono::steady_clock::time_point last_time_{};
  double last_counter_ = -1;  // NVML energy, or this process's CPU seconds
  double last_busy_ = -1;
  bool first_ = true;
};

}  // namespace railshard::launcher
