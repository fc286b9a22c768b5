// TcpStoreServer's connections (tcp_store_server_impl.h): accepting them, reading their frames,
// sending the responses, dropping a client.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "base/error.h"
#include "base/logging.h"
#include "launcher/store_protocol.h"
#include "launcher/tcp_store_server_impl.h"

namespace railshard::launcher {

using transport::links::tcp::errnoText;

namespace {

// Per readable event: bytes read from one client before moving on to the others, so one
// client streaming a 64 MiB value cannot starve the rest.
constexpr size_t kReadBudget = 4 * 1024 * 1024;
constexpr size_t kReadChunk = 256 * 1024;
// A read buffer that grew for a large value is released once it is empty again.
constexpr size_t kKeepBufferBytes = 1024 * 1024;
// How long to stop accepting after running out of descriptors: the listening socket stays
// readable, so retrying at once would spin.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

}  // namespace

void TcpStoreServer::Impl::acceptAll() {
  while (true) {
    SockAddr peer;
    peer.length = sizeof(peer.storage);
    const int fd = ::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&peer.storage),
                             &peer.length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      RS_LOG_WARN("store server on {}: accept failed: {}; pausing new connections for {} ms",
                  address_.toString(), errnoText(err), kAcceptPause.count());
      accept_paused_until_ = Clock::now() + kAcceptPause;
      control(EPOLL_CTL_MOD, listen_.get(), kListenId, 0);
      return;
    }
    transport::links::tcp::setNoDelay(fd);
    counters_.connections.fetch_add(1, std::memory_order_relaxed);
    auto client = std::make_unique<Client>();
    client->id = next_id_++;
    client->fd = Fd(fd);
    client->peer = peer.toString();
    client->events = EPOLLIN | EPOLLRDHUP;
    if (!tryControl(EPOLL_CTL_ADD, fd, client->id, client->events)) {
      // Refuse this one connection (the Fd closes it); everyone else keeps being served.
      RS_LOG_WARN("store server on {}: refusing connection from {}: epoll_ctl: {}",
                  address_.toString(), client->peer, errnoText(errno));
      continue;
    }
    setTimer(*client, Clock::now() + options_.hello_timeout);
    RS_LOG_DEBUG("store server on {}: connection from {}", address_.toString(), client->peer);
    // Ids grow, so the first is the oldest. The newest is kept: a real rank sends its
    // HELLO at once, a connection that has sat silent longest is the least likely one.
    while (!unauthenticated_.empty() &&
           unauthenticated_.size() >= std::max<size_t>(1, options_.max_unauthenticated)) {
      Client* oldest = find(*unauthenticated_.begin());
      if (oldest == nullptr) {
        unauthenticated_.erase(unauthenticated_.begin());
        continue;
      }
      drop(*oldest,
           "more than " + std::to_string(options_.max_unauthenticated) +
               " connections without HELLO; closing the oldest",
           true);
    }
    unauthenticated_.insert(client->id);
    clients_.emplace(client->id, std::move(client));
  }
}

TcpStoreServer::Impl::Client* TcpStoreServer::Impl::find(uint64_t id) {
  const auto it = clients_.find(id);
  return it == clients_.end() || it->second->closed ? nullptr : it->second.get();
}

void TcpStoreServer::Impl::drop(Client& c, const std::string& reason, bool warn) {
  if (c.closed) return;
  if (warn) {
    RS_LOG_WARN("store server on {}: closing connection from {}: {}", address_.toString(), c.peer,
                reason);
  } else {
    RS_LOG_DEBUG("store server on {}: closing connection from {}: {}", address_.toString(), c.peer,
                 reason);
  }
  unpark(c);
  clearTimer(c);
  unauthenticated_.erase(c.id);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.fd.reset();
  c.closed = true;
  Bytes().swap(c.in);
  Bytes().swap(c.out);
  dead_.push_back(c.id);
}

void TcpStoreServer::Impl::reap() {
  for (const uint64_t id : dead_) clients_.erase(id);
  dead_.clear();
}

void TcpStoreServer::Impl::updateInterest(Client& c) {
  if (c.closed) return;
  uint32_t want = EPOLLRDHUP;
  if (!c.busy()) want |= EPOLLIN;
  if (c.out_start < c.out.size()) want |= EPOLLOUT;
  if (want != c.events) {
    if (!tryControl(EPOLL_CTL_MOD, c.fd.get(), c.id, want)) {
      drop(c, "epoll_ctl: " + errnoText(errno), true);
      return;
    }
    c.events = want;
  }
}

