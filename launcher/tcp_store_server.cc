#include "launcher/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "base/memory_store.h"
#include "launcher/store_protocol.h"

namespace railshard::launcher {

using transport::links::tcp::errnoText;
using transport::links::tcp::Fd;
using transport::links::tcp::SockAddr;

namespace {

// epoll user data for the two fixed descriptors; clients get ids from kFirstClientId up.
constexpr uint64_t kStopId = 0;
constexpr uint64_t kListenId = 1;
constexpr uint64_t kFirstClientId = 2;

// Per readable event: bytes read from one client before moving on to the others, so one
// client streaming a 64 MiB value cannot starve the rest.
constexpr size_t kReadBudget = 4 * 1024 * 1024;
constexpr size_t kReadChunk = 256 * 1024;
// A read buffer that grew for a large value is released once it is empty again.
constexpr size_t kKeepBufferBytes = 1024 * 1024;
// How long to stop accepting after running out of descriptors: the listening socket stays
// readable, so retrying at once would spin.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string text;
  const size_t shown = std::min<size_t>(keys.size(), 8);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) text += ", ";
    text += "'" + keys[i] + "'";
  }
  if (keys.size() > shown) text += " and " + std::to_string(keys.size() - shown) + " more";
  return text;
}

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(Fd listen_fd, std::string token, TcpStoreServerOptions options)
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

  ~Impl() {
    const uint64_t one = 1;
    // The eventfd counter cannot overflow from a single write; ignore the impossible failure.
    [[maybe_unused]] const ssize_t n = ::write(stop_.get(), &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    // Members close every socket as they are destroyed.
  }

  const SockAddr& address() const { return address_; }

 private:
  using Timers = std::multimap<Deadline, uint64_t>;

  struct Client {
    uint64_t id = 0;
    Fd fd;
    std::string peer;
    bool authenticated = false;
    bool closed = false;
    uint32_t events = 0;  // current epoll interest
    Bytes in;
    size_t in_start = 0;
    Bytes out;
    size_t out_start = 0;
    // A GET or WAIT waiting for a key; while set, the client's later frames stay unread, so
    // responses go out in request order and the buffers stay bounded.
    std::optional<Request> parked;
    std::string parked_on;  // the missing key whose waiter set holds this client
    std::optional<Timers::iterator> timer;

    bool busy() const { return parked.has_value() || out_start < out.size(); }
  };

  // False (errno set) when epoll refuses, e.g. ENOMEM or the max_user_watches limit.
  bool tryControl(int op, int fd, uint64_t id, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    return ::epoll_ctl(epoll_.get(), op, fd, &ev) == 0;
  }

  // For the two fixed descriptors, without which the server cannot run at all.
  void control(int op, int fd, uint64_t id, uint32_t events) {
    if (!tryControl(op, fd, id, events)) {
      throw Error("store server: epoll_ctl: " + errnoText(errno));
    }
  }

  void run() {
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
      }
    } catch (const std::exception& e) {
      // Only a failing epoll_ctl or allocation gets here; per-client trouble is handled
      // per client. Stop serving rather than take the process down.
      RS_LOG_ERROR("store server on {}: stopped: {}", address_.toString(), e.what());
    }
  }

  int nextTimeoutMs() const {
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

  // --- connections ---------------------------------------------------------------------

  void acceptAll() {
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

  Client* find(uint64_t id) {
    const auto it = clients_.find(id);
    return it == clients_.end() || it->second->closed ? nullptr : it->second.get();
  }

  // Closes the connection now; the Client object is freed at the end of the loop iteration
  // so that ids still held in this iteration's event list resolve to nothing.
  void drop(Client& c, const std::string& reason, bool warn) {
    if (c.closed) return;
    if (warn) {
      RS_LOG_WARN("store server on {}: closing connection from {}: {}", address_.toString(), c.peer,
                  reason);
    } else {
      RS_LOG_DEBUG("store server on {}: closing connection from {}: {}", address_.toString(),
                   c.peer, reason);
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

  void reap() {
    for (const uint64_t id : dead_) clients_.erase(id);
    dead_.clear();
  }

  // Reads only while the client is idle, writes only while output is pending. Watching
  // EPOLLIN on a busy client would make level-triggered epoll report it forever.
  void updateInterest(Client& c) {
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

  void onClientEvent(uint64_t id, uint32_t events) {
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

  void readFrom(Client& c) {
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
      processFrames(c);
    }
  }

  // Handles every complete frame buffered for `c`, stopping when it becomes busy.
  void processFrames(Client& c) {
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

  // Queues a response and sends as much as the socket takes now.
  void reply(Client& c, Command answered, const Response& response) {
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

  void flush(Client& c) {
    while (c.out_start < c.out.size()) {
      const ssize_t n =
          ::send(c.fd.get(), c.out.data() + c.out_start, c.out.size() - c.out_start, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_start += static_cast<size_t>(n);
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

  // --- requests ------------------------------------------------------------------------

  void handle(Client& c, Request request) {
    if (!c.authenticated) {
      // processFrames guarantees the tag; the token decides.
      if (!tokensEqual(request.token, token_)) {
        throw ProtocolError("wrong token in HELLO");
      }
      c.authenticated = true;
      unauthenticated_.erase(c.id);
      clearTimer(c);
      reply(c, Command::kHello, Response{});
      return;
    }
    switch (request.command) {
      case Command::kHello:
        throw ProtocolError("HELLO sent twice");
      case Command::kSet: {
        const std::string key = request.keys[0];
        try {
          store(key, std::move(request.value));
        } catch (const Error& e) {
          replyError(c, Command::kSet, e);
          return;
        }
        reply(c, Command::kSet, Response{});
        keyAppeared(key);
        return;
      }
      case Command::kGet: {
        const auto it = data_.find(request.keys[0]);
        if (it != data_.end()) {
          Response response;
          response.value = it->second;
          reply(c, Command::kGet, response);
          return;
        }
        evaluate(c, std::move(request), true);
        return;
      }
      case Command::kAdd: {
        const std::string& key = request.keys[0];
        Response response;
        try {
          const auto it = data_.find(key);
          const int64_t current = it == data_.end() ? 0 : decodeCounter(key, it->second);
          int64_t sum = 0;
          if (__builtin_add_overflow(current, request.delta, &sum)) {
            throw InvalidArgument("store add: key '" + key + "' holds " + std::to_string(current) +
                                  "; adding " + std::to_string(request.delta) + " overflows int64");
          }
          store(key, encodeCounter(sum));
          response.number = sum;
        } catch (const Error& e) {
          replyError(c, Command::kAdd, e);
          return;
        }
        reply(c, Command::kAdd, response);
        keyAppeared(key);
        return;
      }
      case Command::kWait:
        evaluate(c, std::move(request), true);
        return;
      case Command::kRemove: {
        Response response;
        const auto it = data_.find(request.keys[0]);
        if (it != data_.end()) {
          data_bytes_ -= entryBytes(it->first, it->second);
          data_.erase(it);
          response.existed = true;
        }
        reply(c, Command::kRemove, response);
        return;
      }
    }
  }

  // What an entry counts against max_data_bytes: its bytes plus a fixed overhead, so that
  // millions of empty keys count too.
  static size_t entryBytes(const std::string& key, const Bytes& value) {
    return key.size() + value.size() + 64;
  }

  // Sets key to value, unless that would take the store past max_data_bytes
  // (InvalidArgument, nothing changed).
  void store(const std::string& key, Bytes value) {
    const auto it = data_.find(key);
    const size_t old_bytes = it == data_.end() ? 0 : entryBytes(key, it->second);
    const size_t new_bytes = entryBytes(key, value);
    const size_t total = data_bytes_ - old_bytes + new_bytes;
    if (total > options_.max_data_bytes) {
      throw InvalidArgument("store server: setting key '" + key.substr(0, 256) + "' to " +
                            std::to_string(value.size()) + " bytes would make the store hold " +
                            std::to_string(total) + " bytes, over its limit of " +
                            std::to_string(options_.max_data_bytes));
    }
    if (it == data_.end()) {
      data_.emplace(key, std::move(value));
    } else {
      it->second = std::move(value);
    }
    data_bytes_ = total;
  }

  void replyError(Client& c, Command answered, const Error& e) {
    Response response;
    response.status = Status::kError;
    response.error_kind = kindOf(e);
    response.message = e.what();
    reply(c, answered, response);
  }

  // Index of the first key of `request` that is not in the store; keys.size() when all are.
  size_t firstMissing(const Request& request) const {
    size_t i = 0;
    while (i < request.keys.size() && data_.count(request.keys[i]) > 0) ++i;
    return i;
  }

  // Answers a GET/WAIT whose keys all exist, else parks it on its first missing key. A
  // parked client sits in exactly one waiter set: when that key appears it is re-evaluated
  // and either answered or moved on to its next missing key, so a WAIT for 1024 keys costs
  // one set entry, not 1024. `fresh` is false on re-evaluation, which keeps the original
  // deadline's timer.
  void evaluate(Client& c, Request request, bool fresh) {
    const size_t missing = firstMissing(request);
    if (missing == request.keys.size()) {
      clearTimer(c);
      Response response;
      if (request.command == Command::kGet) response.value = data_.at(request.keys[0]);
      reply(c, request.command, response);
      return;
    }
    if (fresh && request.timeout_ms == 0) {
      replyTimeout(c, request);
      return;
    }
    const std::string& key = request.keys[missing];
    waiters_[key].insert(c.id);
    c.parked_on = key;
    if (fresh) setTimer(c, Clock::now() + std::chrono::milliseconds(request.timeout_ms));
    c.parked = std::move(request);
    updateInterest(c);
  }

  void unpark(Client& c) {
    if (!c.parked) return;
    const auto it = waiters_.find(c.parked_on);
    if (it != waiters_.end()) {
      it->second.erase(c.id);
      if (it->second.empty()) waiters_.erase(it);
    }
    c.parked.reset();
    c.parked_on.clear();
    clearTimer(c);
  }

  void replyTimeout(Client& c, const Request& request) {
    std::vector<std::string> missing;
    for (const auto& key : request.keys) {
      if (data_.count(key) == 0) missing.push_back(key);
    }
    Response response;
    response.status = Status::kTimeout;
    response.message = (missing.size() == 1 ? "key " : "keys ") + quoteKeys(missing) +
                       " not set within " + std::to_string(request.timeout_ms) + " ms";
    reply(c, request.command, response);
  }

  // Re-evaluates every client parked on `key`, which a SET or ADD has just written.
  void keyAppeared(const std::string& key) {
    const auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    const std::unordered_set<uint64_t> ids = std::move(it->second);
    waiters_.erase(it);
    for (const uint64_t id : ids) {
      Client* c = find(id);
      if (c == nullptr || !c->parked) continue;
      Request request = std::move(*c->parked);
      c->parked.reset();
      c->parked_on.clear();
      evaluate(*c, std::move(request), false);
      if (!c->closed && !c->busy()) ready_.push_back(id);
    }
  }

  // --- timers --------------------------------------------------------------------------

  void setTimer(Client& c, Deadline deadline) {
    clearTimer(c);
    c.timer = timers_.emplace(deadline, c.id);
  }

  void clearTimer(Client& c) {
    if (c.timer) {
      timers_.erase(*c.timer);
      c.timer.reset();
    }
  }

  void fireTimers() {
    const Deadline now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      const uint64_t id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      Client* c = find(id);
      if (c == nullptr) continue;
      c->timer.reset();
      if (!c->authenticated) {
        drop(*c,
             "no HELLO within " +
                 std::to_string(
                     std::chrono::duration_cast<std::chrono::milliseconds>(options_.hello_timeout)
                         .count()) +
                 " ms",
             true);
        continue;
      }
      if (c->parked) {
        const Request request = std::move(*c->parked);
        unpark(*c);
        replyTimeout(*c, request);
        if (!c->closed && !c->busy()) ready_.push_back(id);
      }
    }
    if (accept_paused_until_ && *accept_paused_until_ <= now) {
      accept_paused_until_.reset();
      control(EPOLL_CTL_MOD, listen_.get(), kListenId, EPOLLIN);
    }
  }

  // Clients that became idle outside their own event (answered after a SET from someone
  // else, or by a timer) may have further requests buffered: run them now, iteratively, so
  // a chain of SETs waking waiters never recurses.
  void drainReady() {
    while (!ready_.empty()) {
      std::vector<uint64_t> batch;
      batch.swap(ready_);
      for (const uint64_t id : batch) {
        Client* c = find(id);
        if (c == nullptr) continue;
        processFrames(*c);
        updateInterest(*c);
      }
    }
  }

  Fd listen_;
  std::string token_;
  TcpStoreServerOptions options_;
  SockAddr address_;
  Fd epoll_;
  Fd stop_;

  // Owned by the server thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Client>> clients_;
  std::unordered_map<std::string, Bytes> data_;
  size_t data_bytes_ = 0;               // entryBytes() over data_
  std::set<uint64_t> unauthenticated_;  // ids of connections before HELLO, oldest first
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters_;
  Timers timers_;
  std::vector<uint64_t> ready_;
  std::vector<uint64_t> dead_;
  std::optional<Deadline> accept_paused_until_;
  uint64_t next_id_ = kFirstClientId;

  std::thread thread_;  // last: starts after every member above exists
};

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

TcpStoreServer::~TcpStoreServer() = default;

uint16_t TcpStoreServer::port() const {
  return impl_->address().port();
}

const SockAddr& TcpStoreServer::address() const {
  return impl_->address();
}

}  // namespace railshard::launcher
