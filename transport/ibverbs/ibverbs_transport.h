#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "transport/ibverbs/credit_window.h"
#include "transport/cuda_driver.h"
#include "transport/ibverbs/hca_discovery.h"
#include "transport/ibverbs/ibverbs_factory.h"
#include "transport/ibverbs/qp_params.h"
#include "transport/ibverbs/verbs_api.h"
#include "transport/ibverbs/wire_format.h"
#include "transport/messaging/current_collective.h"
#include "transport/messaging/message_book.h"
#include "transport/messaging/piece_link.h"
#include "transport/rails/rail_scheduler.h"

namespace railshard::transport::ibverbs {

// RDMA data plane: between two ranks one reliable-connected queue pair per HCA rail (a
// "lane"), messages striped over the lanes by the rail scheduler and cut into pieces of at
// most a slot. A piece is copied into a registered staging slot and written with one
// RDMA WRITE WITH IMMEDIATE into the same slot of the peer's pre-registered receive ring; the
// immediate names the slot, a 64-byte header in the slot names the message and offset. The
// receiver copies the piece into the posted receive buffer (or stages it when the receive is
// not posted yet, as the TCP transport does) and hands slots back in batches with zero-length
// writes whose immediate carries the credit count. No staged write targets user memory, so a
// failed collective cannot have a peer write into a buffer the caller already freed.
// Large host messages go by rendezvous instead (ibverbs_transport_rendezvous*.cc): one piece
// offers the sender's registered buffer, the receiver reads it in place; or the receiver
// grants its registered buffer and the sender writes into it. Either registration is dropped
// before any failure reaches the caller.
//
// The TCP transport it wraps ("control") stays connected: heartbeats, abort messages and lost
// peers go through it, so failures look the same on every transport, and pairs that do not use
// RDMA (same host in auto mode) send over it.
//
// NEVER RUN ON RDMA HARDWARE: this code was developed on machines without an HCA; its data path
// runs in the tests against an in-process software emulation of libibverbs
// (tests/fakes/fake_ibverbs.cc) and over Soft-RoCE in a qemu guest. See docs/rdma.md.
class IbverbsTransport : public Transport, private messaging::PieceSink {
 public:
  struct Rail;
  struct Lane;
  struct Peer;
  struct SendOp;
  struct RecvOp;
  struct OneSidedOp;
  struct TcpLanding;

  // Opens the rails and connects every RDMA pair (collective over all ranks).
  IbverbsTransport(Store& store, const VerbsApi& api, const FactoryOptions& options,
                   std::vector<HcaPort> ports, std::vector<bool> rdma_peers,
                   std::unique_ptr<Transport> control);
  ~IbverbsTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string name() const override { return "ibverbs"; }
  RequestPtr isend(int peer, const void* data, size_t bytes, const MessageTag& tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, const MessageTag& tag) override;
  void wait(const RequestPtr& request, Deadline deadline) override;
  void abort(std::exception_ptr error, bool tell_peers) override;
  void checkHealthy() const override;
  std::vector<RailStatus> rails() const override;
  // The control transport's lost peers, and the peers whose every RDMA lane failed (their TCP
  // connection may still be up, but no collective can reach them: shrink() leaves them out).
  std::vector<LostPeer> lostPeers() const override;
  // Peers on RDMA are looked at in this transport's books, the others in control_'s; polled
  // (a receive from any source is rare, and no arrival here wakes a sleeper).
  int awaitArrival(const std::vector<int>& peers,
                   const std::function<bool(const MessageTag&)>& accept,
                   Deadline deadline) override;
  void enterCollective(const MessageTag& tag) override;
  void setTimeoutExplainer(std::function<std::string(const MessageTag&)> explain) override;
  void setFailureListener(std::function<void(ErrorKind, const std::string&)> listener) override;
  void setTraceRank(int world_rank) override {
    trace_rank_.store(world_rank);
    control_->setTraceRank(world_rank);
  }

