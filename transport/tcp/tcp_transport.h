#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/store.h"
#include "transport/messaging/current_collective.h"
#include "transport/messaging/piece_link.h"
#include "transport/tcp/frame.h"
#include "transport/links/tcp/socket.h"
#include "transport/transport.h"

namespace railshard::transport::tcp {

// One network link between this rank's host and a peer's: the pair of addresses on a shared
// subnet (topology::Rail seen from this rank).
struct RailSpec {
  std::string name;            // for logs and RailStatus: the local interface, "rail0"
  std::string local_address;   // this rank's IP on the rail (bound as the source)
  std::string remote_address;  // the peer's IP on the rail
  double gbps = 0;             // starting estimate (probed or nominal); 0 = unknown
};

// Full mesh of TCP connections driven by one progress thread per transport (epoll; no thread
// per peer). Between two hosts joined by several rails there is one connection per rail (or
// RAILSHARD_SOCKETS_PER_RAIL), and every message is striped over them by a RailScheduler in
// proportion to each connection's measured rate; otherwise one connection per peer.
//
// Sends are written straight from the caller's buffer (writev of header + payload) and
// receives land straight in the posted buffer, so large messages are not copied in user
// space; only a message that arrives before its receive is posted is staged. Waiters block on
// a condition variable, so more ranks than cores is fine.
//
// Rails fail independently: over several connections every data frame is kept (large pieces
// by reference, the send completing when the peer acknowledges it; small ones as a copy) until
// the peer says it has consumed it. A connection that errors or stalls is taken out, both
// ranks exchange how much of it each consumed, and everything after that is re-sent on the
// others; the connecting rank then reconnects it in the background and it is re-admitted.
class TcpTransport : public Transport, public messaging::PieceLink {
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
    // Rails to each peer, indexed by rank (missing or empty: one connection to the peer's
    // advertised address). Both ranks of a pair must list the same rails.
    std::vector<std::vector<RailSpec>> peer_rails;
    int sockets_per_rail = 1;
    RailWeights rail_weights = RailWeights::kAdaptive;
    Duration rail_timeout = std::chrono::seconds(2);
    Duration rejoin_interval = std::chrono::seconds(1);  // between reconnection attempts
    // A peer heard nothing from for this long is lost (stopped process, stuck host); the
    // progress thread pings every peer every fifth of it. Zero: no heartbeat.
    Duration heartbeat_timeout = std::chrono::seconds(10);
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
  std::vector<RailStatus> rails() const override;
  std::vector<LostPeer> lostPeers() const override;
  int awaitArrival(const std::vector<int>& peers,
                   const std::function<bool(const MessageTag&)>& accept,
                   Deadline deadline) override;
  void enterCollective(const MessageTag& tag) override;
  void setTimeoutExplainer(std::function<std::string(const MessageTag&)> explain) override {
    timeout_explainer_ = std::move(explain);
  }
  void setFailureListener(std::function<void(ErrorKind, const std::string&)> listener) override {
    std::lock_guard<std::mutex> lock(listener_mutex_);
    failure_listener_ = std::move(listener);
  }
  void setTraceRank(int world_rank) override { trace_rank_.store(world_rank); }

  // messaging::PieceLink (tcp_transport_pieces.cc): another layer's pieces over these
  // connections, in kPiece frames that take the same path as this transport's own data.
  void setPieceSink(messaging::PieceSink* sink) override;
  RequestPtr sendPiece(int peer, const messaging::PieceInfo& piece, const void* data) override;
  double pieceGbps(int peer) const override;
  uint64_t pieceBytesSent(int peer) const override;

