// TcpStoreServer's requests (tcp_store_server_impl.h): what each command does to the stored
// data and its size limit, GETs and WAITs parked until their keys appear, and the timers.
#include <sys/epoll.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "base/memory_store.h"
#include "launcher/store_protocol.h"
#include "launcher/tcp_store_server_impl.h"

namespace railshard::launcher {

namespace {

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

void TcpStoreServer::Impl::handle(Client& c, Request request) {
  if (!c.authenticated) {
    // processFrames guarantees the tag; the token decides.
    if (!tokensEqual(request.token, token_)) {
      if (options_.on_wrong_token) options_.on_wrong_token(c.peer);
      throw ProtocolError("wrong token in HELLO");
    }
    c.authenticated = true;
    unauthenticated_.erase(c.id);
    clearTimer(c);
    reply(c, Command::kHello, Response{});
    return;
  }
  countRequest(request);
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

void TcpStoreServer::Impl::countRequest(const Request& request) {
  auto bump = [](std::atomic<uint64_t>& counter, uint64_t by = 1) {
    counter.fetch_add(by, std::memory_order_relaxed);
  };
  // Each request by key at trace level: which part of a start-up asks what, and how often.
  RS_LOG_TRACE("store server: {} {}{}", static_cast<int>(request.command),
               request.keys.empty() ? std::string() : request.keys.front(),
               request.keys.size() > 1 ? " (+" + std::to_string(request.keys.size() - 1) + ")"
                                       : std::string());
  switch (request.command) {
    case Command::kHello:
      return;
    case Command::kSet:
      return bump(counters_.sets);
    case Command::kGet:
      return bump(counters_.gets);
    case Command::kAdd:
      return bump(counters_.adds);
    case Command::kWait:
      bump(counters_.keys_waited, request.keys.size());
      return bump(counters_.waits);
    case Command::kRemove:
      return bump(counters_.removes);
  }
}

StoreStats TcpStoreServer::Impl::stats() const {
  auto read = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  StoreStats s;
  s.sets = read(counters_.sets);
  s.gets = read(counters_.gets);
  s.adds = read(counters_.adds);
  s.waits = read(counters_.waits);
  s.removes = read(counters_.removes);
  s.keys_waited = read(counters_.keys_waited);
  s.bytes_in = read(counters_.bytes_in);
  s.bytes_out = read(counters_.bytes_out);
  s.connections = read(counters_.connections);
  s.cpu_ns = read(counters_.cpu_ns);
  return s;
}

size_t TcpStoreServer::Impl::entryBytes(const std::string& key, const Bytes& value) {
  return key.size() + value.size() + 64;
}

void TcpStoreServer::Impl::store(const std::string& key, Bytes value) {
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

void TcpStoreServer::Impl::replyError(Client& c, Command answered, const Error& e) {
  Response response;
  response.status = Status::kError;
  response.error_kind = kindOf(e);
  response.message = e.what();
  reply(c, answered, response);
}

size_t TcpStoreServer::Impl::firstMissing(const Request& request) const {
  size_t i = 0;
  while (i < request.keys.size() && data_.count(request.keys[i]) > 0) ++i;
  return i;
}

void TcpStoreServer::Impl::evaluate(Client& c, Request request, bool fresh) {
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

void TcpStoreServer::Impl::unpark(Client& c) {
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

void TcpStoreServer::Impl::replyTimeout(Client& c, const Request& request) {
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

void TcpStoreServer::Impl::keyAppeared(const std::string& key) {
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

void TcpStoreServer::Impl::setTimer(Client& c, Deadline deadline) {
  clearTimer(c);
  c.timer = timers_.emplace(deadline, c.id);
}

void TcpStoreServer::Impl::clearTimer(Client& c) {
  if (c.timer) {
    timers_.erase(*c.timer);
    c.timer.reset();
  }
}

void TcpStoreServer::Impl::fireTimers() {
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

void TcpStoreServer::Impl::drainReady() {
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

}  // namespace railshard::launcher