 private:
  // ibverbs_transport_connect.cc
  void openRails(const std::vector<HcaPort>& ports);
  void connectLanes(Store& store);
  void createQueuePair(Lane& lane);
  void moveToRts(Lane& lane);
  void postReceives(Lane& lane, int count);
  void teardown();
  // Before closing: lets the progress thread post the rendezvous ends and lane-down notices
  // still queued, and waits (at most a bound) for the posted work to complete.
  void drainEnds();
  // A lane's receive ring (registered for remote writes) and the fields of its record naming
  // it; its send side once the peer's record is known (the staging ring sized by it).
  void allocateReceiveRing(Lane& lane);
  void prepareSendSide(Lane& lane);
  // ibverbs_transport_data.cc
  // Cuts a send into pieces over the peer's rails that are up and queues it; PeerLostError
  // when none is.
  void planSendLocked(Peer& peer, const std::shared_ptr<SendOp>& op);
  void pumpLocked(Peer& peer);
  void postPieceLocked(Lane& lane, SendOp& op, size_t offset, size_t length, bool resend);
  void onPieceLocked(Lane& lane, uint32_t slot, uint32_t byte_len);
  // The book's verdict on an arriving piece (`resent`: after a failover; duplicates dropped
  // from then on); a problem poisons the transport and comes back with no entry.
  messaging::MessageBook::Arrival arriveLocked(Lane& lane, const messaging::PieceInfo& piece,
                                               bool resent);
  // `bytes` of a message landed where arrive() said (any link: a written piece, a whole
  // read, a TCP piece); completes its receive when that was the last, copying the staged
  // message in first. False after failLocked().
  bool landedLocked(Peer& peer, uint64_t message, messaging::Incoming& entry, uint64_t bytes);
  void returnCreditsLocked(Lane& lane, bool force);
  void completeLocked(const std::shared_ptr<Request>& request);
  // ibverbs_transport_rendezvous.cc: large host messages moved in place (zero-copy).
  // Whether `op` goes by rendezvous; if so registers its buffer and builds its one piece.
  bool prepareRendezvousLocked(Peer& peer, SendOp& op);
  // An offer arrived (`payload`: the piece's, from a lane's slot): a read descriptor, or an
  // empty write offer.
  void onRendezvousLocked(Lane& lane, const PieceHeader& header, const uint8_t* payload);
  // The receiver's side of an offer: its destination (the receive's buffer, a staging buffer,
  // a bounce buffer for device memory) registered with every rail; false after failLocked().
  bool registerDestinationLocked(Peer& peer, OneSidedOp& op, int access, const std::string& what);
  // Cuts `op` into one-sided pieces over the rails as the scheduler splits its bytes.
  void planOneSidedLocked(Peer& peer, OneSidedOp& op);
  // Posts the peer's pending reads (write = false) or rendezvous writes as far as they fit.
  void pumpOneSidedLocked(Peer& peer, bool write);
  void onOneSidedDoneLocked(Lane& lane, uint32_t slot, bool write);
  // kFin and kWritten writes, and lane-down notices.
  void pumpEndsLocked(Peer& peer);
  void onFinLocked(Peer& peer, uint32_t value);
  // ibverbs_transport_rendezvous_write.cc: the write rendezvous.
  // Names the registered destination of `op` to the sender (a grant piece, ahead of queued
  // sends) and waits for its kWrittens.
  void grantLocked(Peer& peer, const std::shared_ptr<OneSidedOp>& op, const MessageTag& tag);
  void onGrantLocked(Lane& lane, const PieceHeader& header, const uint8_t* payload);
  void onWrittenLocked(Peer& peer, uint32_t value);
  // The received message `op` is whole in its destination: deregister, copy a bounce buffer
  // in, land it; false after failLocked().
  bool finishIncomingLocked(Peer& peer, OneSidedOp& op);
  // The send's every part is done (pieces acknowledged; for a rendezvous, its one-sided part).
  void maybeSendDoneLocked(const std::shared_ptr<SendOp>& op);
  // Moves a failed lane's reads, rendezvous writes, kFins and kWrittens to the other lanes.
  void failOverOneSidedLocked(Lane& lane);
  // Deregisters every rendezvous registration (after a failure, or at teardown).
  void dropRendezvousLocked();
  // ibverbs_transport_readmit.cc: a failed lane made again and put back in rotation, by a
  // thread of its own (its store calls never hold up the progress thread).
  void readmitLoop();
  // True while an exchange is under way: the next step is due soon, not after the interval
  // (a probe must not wait out its retry budget for the peer's next look at the store).
  bool readmitLanes();
  // The re-admission probe of `lane` completed (acknowledged, or in error).
  void onProbedLocked(Lane& lane, bool acknowledged);
  // A re-made (or first) queue pair works: the lane is back in its peer's rotation. Its
  // probe's acknowledgement says so, or anything the peer wrote on it (the peer's own probe
  // was acknowledged first, so both sides are connected): an offer that arrives before this
  // side's probe returns is read or granted over it.
  void laneUpLocked(Lane& lane);
  // ibverbs_transport_lazy.cc: lanes connected when a pair first talks (RAILSHARD_IB_CONNECT).
  // This rank sends to or receives from `peer`: its lanes are connected if they are not.
  void wantLocked(Peer& peer);
  // Tells the peers this rank wants that they are wanted, and learns which peers want this
  // rank (store notices; the re-admission thread, no lock held). True when one was learnt.
  bool exchangeWanted();
  // The first lane to `peer` is up: the sends deferred until then are planned, in order.
  void peerConnectedLocked(Peer& peer);
  // ibverbs_transport_progress.cc
  void progressLoop();
  bool pollCompletions();
  void handleCompletionLocked(const ibv_wc& wc);
  // A send-queue entry of `lane` came free: everything waiting for room to `peer` (pieces,
  // credits, reads, rendezvous writes, their ends) is posted as far as it fits.
  void postWhatFitsLocked(Peer& peer, Lane& lane);
  void waitForEvents();
  void handleAsyncEvent(Rail& rail);
  void failLocked(ErrorKind kind, const std::string& message);
  // A lane broke (`what`: which and how): its peer's other lanes take over; without one, a
  // PeerLostError now when anything is pending with that peer, else remembered.
  void laneFailedLocked(Lane& lane, const std::string& what);
  // Takes a failed lane out of its peer's rotation and moves what it had not delivered (and
  // had yet to send) to the peer's other lanes; false when no other lane is up.
  bool failOverLocked(Lane& lane, const std::string& why);
  void raisePendingFailure();
  void onControlFailure(ErrorKind kind, const std::string& message);
  [[noreturn]] void rethrowPoisoned() const;
  std::string describe(const MessageTag& tag) const;
  std::string laneName(const Lane& lane) const;
  // The store key of `what` for the lane from rank `from` to `to` on `rail`, start-up's
  // ("lane") and re-admission's ("readmit/lane", "readmit/published", ...) alike.
  std::string laneKey(const std::string& what, int from, int to, int rail) const;
  // ibverbs_transport_tcp.cc: the TCP connections as one more rail (RAILSHARD_STRIPE_TCP).
  // Posts a piece over them; false after failLocked().
  bool postTcpPieceLocked(Peer& peer, SendOp& op, size_t offset, size_t length, bool resend);
  // The RDMA lanes' part of a send is done: complete it, or leave that to wait() once its
  // TCP pieces are sent.
  void rdmaPartDoneLocked(const std::shared_ptr<SendOp>& op);
  // wait() for a send whose RDMA part is done: waits for its TCP pieces, then completes it.
  void finishTcpParts(const RequestPtr& request, SendOp& op, Deadline deadline);
  Landing pieceArriving(int peer, const messaging::PieceInfo& piece) override;
  void pieceLanded(int peer, const messaging::PieceInfo& piece, uint64_t bytes) override;
  // ibverbs_transport_device.cc: GPU buffers (never run on a GPU; docs/rdma.md).
  void prepareDeviceSendLocked(Peer& peer, SendOp& op);
  // Copies between a (host or device) user buffer and host memory; false after failLocked().
  bool copyOutLocked(const SendOp& op, uint8_t* host, size_t offset, size_t length);
  bool copyInLocked(const RecvOp& op, size_t offset, const uint8_t* host, size_t length);
  // ibverbs_transport_trace.cc (docs/tracing.md): a piece acknowledged (or read) on a lane.
  void traceRailLocked(Lane& lane, size_t bytes, int64_t begin_ns, const char* name = "rdma_write");

