#include "benchmarks/perf_progress.h"

#include <unistd.h>

#include <cstdio>

namespace railshard::bench {

std::string humanBytes(size_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g %s", value, kUnits[unit]);
  return text;
}

bool stderrIsTerminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

void ProgressLine::show(size_t index, size_t bytes, const char* phase) {
  if (!enabled_) return;
  const int width = static_cast<int>(std::to_string(total_).size());
  // \033[K erases what a longer previous line left behind.
  std::fprintf(stderr, "\r[%*zu/%zu] %s %s ...\033[K", width, index + 1, total_,
               humanBytes(bytes).c_str(), phase);
  std::fflush(stderr);
  shown_ = true;
}

void ProgressLine::clear() {
  if (!shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace railshard::bench
