#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/clock.h"

namespace railshard::transport::links::tcp {

// Owns a file descriptor; closes it once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// An IPv4/IPv6 socket address with its printable form.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string toString() const;  // "1.2.3.4:80" or "[::1]:80"
  uint16_t port() const;
};

// Splits "host:port" ("[v6]:port" for IPv6) and resolves host. InvalidArgument when malformed
// or unresolvable, naming `what` (e.g. "RAILSHARD_STORE_ADDR").
SockAddr resolve(const std::string& host_port, const std::string& what);
// "host:port", with brackets around a bare IPv6 literal ("[::1]:80"); the inverse of
// splitHostPort.
std::string joinHostPort(const std::string& host, uint16_t port);
// Parses only: {host, port}.
std::pair<std::string, uint16_t> splitHostPort(const std::string& host_port,
                                               const std::string& what);

// A listening TCP socket on `addr` (port 0 = any free port), SO_REUSEADDR, backlog large.
Fd listenOn(const SockAddr& addr);
// Local address of a bound or connected socket.
SockAddr localAddress(int fd);
// Address of the connected peer.
SockAddr peerAddress(int fd);

// Connects with retries until `deadline` (the peer may not be listening yet). Throws
// TimeoutError naming `what` and the last errno when the deadline passes.
Fd connectWithRetry(const SockAddr& addr, Deadline deadline, const std::string& what,
                    const SockAddr* source = nullptr);
// Accepts one connection, waiting at most until `deadline` (TimeoutError).
Fd acceptBefore(int listen_fd, Deadline deadline, const std::string& what);

// Blocking-with-deadline exact transfers on a socket that may be non-blocking. A closed
// connection raises PeerLostError, the deadline TimeoutError; both name `what`.
void sendAll(int fd, const void* data, size_t bytes, Deadline deadline, const std::string& what);
void recvAll(int fd, void* data, size_t bytes, Deadline deadline, const std::string& what);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
void setCloseOnExec(int fd, bool on);

// errno as text, for messages.
std::string errnoText(int err);

}  // namespace railshard::transport::links::tcp
