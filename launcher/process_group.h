#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "transport/links/tcp/socket.h"

namespace railshard::launcher {

// What to start: the program (looked up in PATH), its complete environment and descriptors.
struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the program
  std::vector<std::string> env;   // the child's whole environment, "NAME=value" entries
  int stdin_fd = -1;              // becomes the child's stdin; -1 means /dev/null
  // A descriptor (> 2) the child keeps at the same number across exec; every other descriptor
  // of the caller is expected to be close-on-exec already.
  int inherited_fd = -1;
  // Control groups' cgroup.procs files: the child enters each group before it execs, so the
  // program runs under the groups' limits from its first instruction (--emulate-speeds,
  // --emulate-memory).
  std::vector<std::string> cgroup_procs;
};

// How a child ended.
struct ExitStatus {
  int code = 0;    // exit code, meaningful when signal == 0
  int signal = 0;  // the signal that killed it, or 0

  static ExitStatus fromWaitStatus(int wait_status);
  bool success() const { return signal == 0 && code == 0; }
  // The status a shell would report: the code, or 128 + signal.
  int shellStatus() const { return signal != 0 ? 128 + signal : code; }
  // "exited with status 3" or "was killed by signal 9 (Killed)".
  std::string describe() const;
};

// The program could not be executed at all; errorNumber() is exec's errno (ENOENT: not found).
class SpawnError : public Error {
 public:
  SpawnError(const std::string& message, int error_number)
      : Error(message), error_number_(error_number) {}
  int errorNumber() const { return error_number_; }

 private:
  int error_number_;
};

// Starts, reaps and signals a set of child processes (the ranks of a local job).
//
// Each child runs in a process group of its own, so a Ctrl-C on the terminal reaches only the
// launcher (which decides what to forward) and a signal sent to a child's group also reaches
// whatever the child started. Each child asks the kernel for SIGKILL when the launcher dies
// (PR_SET_PDEATHSIG), so killing the launcher never leaves ranks behind. PR_SET_PDEATHSIG
// follows the *thread* that forked, so spawn from a thread that outlives the children.
//
// The destructor kills (SIGKILL, whole group) and reaps every child still running, so an
// exception between spawn() and the end of a job leaves no orphans. The caller's descriptors
// 0-2 must be open (else a pipe could land there and be clobbered by the child's dup2).
class ProcessGroup {
 public:
  // The read ends of a child's stdout and stderr pipes: non-blocking and close-on-exec.
  struct Pipes {
    transport::links::tcp::Fd out;
    transport::links::tcp::Fd err;
  };

  ProcessGroup();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Raises this process's soft RLIMIT_NOFILE if `count` more descriptors may not fit (each
  // child costs two pipe ends). Children get the original limit back before exec. Throws
  // Error when the hard limit is too low.
  void reserveDescriptors(size_t count);

  // Starts a child and returns its output pipes; the child's index is size() - 1 afterwards.
  // Returns only once the child has exec'd, so a program that cannot be run is a SpawnError
  // here rather than a mysterious exit status 127 later. Throws Error when fork or pipe fail.
  Pipes spawn(const ChildSpec& spec);

  // Collects every child that has ended, without blocking; returns their indices in order.
  // One waitpid per running child (never waitpid(-1), which would steal the exit status of
  // children that are not ours), so call it on SIGCHLD rather than in a busy loop.
  std::vector<size_t> reap();

  // Sends `sig` to the process group of child `index` / of every child still running.
  void signal(size_t index, int sig);
  void signalRunning(int sig);

  size_t size() const { return children_.size(); }
  size_t runningCount() const { return running_; }
  bool running(size_t index) const { return !children_[index].status.has_value(); }
  pid_t pid(size_t index) const { return children_[index].pid; }
  const std::optional<ExitStatus>& status(size_t index) const { return children_[index].status; }

 private:
  struct Child {
    pid_t pid = -1;
    std::optional<ExitStatus> status;  // set once reaped
  };

  std::vector<Child> children_;
  size_t running_ = 0;  // children not reaped yet
  rlimit original_nofile_{};
  bool nofile_raised_ = false;
};

}  // namespace railshard::launcher
