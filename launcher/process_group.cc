#include "launcher/process_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace railshard::launcher {

namespace {

// Descriptors kept in reserve beyond the ones reserveDescriptors() is asked for: the
// launcher's own stdio, the signalfd, a listening socket, /dev/null, spawn's status pipe.
constexpr rlim_t kDescriptorSlack = 64;

std::string errnoText(int err) {
  return std::strerror(err);
}

void makePipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error("cannot start a rank: pipe: " + errnoText(errno));
  }
}

void closeIfOpen(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Makes `source` the child's descriptor `target`, not close-on-exec. Only async-signal-safe
// calls: this runs between fork and exec.
bool moveTo(int source, int target) {
  if (source == target) {
    const int flags = ::fcntl(target, F_GETFD);
    return flags >= 0 && ::fcntl(target, F_SETFD, flags & ~FD_CLOEXEC) == 0;
  }
  return ::dup2(source, target) == target;  // dup2's copy is never close-on-exec
}

// The child's side of spawn(): plain system calls only (execvpe searches PATH on the stack,
// without malloc), because the parent may have had other threads holding locks at the moment
// of fork. Never returns.
// Writes this process's pid to `fd` (a cgroup.procs) without malloc; false with errno set.
bool enterGroup(int fd) {
  char digits[24];
  char* end = digits + sizeof(digits);
  char* at = end;
  for (pid_t pid = ::getpid(); pid > 0 || at == end; pid /= 10)
    *--at = static_cast<char>('0' + pid % 10);
  return ::write(fd, at, static_cast<size_t>(end - at)) == end - at;
}

// What the child sends back when entering its control group failed (errno follows).
constexpr int kGroupFailed = -1;

[[noreturn]] void runChild(char* const* argv, char* const* envp, int stdin_fd, int out_fd,
                           int err_fd, int inherited_fd, const int* cgroup_fds, size_t cgroups,
                           int status_fd, pid_t parent, const rlimit* nofile) {
  // Own process group: a terminal's Ctrl-C goes to the launcher only, which forwards it.
  ::setpgid(0, 0);
  // Die with the launcher. If it died before this line the request came too late: leave now.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  // The launcher blocks the signals it waits for through a signalfd; the mask survives exec
  // and a rank that cannot receive SIGTERM or SIGINT could never be stopped politely.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (nofile != nullptr) ::setrlimit(RLIMIT_NOFILE, nofile);

  for (size_t g = 0; g < cgroups; ++g) {
    if (!enterGroup(cgroup_fds[g])) {
      const int failure[3] = {kGroupFailed, errno, static_cast<int>(g)};
      ssize_t ignored = ::write(status_fd, failure, sizeof(failure));
      (void)ignored;
      ::_exit(127);
    }
  }
  int err = 0;
  if (!moveTo(stdin_fd, STDIN_FILENO) || !moveTo(out_fd, STDOUT_FILENO) ||
      !moveTo(err_fd, STDERR_FILENO)) {
    err = errno;
  } else if (inherited_fd >= 0) {
    const int flags = ::fcntl(inherited_fd, F_GETFD);
    if (flags < 0 || ::fcntl(inherited_fd, F_SETFD, flags & ~FD_CLOEXEC) != 0) err = errno;
  }
  if (err == 0) {
    ::execvpe(argv[0], argv, envp);
    err = errno;
  }
  // Tell spawn() why; a successful exec closes status_fd instead (close-on-exec).
  ssize_t ignored = ::write(status_fd, &err, sizeof(err));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

ExitStatus ExitStatus::fromWaitStatus(int wait_status) {
  ExitStatus status;
  if (WIFSIGNALED(wait_status)) {
    status.signal = WTERMSIG(wait_status);
  } else if (WIFEXITED(wait_status)) {
    status.code = WEXITSTATUS(wait_status);
  }
  return status;
}

std::string ExitStatus::describe() const {
  if (signal != 0) {
    const char* name = ::strsignal(signal);
    return "was killed by signal " + std::to_string(signal) + " (" +
           (name != nullptr ? name : "unknown") + ")";
  }
  return "exited with status " + std::to_string(code);
}

ProcessGroup::ProcessGroup() {
  ::getrlimit(RLIMIT_NOFILE, &original_nofile_);
}

ProcessGroup::~ProcessGroup() {
  signalRunning(SIGKILL);
  for (auto& child : children_) {
    if (child.status) continue;
    int wait_status = 0;
    while (::waitpid(child.pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
}

void ProcessGroup::reserveDescriptors(size_t count) {
  rlimit current{};
  if (::getrlimit(RLIMIT_NOFILE, &current) != 0) return;
  const rlim_t wanted = static_cast<rlim_t>(count) + kDescriptorSlack;
  if (current.rlim_cur == RLIM_INFINITY || current.rlim_cur >= wanted) return;
  if (current.rlim_max != RLIM_INFINITY && current.rlim_max < wanted) {
    throw Error("need about " + std::to_string(wanted) +
                " file descriptors but the hard limit (ulimit -Hn) is " +
                std::to_string(current.rlim_max));
  }
  current.rlim_cur = wanted;
  if (::setrlimit(RLIMIT_NOFILE, &current) != 0) {
    throw Error("cannot raise the open-file limit to " + std::to_string(wanted) + ": " +
                errnoText(errno));
  }
  nofile_raised_ = true;
}

ProcessGroup::Pipes ProcessGroup::spawn(const ChildSpec& spec) {
  if (spec.argv.empty()) throw InvalidArgument("spawn: no program given");
  if (spec.inherited_fd >= 0 && spec.inherited_fd <= STDERR_FILENO) {
    throw InvalidArgument("spawn: the inherited descriptor must be above 2, got " +
                          std::to_string(spec.inherited_fd));
  }
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = spec.env;
  std::vector<char*> envp;
  for (auto& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);

  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  int status[2] = {-1, -1};
  int null_fd = -1;
  std::vector<int> cgroup_fds;
  auto closeAll = [&] {
    for (int* fd : {&out[0], &out[1], &err[0], &err[1], &status[0], &status[1], &null_fd}) {
      closeIfOpen(*fd);
    }
    for (int& fd : cgroup_fds) closeIfOpen(fd);
  };

  try {
    makePipe(out);
    makePipe(err);
    makePipe(status);
    for (const auto& procs : spec.cgroup_procs) {
      const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) throw Error("cannot start a rank: " + procs + ": " + errnoText(errno));
      cgroup_fds.push_back(fd);
    }
    if (spec.stdin_fd < 0) {
      null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null_fd < 0) throw Error("cannot start a rank: /dev/null: " + errnoText(errno));
    }
  } catch (...) {
    closeAll();
    throw;
  }

  const pid_t parent = ::getpid();
  const rlimit* nofile = nofile_raised_ ? &original_nofile_ : nullptr;
  const pid_t pid = ::fork();
  if (pid == 0) {
    runChild(argv.data(), envp.data(), spec.stdin_fd >= 0 ? spec.stdin_fd : null_fd, out[1], err[1],
             spec.inherited_fd, cgroup_fds.data(), cgroup_fds.size(), status[1], parent, nofile);
  }
  if (pid < 0) {
    const int fork_errno = errno;
    closeAll();
    throw Error("cannot start a rank: fork: " + errnoText(fork_errno));
  }
  // Also from this side, so that signal() works even before the child ran its setpgid.
  ::setpgid(pid, pid);
  closeIfOpen(out[1]);
  closeIfOpen(err[1]);
  closeIfOpen(status[1]);
  closeIfOpen(null_fd);
  for (int& fd : cgroup_fds) closeIfOpen(fd);

  // exec's errno, or kGroupFailed, the errno of entering a group and which one.
  int reply[3] = {0, 0, 0};
  ssize_t n;
  while ((n = ::read(status[0], reply, sizeof(reply))) < 0 && errno == EINTR) {
  }
  const int exec_errno = reply[0];
  closeIfOpen(status[0]);
  if (n > 0) {
    int wait_status = 0;
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    closeAll();
    if (exec_errno == kGroupFailed) {
      throw Error("cannot start a rank: entering the control group " +
                  spec.cgroup_procs[static_cast<size_t>(reply[2])] +
                  " failed: " + errnoText(reply[1]));
    }
    throw SpawnError("cannot execute '" + spec.argv[0] + "': " + errnoText(exec_errno), exec_errno);
  }

  for (const int fd : {out[0], err[0]}) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  children_.push_back(Child{pid, std::nullopt});
  ++running_;
  return Pipes{transport::links::tcp::Fd(out[0]), transport::links::tcp::Fd(err[0])};
}

std::vector<size_t> ProcessGroup::reap() {
  std::vector<size_t> ended;
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& child = children_[i];
    if (child.status) continue;
    int wait_status = 0;
    pid_t result;
    while ((result = ::waitpid(child.pid, &wait_status, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (result == 0) continue;
    if (result < 0) {
      // ECHILD: someone else reaped it (SIGCHLD ignored, or a stray waitpid(-1)). It is gone
      // and its status is lost; count it as a failure rather than pretend it succeeded.
      child.status = ExitStatus{255, 0};
    } else {
      child.status = ExitStatus::fromWaitStatus(wait_status);
    }
    --running_;
    ended.push_back(i);
  }
  return ended;
}

void ProcessGroup::signal(size_t index, int sig) {
  const Child& child = children_[index];
  // Only while unreaped: until then the pid (and so the group id) cannot be reused.
  if (child.status) return;
  if (::kill(-child.pid, sig) != 0) ::kill(child.pid, sig);
}

void ProcessGroup::signalRunning(int sig) {
  for (size_t i = 0; i < children_.size(); ++i) signal(i, sig);
}

}  // namespace railshard::launcher
