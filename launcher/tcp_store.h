#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "base/store.h"
#include "launcher/store_protocol.h"
#include "transport/links/tcp/socket.h"

namespace railshard::launcher {

// Store client talking to a TcpStoreServer over one TCP connection. Thread-safe: calls from
// several threads are serialised (the protocol is strictly request/response).
//
// Errors name the store address and the key(s): TimeoutError when a key did not appear or
// the store did not answer in time, PeerLostError when the store closed the connection
// (wrong token, or the store host exited), InvalidArgument for oversized keys/values or an
// add() on a non-integer. After a failed call the connection is dropped and the next call
// connects again, since a late answer would otherwise be read as the answer to that call.
class TcpStore : public Store {
 public:
  // Connects to `host_port` ("host:port" or "[v6]:port"), retrying until `connect_timeout`
  // passes (the store may not be listening yet), and authenticates with `token`.
  TcpStore(std::string host_port, std::string token, Duration connect_timeout);
  ~TcpStore() override = default;

  void set(const std::string& key, const Bytes& value, Duration timeout) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta, Duration timeout) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool remove(const std::string& key, Duration timeout) override;

  const std::string& address() const { return host_port_; }

 private:
  // Sends `request`, returns the OK response; raises for every other outcome. `what` names
  // the operation for messages ("get of key 'x'").
  Response call(const Request& request, Duration timeout, const std::string& what);
  void connectLocked(Deadline deadline);
  Response exchangeLocked(const Request& request, Deadline deadline, const std::string& what);

  std::string host_port_;
  std::string token_;
  transport::links::tcp::SockAddr addr_;
  // One request on the connection at a time. A flag under a mutex rather than a
  // timed_mutex: waiting for the turn must honour the call's deadline, and a condition
  // variable does that on every toolchain (TSan in GCC 12 misreads timed_mutex locks).
  std::mutex turn_mutex_;
  std::condition_variable turn_free_;
  bool turn_taken_ = false;
  transport::links::tcp::Fd fd_;  // owned by the turn holder; invalid after a failed call
};

}  // namespace railshard::launcher
