#include "launcher/line_prefixer.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

namespace railshard::launcher {

LinePrefixer::LinePrefixer(std::string prefix, size_t max_line)
    : prefix_(std::move(prefix)), max_line_(std::max<size_t>(max_line, 1)) {}

void LinePrefixer::remember(std::string_view line) {
  if (!keep_last_line_) return;
  // "\r\n" endings and trailing blanks are noise in a quoted line; blank lines are not news.
  const size_t end = line.find_last_not_of(" \t\r\n\v\f");
  if (end == std::string_view::npos) return;
  last_line_.assign(line.substr(0, end + 1));
  if (looksLikeError(last_line_)) last_error_line_ = last_line_;
}

bool LinePrefixer::looksLikeError(std::string_view line) {
  std::string lower(line);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&](std::string_view word) { return lower.find(word) != std::string::npos; };
  if (has("warning") || has("warn(")) return false;
  for (const std::string_view word :
       {"error", "exception", "terminate called", "fatal", "abort", "fail", "unknown", "invalid",
        "cannot", "what():", "denied", "refused"}) {
    if (has(word)) return true;
  }
  return false;
}

void LinePrefixer::emitLine(std::string_view line, std::string& out) {
  remember(line);
  out.append(prefix_);
  out.append(line);
  out.push_back('\n');
}

void LinePrefixer::feed(std::string_view data, std::string& out) {
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    if (newline == std::string_view::npos) {
      pending_.append(data);
      // Over-long line: cut it in max_line_-sized pieces, keeping the remainder pending.
      size_t cut = 0;
      while (pending_.size() - cut > max_line_) {
        emitLine(std::string_view(pending_).substr(cut, max_line_), out);
        cut += max_line_;
      }
      pending_.erase(0, cut);
      return;
    }
    const std::string_view head = data.substr(0, newline);
    if (pending_.empty()) {
      emitLine(head, out);  // common case: no copy through pending_
    } else {
      pending_.append(head);
      emitLine(pending_, out);
      pending_.clear();
    }
    data.remove_prefix(newline + 1);
  }
}

void LinePrefixer::finish(std::string& out) {
  if (pending_.empty()) return;
  if (prefix_.empty()) {
    remember(pending_);
    out.append(pending_);
  } else {
    emitLine(pending_, out);
  }
  pending_.clear();
}

}  // namespace railshard::launcher
