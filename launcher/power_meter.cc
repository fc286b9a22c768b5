#include "launcher/power_meter.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace railshard::launcher {

namespace {

double readNumber(const std::string& path) {
  std::ifstream in(path);
  double value = -1;
  if (!(in >> value)) return -1;
  return value;
}

}  // namespace

PowerMeter::PowerMeter(Options options) : options_(std::move(options)) {
  if (options_.gpu != nullptr && options_.gpu->available()) {
    if (options_.gpu->energyJoules() >= 0) {
      kind_ = Kind::kNvmlEnergy;
      source_ = "NVML (GPU energy counter)";
      return;
    }
    if (options_.gpu->powerWatts() >= 0) {
      kind_ = Kind::kNvmlPower;
      source_ = "NVML (GPU power x interval)";
      return;
    }
  }
  // Package zones only (intel-rapl:N, not their sub-zones intel-rapl:N:M, which they contain).
  std::error_code ec;
  std::string names;
  for (const auto& entry : std::filesystem::directory_iterator(options_.powercap_root, ec)) {
    const std::string zone = entry.path().filename().string();
    if (zone.rfind("intel-rapl:", 0) != 0 || zone.find(':', 11) != std::string::npos) continue;
    Zone z;
    z.counter = entry.path().string() + "/energy_uj";
    z.range = readNumber(entry.path().string() + "/max_energy_range_uj");
    if (readNumber(z.counter) < 0) continue;  // unreadable (root only on recent kernels)
    zones_.push_back(z);
    std::ifstream name_file(entry.path().string() + "/name");
    std::string name;
    name_file >> name;
    names += (names.empty() ? "" : ",") + (name.empty() ? zone : name);
  }
  if (!zones_.empty()) {
    std::sort(zones_.begin(), zones_.end(),
              [](const Zone& a, const Zone& b) { return a.counter < b.counter; });
    kind_ = Kind::kRapl;
    source_ = "RAPL " + names + " (shared by CPU time)";
    return;
  }
  if (options_.emulated_watts > 0) {
    kind_ = Kind::kEmulated;
    std::ostringstream text;
    text << "RAILSHARD_POWER_WATTS=" << options_.emulated_watts << " W per busy core (emulated)";
    source_ = text.str();
  }
}

double PowerMeter::readCpuSeconds() const {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double PowerMeter::readBusySeconds() const {
  std::ifstream in(options_.proc + "/stat");
  std::string cpu;
  in >> cpu;
  if (cpu != "cpu") return -1;
  double total = 0;
  double idle = 0;
  double value = 0;
  for (int field = 0; field < 10 && in >> value; ++field) {
    total += value;
    if (field == 3 || field == 4) idle += value;  // idle, iowait
  }
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (total - idle) / (ticks > 0 ? ticks : 100);
}

PowerMeter::Reading PowerMeter::sample() {
  const auto now = std::chrono::steady_clock::now();
  const double interval = first_ ? 0 : std::chrono::duration<double>(now - last_time_).count();
  Reading reading;
  switch (kind_) {
    case Kind::kNone:
      break;
    case Kind::kNvmlEnergy: {
      const double counter = options_.gpu->energyJoules();
      if (!first_ && counter >= last_counter_ && last_counter_ >= 0) {
        reading.joules = counter - last_counter_;
      }
      last_counter_ = counter;
      break;
    }
    case Kind::kNvmlPower: {
      const double watts = options_.gpu->powerWatts();
      if (watts > 0) reading.joules = watts * interval;
      break;
    }
    case Kind::kRapl: {
      double package = 0;
      bool complete = !first_;
      for (Zone& zone : zones_) {
        const double counter = readNumber(zone.counter);
        if (counter < 0 || zone.last < 0) {
          complete = false;
        } else {
          // A counter that went down wrapped at its range.
          package +=
              (counter >= zone.last ? counter - zone.last : counter + zone.range - zone.last);
        }
        zone.last = counter;
      }
      const double cpu = readCpuSeconds();
      const double busy = readBusySeconds();
      if (complete && last_counter_ >= 0 && last_busy_ >= 0 && busy > last_busy_) {
        const double share = std::clamp((cpu - last_counter_) / (busy - last_busy_), 0.0, 1.0);
        reading.joules = package / 1e6 * share;
      }
      last_counter_ = cpu;
      last_busy_ = busy;
      break;
    }
    case Kind::kEmulated: {
      const double cpu = readCpuSeconds();
      if (!first_ && last_counter_ >= 0 && cpu >= last_counter_) {
        reading.joules = options_.emulated_watts * (cpu - last_counter_);
      }
      last_counter_ = cpu;
      break;
    }
  }
  if (interval > 0) reading.watts = reading.joules / interval;
  last_time_ = now;
  first_ = false;
  return reading;
}

}  // namespace railshard::launcher