  // Tests: breaks connection `channel` to `peer` as a failing NIC would (shutdown of the
  // socket), so that the failover path runs without root.
  void breakConnectionForTesting(int peer, int channel);
  // Tests: runs in the thread that starts failing the transport, after it claimed the failure
  // and before the failure is published to waiters, so that a test can hold that window open.
  void setFailHookForTesting(std::function<void()> hook) {
    fail_hook_for_testing_ = std::move(hook);
  }
  // Tests: while paused, the progress thread neither reads nor writes, so that a test can let
  // the kernel's socket state change (a peer's frames arrive, then its reset) before this
  // rank looks at it. Pausing returns once the progress thread has stopped.
  void pauseProgressForTesting(bool paused);

  // Bytes written to / read from all sockets (headers included), for tests and benchmarks.
  uint64_t bytesSent() const { return bytes_sent_.load(); }
  uint64_t bytesReceived() const { return bytes_received_.load(); }

 private:
  struct SendOp;
  struct Segment;
  struct Channel;
  struct Peer;
  struct Listener;
  struct Rejoined;

  explicit TcpTransport(Options options);
  // tcp_transport_connect.cc
  void connectMesh(Store& store);
  void addChannel(int peer_rank, int index, int count, int rail_index, Fd fd,
                  const std::string& remote);
  void registerChannel(Peer& peer, Channel& channel);
  void sizeSendBufferLocked(Peer& peer, Channel& channel);
  // tcp_transport.cc: posting, progress and writing
  // Queues a message (kData: this transport's, numbered by its book) or another layer's
  // piece (kPiece: `message` given) over the peer's connections. Null when the peer is lost
  // (the transport is then failed).
  std::shared_ptr<SendOp> post(int peer, FrameKind kind, std::optional<uint64_t> message,
                               const messaging::PieceInfo& what, const void* data);
  void progressLoop();
  void handleWritable(Peer& peer, Channel& channel);
  // Writes queued frames until the socket would block; caller holds peer.mutex.
  void flushSendsLocked(Peer& peer, Channel& channel);
  // Writes until the socket would block (false) or the queue is empty (true).
  bool writeQueuedLocked(Peer& peer, Channel& channel);
  void markBusyLocked(Channel& channel);
  void setWriteInterest(Channel& channel, bool on);
  void queueSegmentLocked(Peer& peer, Channel& channel, std::shared_ptr<Segment> segment);
  void queueControlLocked(Peer& peer, Channel& channel, FrameKind kind, uint64_t message,
                          uint64_t offset, uint64_t extra = 0);
  void onSegmentWrittenLocked(Peer& peer, Channel& channel, std::shared_ptr<Segment> segment);
  void releaseLocked(Segment& segment);
  void releaseByCopyLocked(Peer& peer, const SendOp& op);
  void completeRequest(Request& request);
  // Trace event (docs/tracing.md): one piece written to one rail.
  void traceRailLocked(const Peer& peer, Channel& channel, const Segment& segment);
  // tcp_transport_read.cc
  // Reads and parses what `channel` holds, up to a budget. `after_send_failure`: the
  // connection is already marked lost because a send to it failed; read what arrived before
  // that anyway (unbounded: a reset connection holds a bounded amount).
  void handleReadable(Peer& peer, Channel& channel, bool after_send_failure = false);
  void onHeader(Peer& peer, Channel& channel);
  void onPayloadComplete(Peer& peer, Channel& channel);
  void onAck(Peer& peer, Channel& channel, uint64_t consumed, uint64_t peer_clock_ns);
  void maybeAck(Peer& peer, Channel& channel);
  // tcp_transport_pieces.cc: a kPiece header (false: the transport failed) and its landing.
  bool onPieceHeader(Peer& peer, Channel& channel);
  void onPieceLanded(Peer& peer, const messaging::PieceInfo& piece, uint64_t bytes);
  // tcp_transport_rails.cc
  void railDown(Peer& peer, Channel& channel, const std::string& why);
  void onRailDownReport(Peer& peer, int channel, uint64_t consumed, uint16_t generation);
  void resendLocked(Peer& peer, Channel& channel, uint64_t consumed);
  void resendPieceLocked(Peer& peer, Segment& segment, uint64_t skip);
  bool stealForLocked(Peer& peer, Channel& idle);
  void sendRailReportsLocked(Peer& peer);
  void checkStalls();
  void keeperLoop();
  void installRejoined();
  std::string railsSummaryLocked(const Peer& peer) const;
  // tcp_transport_failure.cc
  // Whether another connection to `peer` is up, i.e. losing `channel` is a rail failure.
  static bool otherRailUpLocked(const Peer& peer, const Channel& channel);
  bool otherRailUp(Peer& peer, const Channel& channel);
  void onConnectionLost(Peer& peer, Channel& channel, const std::string& reason);
  // Pings every peer and declares lost one that has been silent past the heartbeat timeout.
  void checkHeartbeats();
  void recordLost(int peer, const std::string& reason);
  // Stops watching and closes the connection's socket; caller holds the peer's mutex.
  void closeChannelLocked(Channel& channel);
  // Puts the transport in the failed state (the first caller's error wins). Returns only once
  // the failure is published (failed_), whichever thread raised it, so that a caller's
  // checkHealthy() or rethrowAfterQuiesce() after it always raises.
  void fail(std::exception_ptr error, bool tell_peers);
  void detachUserMemory();
  void drainAfterFailure(Peer& peer, Channel& channel);
  [[noreturn]] void rethrowAfterQuiesce() const;
  // `lost_rank` (or -1) travels in the frame, so that every rank learns who was lost.
  void queueAbortFrames(ErrorKind kind, const std::string& message, int lost_rank);
  void sendByes();
  void wake();
  std::string describe(const MessageTag& tag) const;
  std::string peerName(int peer) const;