  const VerbsApi& api_;
  const CudaDriver* cuda_ = nullptr;  // null without an NVIDIA driver: every buffer is host
  bool staging_logged_ = false;       // "GPUDirect unavailable" is said once
  bool rendezvous_logged_ = false;    // "cannot register a send buffer" is said once
  // The rendezvous as resolved in openRails(): its threshold (0 = off) and whether this rank's
  // large sends are written (RAILSHARD_IB_RENDEZVOUS_VERB) rather than offered for reading.
  size_t rendezvous_bytes_ = 0;
  bool write_rendezvous_ = false;
  FactoryOptions options_;
  // The job's store, for re-admission's exchanges (it outlives every communicator on it).
  Store* store_ = nullptr;
  QpTiming timing_;
  std::unique_ptr<Transport> control_;
  // control_ as a carrier of this transport's pieces (RAILSHARD_STRIPE_TCP), else null.
  messaging::PieceLink* tcp_link_ = nullptr;
  // Pieces arriving over TCP, by (peer, message, offset): where their payload lands.
  std::map<std::tuple<int, uint64_t, uint64_t>, std::unique_ptr<TcpLanding>> tcp_landings_;
  std::vector<std::unique_ptr<Rail>> rails_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // wr_id names a lane by its index here
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for self and non-RDMA peers

  // One lock for the data structures above: the progress thread and posting callers share it.
  mutable std::mutex mutex_;
  std::thread progress_;
  std::thread readmitter_;  // when readmit_interval > 0 or lazy_
  std::mutex readmit_mutex_;
  std::condition_variable readmit_wake_;  // stopping, or readmit_kick_
  bool readmit_kick_ = false;             // a peer is wanted (guarded by readmit_mutex_)
  // Lanes connected when a pair first talks (resolved from RAILSHARD_IB_CONNECT).
  bool lazy_ = false;
  int64_t wanted_seen_ = 0;  // notices of peers that want this rank already read (readmit thread)
  std::atomic<bool> stopping_{false};
  int wake_fd_ = -1;

  // Failure: set when the control transport is poisoned (by anyone) or by us just before we
  // poison it. After it is set no user buffer is read or written.
  std::atomic<bool> poisoned_{false};
  std::vector<std::pair<ErrorKind, std::string>> pending_failures_;  // guarded by mutex_
  std::vector<LostPeer> rdma_lost_;  // peers with no RDMA lane left; guarded by mutex_
  mutable std::mutex state_mutex_;
  std::condition_variable state_changed_;
  std::mutex listener_mutex_;
  std::function<void(ErrorKind, const std::string&)> failure_listener_;
  std::function<std::string(const MessageTag&)> timeout_explainer_;

  std::atomic<int> trace_rank_{-1};
  messaging::CurrentCollective current_{options_.rank, &options_.formatter};
};

}  // namespace railshard::transport::ibverbs