void TcpStoreServer::Impl::onClientEvent(uint64_t id, uint32_t events) {
  Client* c = find(id);
  if (c == nullptr) return;
  if (events & EPOLLERR) {
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(c->fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    drop(*c, "socket error: " + errnoText(err), false);
    return;
  }
  if (events & EPOLLOUT) {
    flush(*c);
    if (c->closed) return;
  }
  if (!c->busy() && (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP))) {
    readFrom(*c);
  } else if (events & (EPOLLHUP | EPOLLRDHUP)) {
    // Busy (a parked request or unsent output) and the peer has gone: nobody will read
    // the answer.
    drop(*c, "peer closed the connection while a request was pending", false);
    return;
  }
  if (c->closed) return;
  if (!c->busy()) processFrames(*c);
  updateInterest(*c);
}

void TcpStoreServer::Impl::readFrom(Client& c) {
  size_t budget = kReadBudget;
  while (!c.closed && !c.busy() && budget > 0) {
    // Before HELLO, read no further than the largest legal HELLO: an unauthenticated peer
    // never makes the server hold more than a few KiB for it.
    size_t want = kReadChunk;
    if (!c.authenticated) {
      const size_t limit = kFrameHeaderBytes + kMaxHelloFrameBytes;
      const size_t held = c.in.size() - c.in_start;
      want = held >= limit ? 0 : limit - held;
      if (want == 0) return;  // processFrames has rejected or consumed it by now
    }
    want = std::min(want, budget);
    const size_t old_size = c.in.size();
    c.in.resize(old_size + want);
    const ssize_t n = ::recv(c.fd.get(), c.in.data() + old_size, want, 0);
    c.in.resize(old_size + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n == 0) {
      const size_t held = c.in.size() - c.in_start;
      if (held > 0) {
        drop(c,
             "connection closed in the middle of a frame (" + std::to_string(held) +
                 " byte(s) of a truncated frame)",
             true);
      } else if (!c.authenticated) {
        drop(c, "connection closed before HELLO", true);
      } else {
        drop(c, "peer closed the connection", false);
      }
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      drop(c, "receive failed: " + errnoText(errno), false);
      return;
    }
    budget -= static_cast<size_t>(n);
    counters_.bytes_in.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    processFrames(c);
  }
}

void TcpStoreServer::Impl::processFrames(Client& c) {
  while (!c.closed && !c.busy()) {
    const std::span<const uint8_t> held(c.in.data() + c.in_start, c.in.size() - c.in_start);
    try {
      if (!c.authenticated && held.size() > kFrameHeaderBytes &&
          held[kFrameHeaderBytes] != static_cast<uint8_t>(Command::kHello)) {
        throw ProtocolError("the first message is not HELLO (tag " +
                            std::to_string(held[kFrameHeaderBytes]) + ")");
      }
      const size_t size = frameSize(held, c.authenticated ? kMaxFrameBytes : kMaxHelloFrameBytes);
      if (size == 0) break;
      Request request = parseRequest(held.first(size));
      c.in_start += size;
      handle(c, std::move(request));
    } catch (const ProtocolError& e) {
      drop(c, e.what(), true);
      return;
    }
  }
  if (c.closed) return;
  if (c.in_start == c.in.size()) {
    c.in_start = 0;
    if (c.in.capacity() > kKeepBufferBytes) {
      Bytes().swap(c.in);
    } else {
      c.in.clear();
    }
  } else if (c.in_start > 0) {
    // What is left is less than one frame; move it to the front.
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_start));
    c.in_start = 0;
  }
}

void TcpStoreServer::Impl::reply(Client& c, Command answered, const Response& response) {
  if (c.closed) return;
  const Bytes frame = encodeResponse(answered, response);
  if (c.out_start == c.out.size()) {
    c.out.clear();
    c.out_start = 0;
  }
  c.out.insert(c.out.end(), frame.begin(), frame.end());
  flush(c);
  updateInterest(c);
}

void TcpStoreServer::Impl::flush(Client& c) {
  while (c.out_start < c.out.size()) {
    const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.out_start, c.out.size() - c.out_start, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_start += static_cast<size_t>(n);
      counters_.bytes_out.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c, "send failed: " + errnoText(errno), false);
    return;
  }
  c.out_start = 0;
  if (c.out.capacity() > kKeepBufferBytes) {
    Bytes().swap(c.out);
  } else {
    c.out.clear();
  }
}

}  // namespace railshard::launcher
