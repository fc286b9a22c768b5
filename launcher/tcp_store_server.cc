// The rendezvous store's server (tcp_store_server.h): set-up, the public calls, and the epoll
// loop on its thread that everything else runs from.
#include "launcher/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <exception>
#include <iomanip>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "launcher/tcp_store_server_impl.h"

namespace railshard::launcher {

using transport::links::tcp::errnoText;
using transport::links::tcp::Fd;
using transport::links::tcp::SockAddr;

TcpStoreServer::Impl::Impl(Fd listen_fd, std::string token, TcpStoreServerOptions options)
    : listen_(std::move(listen_fd)), token_(std::move(token)), options_(options) {
  address_ = transport::links::tcp::localAddress(listen_.get());
  transport::links::tcp::setNonBlocking(listen_.get(), true);
  transport::links::tcp::setCloseOnExec(listen_.get(), true);
  epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) throw Error("store server: epoll_create1: " + errnoText(errno));
  stop_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop_.valid()) throw Error("store server: eventfd: " + errnoText(errno));
  control(EPOLL_CTL_ADD, stop_.get(), kStopId, EPOLLIN);
  control(EPOLL_CTL_ADD, listen_.get(), kListenId, EPOLLIN);
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::Impl::~Impl() {
  const uint64_t one = 1;
  // The eventfd counter cannot overflow from a single write; ignore the impossible failure.
  [[maybe_unused]] const ssize_t n = ::write(stop_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  // Members close every socket as they are destroyed.
}

bool TcpStoreServer::Impl::tryControl(int op, int fd, uint64_t id, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  return ::epoll_ctl(epoll_.get(), op, fd, &ev) == 0;
}

void TcpStoreServer::Impl::control(int op, int fd, uint64_t id, uint32_t events) {
  if (!tryControl(op, fd, id, events)) {
    throw Error("store server: epoll_ctl: " + errnoText(errno));
  }
}

void TcpStoreServer::Impl::run() {
  RS_LOG_DEBUG("store server: serving on {}", address_.toString());
  std::vector<epoll_event> events(64);
  try {
    while (true) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                                 nextTimeoutMs());
      if (n < 0) {
        if (errno == EINTR) continue;
        RS_LOG_ERROR("store server on {}: epoll_wait failed: {}; no longer serving",
                     address_.toString(), errnoText(errno));
        return;
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kStopId) return;
        if (id == kListenId) {
          acceptAll();
        } else {
          onClientEvent(id, events[i].events);
        }
      }
      fireTimers();
      drainReady();
      reap();
      // Once per wake-up (a system call, ~0.2 µs, against tens of µs a request costs).
      timespec cpu{};
      if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
        counters_.cpu_ns.store(
            static_cast<uint64_t>(cpu.tv_sec) * 1000000000u + static_cast<uint64_t>(cpu.tv_nsec),
            std::memory_order_relaxed);
      }
    }
  } catch (const std::exception& e) {
    // Only a failing epoll_ctl or allocation gets here; per-client trouble is handled
    // per client. Stop serving rather than take the process down.
    RS_LOG_ERROR("store server on {}: stopped: {}", address_.toString(), e.what());
  }
}

int TcpStoreServer::Impl::nextTimeoutMs() const {
  std::optional<Deadline> next;
  if (!timers_.empty()) next = timers_.begin()->first;
  if (accept_paused_until_ && (!next || *accept_paused_until_ < *next)) {
    next = accept_paused_until_;
  }
  if (!next) return -1;
  // Round up: waking a fraction of a millisecond early would only loop back here.
  const auto left = *next - Clock::now() + std::chrono::microseconds(999);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
  if (ms <= 0) return 0;
  return ms > 1'000'000 ? 1'000'000 : static_cast<int>(ms);
}

TcpStoreServer::TcpStoreServer(const SockAddr& addr, std::string token,
                               TcpStoreServerOptions options)
    : TcpStoreServer(transport::links::tcp::listenOn(addr), std::move(token), options) {}

TcpStoreServer::TcpStoreServer(Fd listen_fd, std::string token, TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(listen_fd), std::move(token), options)) {
  RS_LOG_INFO("store server listening on {}", impl_->address().toString());
}

std::unique_ptr<TcpStoreServer> TcpStoreServer::adopt(int listen_fd, std::string token,
                                                      TcpStoreServerOptions options) {
  Fd fd(listen_fd);
  if (!fd.valid()) throw InvalidArgument("store server: adopt() given an invalid descriptor");
  // listen() on a socket that already listens only adjusts the backlog; on one that is
  // merely bound it starts listening. Either way the socket is ready afterwards.
  if (::listen(fd.get(), 1024) != 0) {
    throw InvalidArgument("store server: adopted descriptor " + std::to_string(listen_fd) +
                          " cannot listen: " + errnoText(errno));
  }
  return std::unique_ptr<TcpStoreServer>(
      new TcpStoreServer(std::move(fd), std::move(token), options));
}

TcpStoreServer::~TcpStoreServer() {
  // What the job cost the store: at scale its start-up's requests are the number to watch.
  RS_LOG_INFO("store server on {} answered {}", impl_->address().toString(),
              impl_->stats().describe());
}

uint16_t TcpStoreServer::port() const {
  return impl_->address().port();
}

const SockAddr& TcpStoreServer::address() const {
  return impl_->address();
}

StoreStats TcpStoreServer::stats() const {
  return impl_->stats();
}

std::string StoreStats::describe() const {
  std::ostringstream out;
  auto megabytes = [](uint64_t bytes) {
    std::ostringstream text;
    text << std::fixed << std::setprecision(bytes < 10000000 ? 2 : 1) << bytes / 1e6 << " MB";
    return text.str();
  };
  out << requests() << " requests (" << sets << " set, " << gets << " get, " << adds << " add, "
      << waits << " wait of " << keys_waited << " keys, " << removes << " remove), "
      << megabytes(bytes_in) << " in, " << megabytes(bytes_out) << " out, " << connections
      << " connections";
  out << std::fixed << std::setprecision(3) << ", " << cpu_ns / 1e9 << " s of CPU";
  if (requests() > 0) {
    out << std::setprecision(1) << " (" << cpu_ns / 1e3 / static_cast<double>(requests())
        << " µs per request)";
  }
  return out.str();
}

}  // namespace railshard::launcher
