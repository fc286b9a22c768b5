// The supervision of a local job's ranks (local_job_internal.h): what a rank's ending or a
// signal to the launcher does to the job, and the notices that say so.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launcher/local_job.h"
#include "launcher/local_job_internal.h"
#include "launcher/process_group.h"
#include "launcher/tcp_store.h"

namespace railshard::launcher {

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream text;
  text << std::chrono::duration<double>(duration).count() << " s";
  return text.str();
}

namespace {

std::string plural(size_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// A rank's line quoted in a notice: one screen line at most, cut at a character boundary.
std::string quoteLine(const std::string& line) {
  constexpr size_t kMaxQuoted = 300;
  size_t cut = line.size();
  if (cut > kMaxQuoted) {
    cut = kMaxQuoted;
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
  }
  // Built by append: GCC 12 warns (-Wrestrict, falsely) about "\"" + std::string here.
  std::string quoted;
  quoted.reserve(cut + 5);
  quoted.push_back('"');
  quoted.append(line, 0, cut);
  if (cut < line.size()) quoted.append("...");
  quoted.push_back('"');
  return quoted;
}

}  // namespace

void Supervisor::setStore(std::string addr, std::string token) {
  store_addr_ = std::move(addr);
  store_token_ = std::move(token);
}

void Supervisor::onRankEnded(size_t rank, const std::string& last_error_line,
                             const std::string& last_line) {
  const ExitStatus& status = *ranks_.status(rank);
  if (status.success()) {
    ++successes_;
    return;
  }
  // Ranks failing while being stopped are the echo of what stopped them, not news.
  if (stopping_) return;
  ++failures_;
  if (failures_ == 1) first_failure_status_ = status.shellStatus();
  const std::string how = describeEnding(status.code, status.signal);
  std::string said;
  if (!last_error_line.empty()) {
    said = "its last error line: " + quoteLine(last_error_line);
  } else if (!last_line.empty()) {
    // A rank killed by a signal usually said nothing about it: its last words (a warning,
    // a progress line) are not the cause, and are quoted as what they are.
    said = "it wrote no error line; its last line on stderr: " + quoteLine(last_line);
  } else {
    said = "it wrote nothing to stderr";
  }
  notice(label(rank) + " on host " + host_name_ + " failed" + (failures_ == 1 ? " first" : "") +
         ": " + how + "; " + said);
  // Only a first process's slot is its launch rank; a restarted one got its launch rank
  // from the members (its loss reaches them through its connections anyway).
  if (options_.elastic && rank < static_cast<size_t>(options_.world_size)) markLost(rank, how);

  const size_t others = ranks_.runningCount();
  const bool unbounded = options_.max_failures == std::numeric_limits<int>::max();
  const std::string count =
      "failure " + std::to_string(failures_) +
      (unbounded ? "" : " of " + std::to_string(options_.max_failures)) +
      (options_.min_ranks > 0 ? ", --min-ranks " + std::to_string(options_.min_ranks) : "");
  const bool restart = restarts_ < options_.max_restarts && others > 0;
  const size_t left = others + (restart ? 1 : 0);
  const bool enough = left >= static_cast<size_t>(std::max(options_.min_ranks, 0));
  if (options_.elastic && failures_ <= options_.max_failures && enough) {
    if (restart) {
      ++restarts_;
      restart_.push_back(rank);
      notice("restarting " + label(rank) + " to join the " + plural(others, "rank") +
             " left (elastic, " + count + ", restart " + std::to_string(restarts_) + " of " +
             std::to_string(options_.max_restarts) + ")");
      return;
    }
    notice(others > 0 ? "continuing with " + plural(others, "rank") + " (elastic, " + count + ")"
                      : "no rank left to continue with (elastic, " + count + ")");
    return;
  }
  exit_status_ = first_failure_status_;
  if (others > 0) {
    std::string line = others == 1 ? "stopping the other rank"
                                   : "stopping the other " + std::to_string(others) + " ranks";
    if (options_.elastic && !enough) {
      line += " (elastic: " + plural(left, "rank") + " left, fewer than --min-ranks " +
              std::to_string(options_.min_ranks) + ")";
    } else if (options_.elastic) {
      line += " (elastic: failure " + std::to_string(failures_) + " is more than --max-failures " +
              std::to_string(options_.max_failures) + ")";
    }
    notice(line);
  }
  stop(SIGTERM);
}

void Supervisor::onSignal(int sig) {
  if (sig != SIGINT && sig != SIGTERM) return;
  if (!stopping_) {
    exit_status_ = 128 + sig;
    notice(std::string("received ") + sigabbrev(sig) + "; forwarding it to " +
           plural(ranks_.runningCount(), "rank"));
    stop(sig);
  } else if (!killed_) {
    notice(std::string("received ") + sigabbrev(sig) + " again; killing " +
           plural(ranks_.runningCount(), "rank"));
    kill();
  }
}

void Supervisor::onJobError(const std::string& why) {
  if (stopping_) return;
  exit_status_ = 1;
  notice(why + "; stopping " + plural(ranks_.runningCount(), "rank"));
  stop(SIGTERM);
}

void Supervisor::onTick() {
  if (stopping_ && !killed_ && Clock::now() >= kill_at_ && ranks_.runningCount() > 0) {
    notice(plural(ranks_.runningCount(), "rank") + " still running " + seconds(options_.grace) +
           " after being asked to stop; killing " + (ranks_.runningCount() == 1 ? "it" : "them"));
    kill();
  }
}

int Supervisor::pollTimeoutMs() const {
  constexpr int kMaxSleepMs = 1000;
  if (!stopping_ || killed_) return kMaxSleepMs;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(kill_at_ - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, kMaxSleepMs));
}

