#include "core/dispatch/load_signals.h"

#include <cmath>
#include <sstream>

#include "base/error.h"

namespace railshard::dispatch {

void validate(const LoadSignals& s, const std::string& who) {
  const struct {
    const char* name;
    double value;
    double most;
  } fields[] = {
      {"queued_samples", s.queued_samples, INFINITY},
      {"memory_bytes", s.memory_bytes, INFINITY},
      {"memory_limit_bytes", s.memory_limit_bytes, INFINITY},
      {"gpu_utilization", s.gpu_utilization, 1},
      {"gpu_memory_bytes", s.gpu_memory_bytes, INFINITY},
      {"gpu_memory_total_bytes", s.gpu_memory_total_bytes, INFINITY},
      {"cpu_quota_cores", s.cpu_quota_cores, INFINITY},
      {"cpu_throttled", s.cpu_throttled, 1},
      {"power_watts", s.power_watts, INFINITY},
      {"cap_samples", s.cap_samples, INFINITY},
  };
  for (const auto& field : fields) {
    if (std::isfinite(field.value) && field.value >= 0 && field.value <= field.most) continue;
    std::ostringstream message;
    message << who << " reported " << field.name << " = " << field.value << " (must be "
            << (field.most == 1 ? "between 0 and 1" : "a finite number >= 0") << ")";
    throw InvalidArgument(message.str());
  }
}

}  // namespace railshard::dispatch
