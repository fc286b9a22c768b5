#pragma once

#include <cstddef>
#include <string>

namespace railshard::bench {

// "[ 7/23] 4 MiB in-place" on stderr, rewritten in place with \r, so a long sweep shows where
// it is. Inert when disabled; the caller enables it on rank 0 when stderr is a terminal
// (or --progress says so), so that logs and tests never see it.
class ProgressLine {
 public:
  ProgressLine(bool enabled, size_t total) : enabled_(enabled), total_(total) {}
  ~ProgressLine() { clear(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // index counts from 0.
  void show(size_t index, size_t bytes, const char* phase);
  // Erases the line, so that the table's next row starts at column 0.
  void clear();

 private:
  bool enabled_;
  size_t total_;
  bool shown_ = false;
};

// 4096 -> "4 KiB", 1536 -> "1.5 KiB", 8 -> "8 B".
std::string humanBytes(size_t bytes);

// The default of --progress/--no-progress: stderr is a terminal.
bool stderrIsTerminal();

}  // namespace railshard::bench
