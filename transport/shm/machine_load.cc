#include "transport/shm/machine_load.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>

namespace railshard::transport::shm {
unsigned runnableThreads() {
  // "0.52 0.58 0.59 3/412 12345": runnable/total scheduling entities.
  FILE* file = std::fopen("/proc/loadavg", "r");
  if (file == nullptr) return 0;
  double loads[3];
  unsigned runnable = 0;
  unsigned total = 0;
  const int read =
      std::fscanf(file, "%lf %lf %lf %u/%u", &loads[0], &loads[1], &loads[2], &runnable, &total);
  std::fclose(file);
  return read == 5 ? runnable : 0;
}

unsigned allowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace railshard::transport::shm
