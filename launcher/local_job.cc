// railshard-launch's job on one host (local_job.h): starting the ranks, forwarding their
// output line by line, and the poll loop that hands their endings and signals to the Supervisor.
#include "launcher/local_job.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "base/error.h"
#include "launcher/job_token.h"
#include "launcher/line_prefixer.h"
#include "launcher/local_job_internal.h"
#include "launcher/process_group.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "transport/links/tcp/socket.h"

extern char** environ;

namespace railshard::launcher {

namespace {

using Clock = std::chrono::steady_clock;
using transport::links::tcp::Fd;

// Blocks the signals the launcher waits for and delivers them through a signalfd, so that one
// poll() loop sees rank output, rank exits and Ctrl-C alike. Restores the old mask on exit.
class SignalCatcher {
 public:
  SignalCatcher() {
    sigset_t blocked;
    sigemptyset(&blocked);
    for (const int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) sigaddset(&blocked, sig);
    if (::pthread_sigmask(SIG_BLOCK, &blocked, &old_mask_) != 0) {
      throw Error("cannot block signals for the launcher");
    }
    // SIGPIPE stays blocked but is not read: a closed stdout makes write() fail with EPIPE
    // and the launcher drops that stream instead of dying and taking the ranks with it.
    sigset_t caught = blocked;
    sigdelset(&caught, SIGPIPE);
    fd_ = ::signalfd(-1, &caught, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd_ < 0) {
      const int err = errno;
      ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
      throw Error(std::string("signalfd: ") + std::strerror(err));
    }
    // A launcher started with SIGCHLD ignored (some supervisors do that) would have its ranks
    // reaped by the kernel, and their exit statuses lost, unless the default comes back.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    ::sigaction(SIGCHLD, &default_action, &old_sigchld_);
  }

  ~SignalCatcher() {
    ::close(fd_);
    // A SIGPIPE left pending would kill the launcher the moment it is unblocked.
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    const timespec zero{0, 0};
    while (::sigtimedwait(&pipe_only, nullptr, &zero) == SIGPIPE) {
    }
    ::sigaction(SIGCHLD, &old_sigchld_, nullptr);
    ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

  int fd() const { return fd_; }

  // Every signal received since the last call, in order.
  std::vector<int> take() {
    std::vector<int> signals;
    signalfd_siginfo info;
    while (::read(fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      signals.push_back(static_cast<int>(info.ssi_signo));
    }
    return signals;
  }

 private:
  int fd_ = -1;
  sigset_t old_mask_{};
  struct sigaction old_sigchld_ {};
};

// The store server's thread saying "a HELLO carried another token" to the launcher's poll
// loop: an eventfd to wake it and the peer's address.
class WrongTokenAlarm {
 public:
  WrongTokenAlarm() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!fd_.valid()) throw Error(std::string("eventfd: ") + std::strerror(errno));
  }
  int fd() const { return fd_.get(); }
  void raise(const std::string& peer) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (peer_.empty()) peer_ = peer;
    }
    const uint64_t one = 1;
    ssize_t ignored = ::write(fd_.get(), &one, sizeof(one));
    (void)ignored;
  }
  bool raised() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !peer_.empty();
  }
  // The first peer; clears the wake-up.
  std::string take() {
    uint64_t count = 0;
    ssize_t ignored = ::read(fd_.get(), &count, sizeof(count));
    (void)ignored;
    std::lock_guard<std::mutex> lock(mutex_);
    return peer_;
  }

 private:
  transport::links::tcp::Fd fd_;
  mutable std::mutex mutex_;
  std::string peer_;
};

// A destination for forwarded output; after EPIPE (nobody reads any more) output is dropped.
struct Sink {
  int fd;
  bool broken = false;

