#include "transport/links/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/error.h"

namespace railshard::transport::links::tcp {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errnoText(int err) {
  return std::string(std::strerror(err));
}

std::string SockAddr::toString() const {
  char host[INET6_ADDRSTRLEN] = {0};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    // Appended piecewise: `"[" + std::string(...)` trips a false -Wrestrict in GCC 12.
    std::string text = "[";
    text += host;
    text += "]:";
    text += std::to_string(ntohs(in6->sin6_port));
    return text;
  }
  return "(unknown address family)";
}

std::string joinHostPort(const std::string& host, uint16_t port) {
  const bool bare_ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  // Appended piecewise for the same GCC 12 -Wrestrict false positive as above.
  std::string text;
  if (bare_ipv6) text += "[";
  text += host;
  if (bare_ipv6) text += "]";
  text += ":";
  text += std::to_string(port);
  return text;
}

uint16_t SockAddr::port() const {
  if (storage.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
  if (storage.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

std::pair<std::string, uint16_t> splitHostPort(const std::string& host_port,
                                               const std::string& what) {
  std::string host;
  std::string port;
  if (!host_port.empty() && host_port.front() == '[') {
    const auto close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      throw InvalidArgument(what + ": expected [ipv6]:port, got '" + host_port + "'");
    }
    host = host_port.substr(1, close - 1);
    port = host_port.substr(close + 2);
  } else {
    const auto colon = host_port.rfind(':');
    if (colon == std::string::npos) {
      throw InvalidArgument(what + ": expected host:port, got '" + host_port + "'");
    }
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
  }
  if (host.empty()) throw InvalidArgument(what + ": empty host in '" + host_port + "'");
  char* end = nullptr;
  const long value = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || value < 0 || value > 65535) {
    throw InvalidArgument(what + ": bad port '" + port + "' in '" + host_port + "'");
  }
  return {host, static_cast<uint16_t>(value)};
}

SockAddr resolve(const std::string& host_port, const std::string& what) {
  const auto [host, port] = splitHostPort(host_port, what);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    throw InvalidArgument(what + ": cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  SockAddr addr;
  std::memcpy(&addr.storage, result->ai_addr, result->ai_addrlen);
  addr.length = result->ai_addrlen;
  ::freeaddrinfo(result);
  return addr;
}

void setNonBlocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setCloseOnExec(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFD, 0);
  ::fcntl(fd, F_SETFD, on ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC));
}

Fd listenOn(const SockAddr& addr) {
  Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error("socket(): " + errnoText(errno));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0) {
    throw Error("cannot listen on " + addr.toString() + ": bind: " + errnoText(errno));
  }
  if (::listen(fd.get(), 1024) != 0) {
    throw Error("cannot listen on " + addr.toString() + ": listen: " + errnoText(errno));
  }
  return fd;
}

SockAddr localAddress(int fd) {
  SockAddr addr;
  addr.length = sizeof(addr.storage);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr.storage), &addr.length);
  return addr;
}

SockAddr peerAddress(int fd) {
  SockAddr addr;
  addr.length = sizeof(addr.storage);
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr.storage), &addr.length);
  return addr;
}

namespace {

// Waits for `events` on fd until deadline; false on timeout.
bool pollUntil(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, millisUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) return Clock::now() < deadline ? true : false;
    if (errno != EINTR) return true;  // let the caller's syscall report the error
  }
}

}  // namespace

Fd connectWithRetry(const SockAddr& addr, Deadline deadline, const std::string& what,
                    const SockAddr* source) {
  int last_error = 0;
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) throw Error(what + ": socket(): " + errnoText(errno));
    // Binding the source address pins the connection to one interface (one rail): the
    // kernel would otherwise pick the route's preferred source.
    if (source != nullptr && ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&source->storage),
                                    source->length) != 0) {
      throw Error(what + ": cannot bind to " + source->toString() + ": " + errnoText(errno));
    }
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length);
    if (rc != 0 && errno == EINPROGRESS) {
      pollUntil(fd.get(), POLLOUT, deadline);
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      pollfd p{fd.get(), POLLOUT, 0};
      if (err == 0 && ::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT)) {
        rc = 0;
      } else {
        errno = err != 0 ? err : ETIMEDOUT;
      }
    }
    if (rc == 0) {
      setNonBlocking(fd.get(), false);
      setNoDelay(fd.get());
      return fd;
    }
    last_error = errno;
    if (Clock::now() >= deadline) {
      throw TimeoutError(what + ": could not connect to " + addr.toString() +
                         " before the deadline (last error: " + errnoText(last_error) + ")");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

Fd acceptBefore(int listen_fd, Deadline deadline, const std::string& what) {
  while (true) {
    pollfd p{listen_fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, millisUntil(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0 && Clock::now() >= deadline) {
      throw TimeoutError(what + ": no connection arrived before the deadline");
    }
    if (rc <= 0) continue;
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) {
      setNoDelay(fd.get());
      return fd;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
      throw Error(what + ": accept: " + errnoText(errno));
    }
  }
}

void sendAll(int fd, const void* data, size_t bytes, Deadline deadline, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (Clock::now() >= deadline) throw TimeoutError(what + ": send timed out");
      pollUntil(fd, POLLOUT, deadline);
      continue;
    }
    throw PeerLostError(what + ": connection lost while sending: " + errnoText(errno));
  }
}

void recvAll(int fd, void* data, size_t bytes, Deadline deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw PeerLostError(what + ": connection closed by the other side");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (Clock::now() >= deadline) throw TimeoutError(what + ": receive timed out");
      pollUntil(fd, POLLIN, deadline);
      continue;
    }
    throw PeerLostError(what + ": connection lost while receiving: " + errnoText(errno));
  }
}

}  // namespace railshard::transport::links::tcp
