#pragma once

// Internals of runLocalJob() shared by its implementation files: local_job.cc (starting the
// ranks, forwarding their output, the poll loop) and local_job_supervisor.cc (what a rank's
// ending or a signal does to the job). Not part of the interface.
#include <signal.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "launcher/local_job.h"
#include "launcher/process_group.h"
#include "launcher/tcp_store.h"

namespace railshard::launcher {

// "1.5 s": a duration as the launcher's notices write it.
std::string seconds(std::chrono::milliseconds duration);

// The supervision state machine; see runLocalJob().
class Supervisor {
 public:
  Supervisor(const LocalJobOptions& options, ProcessGroup& ranks, std::string host_name)
      : options_(options), ranks_(ranks), host_name_(std::move(host_name)) {}

  // In elastic mode, where failures are marked: the launcher's own store.
  void setStore(std::string addr, std::string token);
  // `last_error_line`: the last line the rank wrote to stderr that reads as an error;
  // `last_line`: its last non-blank line there (quoted when no line reads as an error).
  void onRankEnded(size_t rank, const std::string& last_error_line, const std::string& last_line);
  void onSignal(int sig);
  // Something outside the ranks makes the job impossible (a node presenting another token):
  // says `why`, stops every rank and makes the launcher exit with status 1. Once.
  void onJobError(const std::string& why);
  // Called once per loop turn: SIGKILL for those still running once the grace period is over.
  void onTick();
  // How long poll() may sleep: until the grace period ends, and never long, so that a lost
  // wake-up can at worst delay reaping by a second.
  int pollTimeoutMs() const;
  // Processes to start again (by index), taken by the caller; and which slot each index is.
  std::vector<size_t> takeRestarts() { return std::exchange(restart_, {}); }
  void setSlot(size_t index, size_t slot);
  int exitStatus() const;

 private:
  static const char* sigabbrev(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }
  // "rank 2", or "rank 2 (restart)" for a process started again in slot 2.
  std::string label(size_t index) const;
  void notice(const std::string& line);
  void stop(int sig);
  void kill();
  // The survivors' shrink() reads these to agree sooner on who is gone. A failure here costs
  // them only that shortcut (they still find out by timeout), so it is a notice, not an end.
  void markLost(size_t rank, const std::string& how);

  const LocalJobOptions& options_;
  ProcessGroup& ranks_;
  const std::string host_name_;
  std::string store_addr_;
  std::string store_token_;
  std::unique_ptr<TcpStore> store_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_{};
  int exit_status_ = 0;
  int first_failure_status_ = 0;
  int failures_ = 0;
  int restarts_ = 0;
  std::vector<size_t> restart_;
  std::vector<size_t> slots_;  // process index -> rank slot
  size_t successes_ = 0;
};

}  // namespace railshard::launcher