  void write(const std::string& data) {
    size_t done = 0;
    while (!broken && done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      if (n <= 0) {
        broken = true;
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
};

// One output stream (stdout or stderr) of one rank.
struct Stream {
  Fd fd;
  LinePrefixer prefixer;
  Sink* sink;
};

// Reads what is available on `stream` and forwards its whole lines; false at end of stream.
bool pump(Stream& stream) {
  char buffer[65536];
  std::string lines;
  const ssize_t n = ::read(stream.fd.get(), buffer, sizeof(buffer));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n <= 0) {
    stream.prefixer.finish(lines);
    stream.sink->write(lines);
    stream.fd.reset();
    return false;
  }
  stream.prefixer.feed(std::string_view(buffer, static_cast<size_t>(n)), lines);
  stream.sink->write(lines);
  return true;
}

// A rank just ended: what it wrote before exiting is in its pipes, but possibly not read yet
// (poll() reported the exit first, or there was more than one read's worth). Read it now, so
// that its output comes before the launcher's notice and its last error line is known. A
// background process it left behind may keep writing: read a bounded amount.
void catchUp(Stream& stream) {
  for (int reads = 0; stream.fd.valid() && reads < 64; ++reads) {
    pollfd p{stream.fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    pump(stream);
  }
}

// After every rank has been reaped its output is complete in the pipe, but a background
// process it left behind may still hold the pipe open: read what is there and stop.
void drain(Stream& stream) {
  for (int reads = 0; stream.fd.valid() && reads < 1024; ++reads) {
    pollfd p{stream.fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    pump(stream);
  }
  if (stream.fd.valid()) {
    std::string lines;
    stream.prefixer.finish(lines);
    stream.sink->write(lines);
    stream.fd.reset();
  }
}

// The address the ranks should dial: the bound one, except that a wildcard address (the
// socket listens everywhere) is not something to connect to; ranks are local, use loopback.
int freeLocalPort() {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 29500;  // torchrun's default; only for torch scripts, which may set their own
  }
  return ntohs(addr.sin_port);
}

std::string advertisedAddress(int listen_fd) {
  transport::links::tcp::SockAddr addr = transport::links::tcp::localAddress(listen_fd);
  if (addr.storage.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr.storage);
    if (in->sin_addr.s_addr == htonl(INADDR_ANY)) in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (addr.storage.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr.storage);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) in6->sin6_addr = in6addr_loopback;
  }
  return addr.toString();
}

Fd listenForStore(const std::string& host, uint16_t port) {
  const std::string host_port = transport::links::tcp::joinHostPort(host, port);
  Fd listener =
      transport::links::tcp::listenOn(transport::links::tcp::resolve(host_port, "--store-host"));
  // Keep it off 0-2, which become each rank's stdio; inherited at this number by rank 0.
  if (listener.get() <= STDERR_FILENO) {
    Fd moved(::fcntl(listener.get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
    if (!moved.valid()) throw Error(std::string("fcntl: ") + std::strerror(errno));
    listener = std::move(moved);
  }
  return listener;
}

std::string thisHostName() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// Several hosts, once this node's ranks have all ended: counts this node in, and on node 0
// (whose launcher hosts the store) waits until every node has, at most kNodesDoneWait, so that
// no node's ranks lose the store while they still use it. A store out of reach is no error
// here: the ranks' own results are what the launcher reports.
// A SIGINT or SIGTERM (`signals`) ends the wait at once.
void waitForOtherNodes(const LocalJobOptions& options, const std::string& token,
                       SignalCatcher& signals) {
  try {
    TcpStore store(options.master, token, std::chrono::seconds(10));
    int64_t done = store.add(kNodesDoneKey, 1, std::chrono::seconds(10));
    const auto until = Clock::now() + kNodesDoneWait;
    while (options.node_rank == 0 && done < options.nnodes && Clock::now() < until) {
      pollfd fd{signals.fd(), POLLIN, 0};
      if (::poll(&fd, 1, 100) > 0) {
        const std::vector<int> caught = signals.take();
        if (std::any_of(caught.begin(), caught.end(),
                        [](int sig) { return sig == SIGINT || sig == SIGTERM; })) {
          return;
        }
      }
      done = store.add(kNodesDoneKey, 0, std::chrono::seconds(10));
    }
    if (options.node_rank == 0 && done < options.nnodes && options.notice) {
      options.notice("stopped waiting for the other nodes' ranks after " + seconds(kNodesDoneWait) +
                     ": " + std::to_string(done) + " of " + std::to_string(options.nnodes) +
                     " nodes done; closing the store");
    }
  } catch (const std::exception& e) {
    if (options.notice) options.notice(std::string("could not count this node done: ") + e.what());
  }
}

// Whether a rank's last error line is railshard's report of a lost peer (PeerLostError).
bool reportsLostPeer(const std::string& line) {
  return line.find("PeerLostError") != std::string::npos ||
         line.find("lost a peer") != std::string::npos;
}

}  // namespace

int runLocalJob(const LocalJobOptions& options) {
  if (options.world_size < 1) {
    throw InvalidArgument("world size must be at least 1, got " +
                          std::to_string(options.world_size));
  }
  if (options.command.empty()) throw InvalidArgument("no program to run");
  if (options.elastic && options.max_failures < 0) {
    throw InvalidArgument("max_failures must not be negative, got " +
                          std::to_string(options.max_failures));
  }
  if (options.min_ranks < 0 || options.min_ranks > options.world_size ||
      (options.min_ranks > 0 && !options.elastic)) {
    throw InvalidArgument("min_ranks must be 0, or 1 to the world size (" +
                          std::to_string(options.world_size) + ") in elastic mode; got " +
                          std::to_string(options.min_ranks) +
                          (options.elastic ? "" : " without elastic"));
  }
  if (!options.cgroup_procs.empty() &&
      options.cgroup_procs.size() != static_cast<size_t>(options.world_size)) {
    throw InvalidArgument("cgroup_procs names " + std::to_string(options.cgroup_procs.size()) +
                          " groups for " + std::to_string(options.world_size) + " ranks");
  }
  if (options.max_restarts < 0 || (options.max_restarts > 0 && !options.elastic)) {
    throw InvalidArgument("max_restarts must be 0, or positive in elastic mode; got " +
                          std::to_string(options.max_restarts) +
                          (options.elastic ? "" : " without elastic"));
  }

  const bool several_hosts = options.nnodes > 1;
  if (options.nnodes < 1 || options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw InvalidArgument("node rank " + std::to_string(options.node_rank) + " of " +
                          std::to_string(options.nnodes) +
                          " nodes: nodes must be at least 1 and the node rank below them");
  }
  if (several_hosts && (options.master.empty() || options.token.empty() || options.elastic)) {
    throw InvalidArgument(
        "a job over several hosts needs the master's address (node 0's HOST:PORT), the same "
        "job token on every node (RAILSHARD_TOKEN) and no elastic mode");
  }
  const std::string token = options.token.empty() ? makeJobToken() : options.token;
  // The launcher hosts the store itself (elastic; node 0 of several hosts), else rank 0 does.
  const bool launcher_store = options.elastic || several_hosts;
  Fd listener;
  std::string store_addr;
  std::string torch_host = "127.0.0.1";
  int torch_port = 0;
  if (several_hosts) {
    const auto [host, port] = transport::links::tcp::splitHostPort(options.master, "--master");
    store_addr = options.master;
    torch_host = host;
    torch_port = static_cast<int>(port) + 1;
    if (options.node_rank == 0) listener = listenForStore(host, port);
  } else {
    listener = listenForStore(options.store_host, options.store_port);
    store_addr = advertisedAddress(listener.get());
    // A port for torch's own TCPStore (rank 0 binds it in init_process_group); free now, and
    // the kernel does not hand out a just-released ephemeral port again at once.
    torch_port = freeLocalPort();
  }

  std::vector<std::string> base_env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    base_env.emplace_back(*entry);
  }

  // Before the first fork, so that a Ctrl-C during start-up is forwarded like any other.
  SignalCatcher signals;
  ProcessGroup ranks;  // declared after `signals`: its destructor kills before the mask returns
  const size_t world_size = static_cast<size_t>(options.world_size);
  const size_t processes = world_size + static_cast<size_t>(options.max_restarts);
  ranks.reserveDescriptors(2 * processes);

  Sink out{options.stdout_fd};
  Sink err{options.stderr_fd};
  std::vector<Stream> streams;
  streams.reserve(2 * processes);
  // `rank`: the slot; `restart`: started again into a running job (RAILSHARD_JOIN=1).
  const auto start = [&](int rank, bool restart) {
    ChildSpec spec;
    spec.argv = options.command;
    // Elastic, several hosts: the launcher hosts the store, so no rank gets the socket.
    const bool gets_socket = rank == 0 && !launcher_store;
    const RankPlace place{options.node_rank * options.world_size + rank,
                          options.nnodes * options.world_size, rank, options.world_size};
    spec.env = rankEnvironment(base_env, place, store_addr, token,
                               gets_socket ? listener.get() : -1, launcher_store, options.elastic);
    if (restart) spec.env.push_back("RAILSHARD_JOIN=1");
    for (auto& entry : torchEnvironment(base_env, place, torch_host, torch_port)) {
      // Replace, not duplicate, what an enclosing launcher left in the base environment.
      const std::string name = entry.substr(0, entry.find('=') + 1);
      std::erase_if(spec.env, [&](const std::string& e) { return e.rfind(name, 0) == 0; });
      spec.env.push_back(std::move(entry));
    }
    // Rank 0 reads the launcher's stdin, unless that is a terminal: ranks are not in the
    // terminal's foreground group, and reading it would stop them (SIGTTIN).
    spec.stdin_fd = (rank == 0 && ::isatty(STDIN_FILENO) == 0) ? STDIN_FILENO : -1;
    spec.inherited_fd = gets_socket ? listener.get() : -1;
    if (!options.cgroup_procs.empty())
      spec.cgroup_procs = options.cgroup_procs[static_cast<size_t>(rank)];
    ProcessGroup::Pipes pipes = ranks.spawn(spec);
    std::string prefix;
    if (options.prefix_output) prefix.append("[").append(std::to_string(place.rank)).append("] ");
    streams.push_back(Stream{std::move(pipes.out), LinePrefixer(prefix), &out});
    streams.push_back(Stream{std::move(pipes.err), LinePrefixer(prefix), &err});
    streams.back().prefixer.keepLastLine();
  };
  for (int rank = 0; rank < options.world_size; ++rank) start(rank, false);
  Supervisor supervisor(options, ranks,
                        options.host_name.empty() ? thisHostName() : options.host_name);
  std::vector<size_t> slot_of;  // process index -> slot
  for (size_t rank = 0; rank < world_size; ++rank) slot_of.push_back(rank);
  // Elastic: started only now, so that no fork happens while its thread runs (a child could
  // inherit a lock that thread held) and so that the thread inherits the blocked signals,
  // which must reach the signalfd above rather than kill the launcher. Ranks that connected
  // before are in the socket's backlog. Declared after `ranks`: on an exception the store
  // goes first, then the ranks are killed.
  WrongTokenAlarm wrong_token;  // before the server, whose thread raises it: outlives it
  std::unique_ptr<TcpStoreServer> store_server;
  if (launcher_store && listener.valid()) {
    TcpStoreServerOptions store_options;
    if (several_hosts) {
      store_options.on_wrong_token = [&wrong_token](const std::string& peer) {
        wrong_token.raise(peer);
      };
    }
    store_server = TcpStoreServer::adopt(listener.release(), token, std::move(store_options));
    if (options.elastic) supervisor.setStore(store_addr, token);
  } else {
    // Rank 0 owns the store socket now; a copy here would keep accepting connections (into a
    // backlog nobody reads) after rank 0 died, instead of refusing them.
    listener.reset();
  }

  std::vector<pollfd> fds;
  std::vector<Stream*> polled;
  while (ranks.runningCount() > 0) {
    fds.clear();
    polled.clear();
    fds.push_back(pollfd{signals.fd(), POLLIN, 0});
    fds.push_back(pollfd{wrong_token.fd(), POLLIN, 0});
    for (auto& stream : streams) {
      if (!stream.fd.valid()) continue;
      fds.push_back(pollfd{stream.fd.get(), POLLIN, 0});
      polled.push_back(&stream);
    }
    const int ready = ::poll(fds.data(), fds.size(), supervisor.pollTimeoutMs());
    if (ready < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
    for (size_t i = 2; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump(*polled[i - 2]);
    }
    if (fds[1].revents != 0) {
      supervisor.onJobError("a launcher or rank at " + wrong_token.take() +
                            " presented another job token than this node's: every node of a "
                            "job needs the same RAILSHARD_TOKEN, and that node cannot join "
                            "this job");
    }
    bool child_ended = ready == 0;  // after a quiet second, look anyway: costs little
    for (const int sig : signals.take()) {
      if (sig == SIGCHLD) {
        child_ended = true;  // several exits may share one SIGCHLD; reap() finds them all
      } else {
        supervisor.onSignal(sig);
      }
    }
    if (child_ended) {
      std::vector<size_t> ended = ranks.reap();
      for (const size_t rank : ended) {
        catchUp(streams[2 * rank]);
        catchUp(streams[2 * rank + 1]);
      }
      // Ranks that ended together (a loaded machine reaps them in one batch): the ones that
      // only report losing a peer are the echo of another's failure, which is named first.
      std::stable_partition(ended.begin(), ended.end(), [&](size_t rank) {
        return !reportsLostPeer(streams[2 * rank + 1].prefixer.lastErrorLine());
      });
      for (const size_t rank : ended) {
        const LinePrefixer& err = streams[2 * rank + 1].prefixer;
        supervisor.onRankEnded(rank, err.lastErrorLine(), err.lastLine());
      }
      for (const size_t index : supervisor.takeRestarts()) {
        const size_t slot = slot_of[index];
        slot_of.push_back(slot);
        supervisor.setSlot(slot_of.size() - 1, slot);
        start(static_cast<int>(slot), true);
      }
    }
    supervisor.onTick();
  }
  for (auto& stream : streams) drain(stream);
  // After a wrong token the other nodes are not this job's: nothing to wait for.
  if (several_hosts && !wrong_token.raised()) waitForOtherNodes(options, token, signals);
  return supervisor.exitStatus();
}

}  // namespace railshard::launcher
