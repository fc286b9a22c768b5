#pragma once

// Internals of TcpStoreServer shared by its implementation files: tcp_store_server.cc (set-up,
// the epoll loop), tcp_store_server_io.cc (connections, frames in and responses out) and
// tcp_store_server_requests.cc (requests, parked GETs and WAITs, timers). Not part of the
// interface.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "launcher/store_protocol.h"
#include "launcher/tcp_store_server.h"
#include "transport/links/tcp/socket.h"

namespace railshard::launcher {

// epoll user data for the two fixed descriptors; clients get ids from kFirstClientId up.
constexpr uint64_t kStopId = 0;
constexpr uint64_t kListenId = 1;
constexpr uint64_t kFirstClientId = 2;

class TcpStoreServer::Impl {
 public:
  using Fd = transport::links::tcp::Fd;
  using SockAddr = transport::links::tcp::SockAddr;

  Impl(Fd listen_fd, std::string token, TcpStoreServerOptions options);
  ~Impl();

  const SockAddr& address() const { return address_; }
  StoreStats stats() const;

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
  bool tryControl(int op, int fd, uint64_t id, uint32_t events);
  // For the two fixed descriptors, without which the server cannot run at all.
  void control(int op, int fd, uint64_t id, uint32_t events);
  void run();
  int nextTimeoutMs() const;

  // --- connections ---------------------------------------------------------------------

  void acceptAll();
  Client* find(uint64_t id);
  // Closes the connection now; the Client object is freed at the end of the loop iteration
  // so that ids still held in this iteration's event list resolve to nothing.
  void drop(Client& c, const std::string& reason, bool warn);
  void reap();
  // Reads only while the client is idle, writes only while output is pending. Watching
  // EPOLLIN on a busy client would make level-triggered epoll report it forever.
  void updateInterest(Client& c);
  void onClientEvent(uint64_t id, uint32_t events);
  void readFrom(Client& c);
  // Handles every complete frame buffered for `c`, stopping when it becomes busy.
  void processFrames(Client& c);
  // Queues a response and sends as much as the socket takes now.
  void reply(Client& c, Command answered, const Response& response);
  void flush(Client& c);

  // --- requests ------------------------------------------------------------------------

  void handle(Client& c, Request request);
  void countRequest(const Request& request);
  // What an entry counts against max_data_bytes: its bytes plus a fixed overhead, so that
  // millions of empty keys count too.
  static size_t entryBytes(const std::string& key, const Bytes& value);
  // Sets key to value, unless that would take the store past max_data_bytes
  // (InvalidArgument, nothing changed).
  void store(const std::string& key, Bytes value);
  void replyError(Client& c, Command answered, const Error& e);
  // Index of the first key of `request` that is not in the store; keys.size() when all are.
  size_t firstMissing(const Request& request) const;
  // Answers a GET/WAIT whose keys all exist, else parks it on its first missing key. A
  // parked client sits in exactly one waiter set: when that key appears it is re-evaluated
  // and either answered or moved on to its next missing key, so a WAIT for 1024 keys costs
  // one set entry, not 1024. `fresh` is false on re-evaluation, which keeps the original
  // deadline's timer.
  void evaluate(Client& c, Request request, bool fresh);
  void unpark(Client& c);
  void replyTimeout(Client& c, const Request& request);
  // Re-evaluates every client parked on `key`, which a SET or ADD has just written.
  void keyAppeared(const std::string& key);

  // --- timers --------------------------------------------------------------------------

  void setTimer(Client& c, Deadline deadline);
  void clearTimer(Client& c);
  void fireTimers();
  // Clients that became idle outside their own event (answered after a SET from someone
  // else, or by a timer) may have further requests buffered: run them now, iteratively, so
  // a chain of SETs waking waiters never recurses.
  void drainReady();

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
  // Written by the server thread only, read by stats() from any thread.
  struct Counters {
    std::atomic<uint64_t> sets{0}, gets{0}, adds{0}, waits{0}, removes{0}, keys_waited{0},
        bytes_in{0}, bytes_out{0}, connections{0}, cpu_ns{0};
  };
  Counters counters_;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace railshard::launcher
