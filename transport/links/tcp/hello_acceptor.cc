// Start-up connections accepted and their hellos read side by side (hello_acceptor.h).
#include "transport/links/tcp/hello_acceptor.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "base/error.h"
#include "base/logging.h"

namespace railshard::transport::links::tcp {

HelloAcceptor::HelloAcceptor(std::string who, std::string what)
    : who_(std::move(who)), what_(std::move(what)) {}

void HelloAcceptor::refuse(const Pending& p, const std::string& reason) const {
  RS_LOG_WARN("{}: refused a {} from {}: {}", who_, what_, p.from, reason);
}

bool HelloAcceptor::read(Pending& p, const Check& check, const Admit& admit) const {
  while (p.bytes.size() < p.want) {
    const size_t got = p.bytes.size();
    p.bytes.resize(p.want);
    const ssize_t n = ::recv(p.fd.get(), p.bytes.data() + got, p.want - got, MSG_DONTWAIT);
    p.bytes.resize(got + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n == 0) {
      refuse(p, "connection closed after " + std::to_string(got) + " byte(s) of its " +
                    (got < sizeof(Hello) ? std::to_string(sizeof(Hello)) + "-byte hello"
                                         : std::to_string(p.want) + "-byte hello and token"));
      return true;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      refuse(p, "receive failed: " + errnoText(errno));
      return true;
    }
    if (p.bytes.size() == sizeof(Hello)) {
      try {
        p.want = helloSize(p.bytes);
      } catch (const ProtocolError& e) {
        refuse(p, e.what());
        return true;
      }
    }
  }
  std::string reason;
  try {
    const ReceivedHello received = parseHello(p.bytes);
    reason = check(received, p.fd.get());
    if (reason.empty()) reason = admit(std::move(p.fd), received, p.from);
  } catch (const Error& e) {
    reason = e.what();
  }
  if (!reason.empty()) refuse(p, reason);
  return true;
}

void HelloAcceptor::run(const std::vector<int>& listen_fds, Deadline deadline, Duration timeout,
                        const std::function<bool()>& done, const Check& check, const Admit& admit,
                        const std::function<std::string()>& missing) {
  std::vector<Pending> pending;
  while (!done()) {
    const Deadline now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError(who_ + ": " + missing() + " within " +
                         std::to_string(std::chrono::duration<double>(timeout).count()) + " s");
    }
    // Silent connections past their hello deadline go first.
    std::erase_if(pending, [&](const Pending& p) {
      if (p.deadline > now) return false;
      refuse(p,
             "no complete hello within " +
                 std::to_string(
                     std::chrono::duration_cast<std::chrono::milliseconds>(kHelloTimeout).count()) +
                 " ms (" + std::to_string(p.bytes.size()) + " byte(s) received)");
      return true;
    });
    Deadline wake = std::min(deadline, now + std::chrono::seconds(1));
    for (const auto& p : pending) wake = std::min(wake, p.deadline);
    std::vector<pollfd> polled;
    for (const int fd : listen_fds) polled.push_back({fd, POLLIN, 0});
    for (const auto& p : pending) polled.push_back({p.fd.get(), POLLIN, 0});
    const auto wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    const int n = ::poll(polled.data(), polled.size(), static_cast<int>(wait_ms));
    if (n < 0 && errno != EINTR) throw Error(who_ + ": poll: " + errnoText(errno));
    if (n <= 0) continue;
    // Pending connections first (their indices shift once new ones are appended).
    const size_t listener_count = listen_fds.size();
    std::vector<bool> finished(pending.size(), false);
    for (size_t i = 0; i < pending.size(); ++i) {
      if (polled[listener_count + i].revents & (POLLIN | POLLHUP | POLLERR)) {
        finished[i] = read(pending[i], check, admit);
      }
    }
    size_t index = 0;
    std::erase_if(pending, [&](const Pending&) { return finished[index++]; });
    for (size_t i = 0; i < listener_count; ++i) {
      if (!(polled[i].revents & POLLIN)) continue;
      const int fd = ::accept4(polled[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;  // gone already, or out of descriptors: the next round retries
      // As on the connecting side: with Nagle on, a small message sent while the previous
      // one is unacknowledged waits for the peer's delayed ACK (~40 ms).
      setNoDelay(fd);
      Pending p;
      p.fd = Fd(fd);
      try {
        p.from = peerAddress(fd).toString();
      } catch (const Error&) {
        continue;  // reset before we got to it
      }
      p.deadline = std::min(deadline, deadlineAfter(kHelloTimeout));
      if (pending.size() >= kMaxPendingHellos) {
        refuse(pending.front(), "more than " + std::to_string(kMaxPendingHellos) +
                                    " connections without a complete hello; closing the oldest");
        pending.erase(pending.begin());
      }
      // Real ranks send their hello right after connecting: it is usually here already.
      if (!read(p, check, admit)) pending.push_back(std::move(p));
    }
  }
}

}  // namespace railshard::transport::links::tcp