void Supervisor::setSlot(size_t index, size_t slot) {
  if (slots_.size() <= index) slots_.resize(index + 1);
  slots_[index] = slot;
}

int Supervisor::exitStatus() const {
  if (stopping_) return exit_status_;
  // Elastic and within the allowance: fine, as long as some rank got to the end.
  if (failures_ > 0 && successes_ == 0) return first_failure_status_;
  return exit_status_;
}

std::string Supervisor::label(size_t index) const {
  const size_t slot = index < slots_.size() ? slots_[index] : index;
  // Several hosts: the job's rank, not this launcher's slot.
  const size_t first = static_cast<size_t>(options_.node_rank * options_.world_size);
  return "rank " + std::to_string(first + slot) + (slot == index ? "" : " (restarted)");
}

void Supervisor::notice(const std::string& line) {
  if (options_.notice) options_.notice(line);
}

void Supervisor::stop(int sig) {
  stopping_ = true;
  kill_at_ = Clock::now() + options_.grace;
  ranks_.signalRunning(sig);
}

void Supervisor::kill() {
  killed_ = true;
  ranks_.signalRunning(SIGKILL);
}

void Supervisor::markLost(size_t rank, const std::string& how) {
  constexpr auto kTimeout = std::chrono::seconds(5);
  const std::string key = kLostRankKeyPrefix + std::to_string(rank);
  try {
    // Connected on first use: most elastic jobs never lose a rank.
    if (!store_) store_ = std::make_unique<TcpStore>(store_addr_, store_token_, kTimeout);
    store_->set(key, Store::Bytes(how.begin(), how.end()), kTimeout);
  } catch (const std::exception& error) {
    notice("cannot mark rank " + std::to_string(rank) + " as lost in the store (" + key +
           "): " + error.what());
  }
}

std::string describeEnding(int exit_code, int signal) {
  if (signal == 0) return "exited with status " + std::to_string(exit_code);
  // "SIGKILL" is what people type and grep for; strsignal's "Killed" is not.
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev != nullptr ? std::string("killed by SIG") + abbrev
                           : "killed by signal " + std::to_string(signal);
}

}  // namespace railshard::launcher
