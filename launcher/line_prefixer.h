#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace railshard::launcher {

// Cuts one output stream of one rank into whole lines and puts a prefix ("[3] ") before each.
// The launcher writes only whole lines, so lines of different ranks never interleave mid-line
// even though every rank writes whenever it likes.
class LinePrefixer {
 public:
  // A line that grows past `max_line` bytes without a newline is emitted anyway (as if it
  // ended there) so that one rank printing without newlines cannot grow memory without bound.
  // An empty `prefix` still buffers whole lines but adds nothing to them.
  explicit LinePrefixer(std::string prefix, size_t max_line = size_t{64} << 10);

  // Consumes `data` and appends every line it completes, prefixed and ending in '\n', to `out`.
  void feed(std::string_view data, std::string& out);

  // End of the stream: appends the unterminated last line, if any. With a prefix it gets a
  // '\n' so that the next line from another rank starts on a line of its own; without one the
  // bytes go out unchanged.
  void finish(std::string& out);

  bool hasPending() const { return !pending_.empty(); }

  // Remember the last line that is not blank, and the last one that reads as an error, so
  // that the launcher can quote a failed rank's error without keeping its whole output. Off by
  // default: it costs a copy of every line, wasted on streams nobody quotes.
  void keepLastLine(bool keep = true) { keep_last_line_ = keep; }
  // That line without prefix, newline or trailing whitespace; empty when there was none.
  // Counts only lines emitted so far (a pending partial line is not one yet).
  const std::string& lastLine() const { return last_line_; }
  // The last line that names an error (looksLikeError), same form; empty when none did. A
  // usage message's closing hint or a warning printed after the error is not the error.
  const std::string& lastErrorLine() const { return last_error_line_; }

  // Whether a line reads as an error report: it names an error, exception, failure, abort or
  // an unknown/invalid thing (any case), and is not a warning.
  static bool looksLikeError(std::string_view line);

 private:
  void emitLine(std::string_view line, std::string& out);
  void remember(std::string_view line);

  std::string prefix_;
  size_t max_line_;
  std::string pending_;  // the current line's bytes so far (no newline yet)
  bool keep_last_line_ = false;
  std::string last_line_;
  std::string last_error_line_;
};

}  // namespace railshard::launcher
