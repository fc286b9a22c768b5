#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/config.h"
#include "core/base/store.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace railshard::transport::tcp {

// Full mesh of TCP connections, one per peer, driven by one progress thread per transport
// (epoll; no thread per peer). Sends are written straight from the caller's buffer (writev of
// header + payload) and receives land straight in the posted buffer, so large messages are
// not copied in user space; only a message that arrives before its receive is posted is
// staged. Waiters block on a condition variable, so more ranks than cores is fine.
class TcpTransport : public Transport {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::string token;           // job token demanded in every hello
    std::string advertise_host;  // address peers connect to (IPv4/IPv6 literal or name)
    std::string key_prefix;      // store namespace of this communicator
    Duration connect_timeout = std::chrono::seconds(60);
    Duration spin = std::chrono::microseconds(2000);  // poll before sleeping in wait()
    TagFormatter formatter;
  };

  // Listens, publishes the address through `store`, connects to every peer, and starts the
  // progress thread. TimeoutError names the ranks that never showed up.
  static std::unique_ptr<TcpTransport> create(Store& store, Options options);
  ~TcpTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string name() const override { return "tcp"; }
  RequestPtr isend(int peer, const void* data, size_t bytes, const MessageTag& tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, const MessageTag& tag) override;
  void wait(const RequestPtr& request, Deadline deadline) override;
  void abort(std::exception_ptr error, bool tell_peers) override;
  void checkHealthy() const override;

  // Bytes written to / read from all sockets (headers included), for tests and benchmarks.
  uint64_t bytesSent() const { return bytes_sent_.load(); }
  uint64_t bytesReceived() const { return bytes_received_.load(); }

 private:
  struct SendOp;
  struct RecvOp;
  struct Staged;
  struct Peer;

  explicit TcpTransport(Options options);
  void connectMesh(Store& store);
  void progressLoop();
  void handleReadable(Peer& peer);
  void handleWritable(Peer& peer);
  // Writes queued frames until the socket would block; caller holds peer.mutex.
  void flushSendsLocked(Peer& peer);
  void setWriteInterest(Peer& peer, bool on);
  void onHeader(Peer& peer);
  void onPayloadComplete(Peer& peer);
  void onConnectionLost(Peer& peer, const std::string& reason);
  void completeRequest(Request& request);
  bool checkMatch(Peer& peer, const MessageTag& expected, size_t expected_bytes,
                  const MessageTag& got, size_t got_bytes);
  void fail(std::exception_ptr error, bool tell_peers);
  void detachUserMemory();
  void drainAfterFailure(Peer& peer);
  [[noreturn]] void rethrowAfterQuiesce() const;
  void queueAbortFrames(ErrorKind kind, const std::string& message);
  void sendByes();
  void wake();
  std::string describe(const MessageTag& tag) const;
  std::string peerName(int peer) const;

  Options options_;
  Fd listen_fd_;
  Fd epoll_fd_;
  Fd wake_fd_;
  std::vector<std::unique_ptr<Peer>> peers_;  // indexed by rank; null for self
  std::thread progress_;
  std::atomic<bool> closing_{false};   // destructor running: a peer leaving is expected
  std::atomic<bool> stopping_{false};  // progress thread must exit

  // Completion and failure signalling to waiters.
  mutable std::mutex state_mutex_;
  std::condition_variable state_changed_;
  std::atomic<int> waiters_{0};
  bool failing_ = false;             // guarded by state_mutex_: the first fail() wins
  std::atomic<bool> failed_{false};  // published once user memory is detached
  std::atomic<bool> reader_quiesced_{false};
  std::exception_ptr error_;  // guarded by state_mutex_

  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace railshard::transport::tcp
