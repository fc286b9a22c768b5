#include "launcher/tcp_store.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"

namespace railshard::launcher {

namespace {

// Added to every call's deadline: a GET with timeout T is answered by the server at T at
// the latest, and the answer still has to cross the network.
constexpr auto kNetworkMargin = std::chrono::seconds(2);

uint32_t timeoutMs(Duration timeout) {
  if (timeout <= Duration::zero()) return 0;
  // Round up so that a sub-millisecond timeout still waits rather than failing at once.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
  return ms > std::numeric_limits<uint32_t>::max() ? std::numeric_limits<uint32_t>::max()
                                                   : static_cast<uint32_t>(ms);
}

std::string seconds(Duration d) {
  std::ostringstream text;
  text << std::setprecision(3) << std::chrono::duration<double>(d).count() << " s";
  return text.str();
}

std::string quote(const std::vector<std::string>& keys) {
  std::string text;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) text += (i > 0 ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) text += " and " + std::to_string(keys.size() - 8) + " more";
  return text;
}

// A deadline that cannot overflow for huge timeouts (Duration::max() means "forever").
Deadline safeDeadline(Duration timeout) {
  const auto far = std::chrono::hours(24 * 365);
  if (timeout > far) timeout = far;
  if (timeout < Duration::zero()) timeout = Duration::zero();
  return Clock::now() + timeout;
}

}  // namespace

TcpStore::TcpStore(std::string host_port, std::string token, Duration connect_timeout)
    : host_port_(std::move(host_port)), token_(std::move(token)) {
  if (token_.size() > kMaxTokenBytes) {
    throw InvalidArgument("store: token of " + std::to_string(token_.size()) +
                          " bytes exceeds the limit of " + std::to_string(kMaxTokenBytes));
  }
  addr_ = transport::links::tcp::resolve(host_port_, "store address");
  // No other thread can see this object yet: no turn to take.
  connectLocked(safeDeadline(connect_timeout));
}

void TcpStore::connectLocked(Deadline deadline) {
  const std::string what = "store at " + host_port_;
  transport::links::tcp::Fd fd = transport::links::tcp::connectWithRetry(addr_, deadline, what);
  fd_ = std::move(fd);
  Request hello;
  hello.command = Command::kHello;
  hello.token = token_;
  // The connect may have used up the deadline; the handshake still deserves a round trip.
  const Deadline hello_deadline = std::max(deadline, Clock::now() + kNetworkMargin);
  exchangeLocked(hello, hello_deadline, "handshake");
  RS_LOG_DEBUG("store: connected to {}", host_port_);
}

Response TcpStore::exchangeLocked(const Request& request, Deadline deadline,
                                  const std::string& what) {
  const Bytes frame = encodeRequest(request);  // InvalidArgument before touching the socket
  const std::string where = "store at " + host_port_;
  try {
    transport::links::tcp::sendAll(fd_.get(), frame.data(), frame.size(), deadline, where);
    uint8_t header[kFrameHeaderBytes];
    transport::links::tcp::recvAll(fd_.get(), header, sizeof(header), deadline, where);
    // Validated before allocating: a confused peer cannot make us reserve 4 GiB.
    const uint32_t length = frameLength(std::span<const uint8_t>(header, sizeof(header)));
    Bytes response(kFrameHeaderBytes + length);
    std::copy(header, header + kFrameHeaderBytes, response.begin());
    transport::links::tcp::recvAll(fd_.get(), response.data() + kFrameHeaderBytes, length, deadline,
                                   where);
    return parseResponse(request.command, response);
  } catch (const PeerLostError& e) {
    fd_.reset();
    throw PeerLostError(where +
                        " closed the connection — wrong RAILSHARD_TOKEN or the store host "
                        "exited? (during " +
                        what + "; " + e.what() + ")");
  } catch (const TimeoutError&) {
    fd_.reset();
    throw TimeoutError(where + " did not answer " + what + " in time");
  } catch (const ProtocolError& e) {
    fd_.reset();
    throw ProtocolError(where + " sent a malformed answer to " + what + ": " + e.what());
  }
}

Response TcpStore::call(const Request& request, Duration timeout, const std::string& what) {
  const Deadline deadline = safeDeadline(timeout) + kNetworkMargin;
  {
    std::unique_lock<std::mutex> lock(turn_mutex_);
    if (!turn_free_.wait_until(lock, deadline, [&] { return !turn_taken_; })) {
      throw TimeoutError("store at " + host_port_ + ": " + what + " timed out after " +
                         seconds(timeout) +
                         " waiting for another request on the same client to finish");
    }
    turn_taken_ = true;
  }
  struct ReleaseTurn {
    TcpStore* store;
    ~ReleaseTurn() {
      {
        std::lock_guard<std::mutex> lock(store->turn_mutex_);
        store->turn_taken_ = false;
      }
      store->turn_free_.notify_one();
    }
  } release{this};
  if (!fd_.valid()) connectLocked(deadline);
  Response response = exchangeLocked(request, deadline, what);
  switch (response.status) {
    case Status::kOk:
      return response;
    case Status::kTimeout:
      throw TimeoutError("store at " + host_port_ + ": " + what + " timed out after " +
                         seconds(timeout) + " (" + response.message + ")");
    case Status::kError:
      throwError(response.error_kind, "store at " + host_port_ + ": " + response.message);
  }
  throw ProtocolError("store at " + host_port_ + ": unknown status in answer to " + what);
}

void TcpStore::set(const std::string& key, const Bytes& value, Duration timeout) {
  Request request;
  request.command = Command::kSet;
  request.keys = {key};
  request.value = value;
  call(request, timeout, "set of key '" + key + "'");
}

Store::Bytes TcpStore::get(const std::string& key, Duration timeout) {
  Request request;
  request.command = Command::kGet;
  request.keys = {key};
  request.timeout_ms = timeoutMs(timeout);
  return std::move(call(request, timeout, "get of key '" + key + "'").value);
}

int64_t TcpStore::add(const std::string& key, int64_t delta, Duration timeout) {
  Request request;
  request.command = Command::kAdd;
  request.keys = {key};
  request.delta = delta;
  return call(request, timeout, "add to key '" + key + "'").number;
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  Request request;
  request.command = Command::kWait;
  request.keys = keys;
  request.timeout_ms = timeoutMs(timeout);
  call(request, timeout,
       "wait for " + std::string(keys.size() == 1 ? "key " : "keys ") + quote(keys));
}

bool TcpStore::remove(const std::string& key, Duration timeout) {
  Request request;
  request.command = Command::kRemove;
  request.keys = {key};
  return call(request, timeout, "remove of key '" + key + "'").existed;
}

}  // namespace railshard::launcher