  Options options_;
  std::vector<std::unique_ptr<Listener>> listeners_;  // default + one per local rail address
  Fd epoll_fd_;
  Fd wake_fd_;
  std::vector<std::unique_ptr<Peer>> peers_;  // indexed by rank; null for self
  bool multi_rail_ = false;                   // some peer has several connections
  std::thread progress_;
  std::thread keeper_;  // re-connects rails that were taken out (multi-rail only)
  std::mutex rejoin_mutex_;
  std::vector<std::unique_ptr<Rejoined>> rejoined_;  // handed from keeper_ to progress_
  std::atomic<bool> closing_{false};   // destructor running: a peer leaving is expected
  std::atomic<bool> stopping_{false};  // progress thread must exit

  // Completion and failure signalling to waiters.
  mutable std::mutex state_mutex_;
  std::condition_variable state_changed_;
  std::atomic<int> waiters_{0};
  // Early messages begun so far (their first piece came before any receive): wakes
  // awaitArrival() without a lost wake-up (it waits for the count to move).
  std::atomic<uint64_t> arrivals_{0};
  bool failing_ = false;             // guarded by state_mutex_: the first fail() wins
  std::thread::id failing_thread_;   // guarded by state_mutex_: the one that won
  std::atomic<bool> failed_{false};  // published once user memory is detached
  std::atomic<bool> reader_quiesced_{false};
  std::exception_ptr error_;                                         // guarded by state_mutex_
  std::vector<LostPeer> lost_peers_;                                 // guarded by state_mutex_
  std::function<std::string(const MessageTag&)> timeout_explainer_;  // set before first use
  std::function<void()> fail_hook_for_testing_;                      // set before first use
  std::atomic<bool> progress_paused_for_testing_{false};
  std::atomic<bool> progress_parked_for_testing_{false};
  // The collective the user thread is in (enterCollective), read by the progress thread.
  messaging::CurrentCollective current_{options_.rank, &options_.formatter};
  std::mutex listener_mutex_;
  std::function<void(ErrorKind, const std::string&)> failure_listener_;
  Clock::time_point last_loop_{};  // progress thread only: its previous turn

  std::atomic<messaging::PieceSink*> piece_sink_{nullptr};
  std::atomic<int> sink_calls_{0};  // calls into piece_sink_ running now
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<int> trace_rank_{-1};  // world rank of this transport's trace events
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace railshard::transport::tcp
