#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/config.h"
#include "base/function_ref.h"
#include "transport/links/link.h"
#include "transport/messaging/current_collective.h"
#include "transport/messaging/failure_state.h"
#include "transport/messaging/frame.h"
#include "transport/messaging/message_book.h"
#include "transport/messaging/out_frame.h"
#include "transport/messaging/waiter.h"
#include "transport/rails/rail_scheduler.h"
#include "transport/transport.h"

namespace railshard::transport {
class CudaDriver;
}

namespace railshard::transport::messaging {

struct Rendezvous;
struct Incoming;

// What the messengers of one group of ranks share. Everything it points at outlives them.
struct Group {
  int rank = 0;
  const TagFormatter* formatter = nullptr;
  FailureState* failure = nullptr;
  Wake* wake = nullptr;  // bumped when a request completes or a message begins
  const CurrentCollective* current = nullptr;  // null: no check of unsolicited messages
  std::atomic<int>* trace_rank = nullptr;      // world rank of trace events; null or < 0: none
  const CudaDriver* cuda = nullptr;            // null: every buffer is host memory
  std::function<Clock::time_point()> now;  // the clock; null: the steady clock (tests script it)
};

struct MessengerOptions {
  int peer = -1;
  std::string peer_address;  // in errors: "rank 3 (10.0.0.2:4100)"
  // Weights, the stalled-link timeout, the heartbeat (a peer this rank awaits something from
  // and heard nothing from for heartbeat_timeout is lost; pinged every fifth of it while
  // awaited; zero: none).
  LinkConfig links;
  // Host messages of this many bytes or more move in place (a rendezvous) when every data link
  // up is one-sided; 0 = never. `write_rendezvous`: the receiver grants, the sender writes.
  size_t rendezvous_bytes = 0;
  bool write_rendezvous = false;
  // This rank re-makes failed links and connects links by records (the higher rank of a pair).
  bool initiator = false;
};

// Everything between this rank and one peer, whatever links carry it (TCP connections, RDMA
// lanes, a shared-memory channel), written once for every kind of link:
//  - numbering, posted receives, matching and early-message staging, and the tag check before
//    any byte lands (MessageBook);
//  - striping every message over the data links up by measured rate, with tail stealing
//    (RailScheduler);
//  - keeping what was sent until the peer has it, and re-sending exactly the rest when a link
//    fails: each rank takes the link out, and once nothing more can arrive on it tells the
//    other (kLinkDown) how many of its sequenced frames it took whole; each re-sends the rest
//    on the other links. Nothing is lost or delivered twice;
//  - re-admission of a failed link (its driver dials again, or the two sides exchange
//    connection records over a working link), and links connected on first use;
//  - heartbeats, stalled links, the zero-copy rendezvous over one-sided links, closing with a
//    goodbye, and one error state with the group (FailureState): a lost peer, a mismatch or an
//    abort fails the whole group.
// It needs only connected links: no store, no communicator (the NCCL plugin drives it with a
// handshake of its own; tests drive it over scripted fake links).
//
// Locking: one lock per messenger guards it and its links. User threads call the public
// methods without it; drivers take it (guard()) and report what happened on a link through the
// *Locked methods. Failures found under the lock are raised once it is released (Guard).
class Messenger {
 public:
  Messenger(const Group& group, MessengerOptions options);
  ~Messenger();
  Messenger(const Messenger&) = delete;
  Messenger& operator=(const Messenger&) = delete;

  // --- set-up (before the first message; links are index-aligned on both ranks) ---
  // `data`: carries messages (else control only: acknowledgements, heartbeats, reports,
  // aborts). `up`: connected now; else its driver dials it or records connect it (connect()).
  int addLink(std::unique_ptr<links::Link> link, bool data, bool up);
  // Links connected by records that are not up are connected now (eager start-up; the
  // initiator asks, the other side answers as records arrive).
  void connect();
  // Whether every link that is to connect at start-up is up.
  bool connected() const;
  int linkCount() const;
  links::Link& link(int index) const;
  int peer() const { return options_.peer; }

  // --- messages (user threads) ---
  // Null-free: a failure raises (PeerLostError when the peer is lost or unreachable).
  RequestPtr isend(const void* data, size_t bytes, const MessageTag& tag);
  RequestPtr irecv(void* data, size_t bytes, const MessageTag& tag);
  // A receive of the peer's next message whatever its tag and size (at most `capacity`
  // bytes), its buffer chosen by `choose` before a byte lands (MessageBook::postChosen); the
  // request's received() says how much came. `device`: every buffer it may choose is GPU
  // memory (each piece is copied in from host memory; needs the group's CudaDriver).
  RequestPtr irecvChosen(size_t capacity, bool device, Chooser choose);
  // Someone blocks on this send: once all of it is written, what is still kept for re-sending
  // is copied and the send completes, rather than waiting for the peer's acknowledgement.
  void waited(const RequestPtr& request);
  // Whether the peer's next message (the one the next irecv matches) has begun to arrive with
  // a tag `accept` takes (a receive from any source). `accept` runs under the lock.
  bool nextArrived(const std::function<bool(const MessageTag&)>& accept);
  // The first early message nobody asked for that is of another collective than the group's
  // current one (Group::current): its mismatch text.
  std::optional<std::string> checkStaged();
  // A wait that is not a posted receive is on this peer (a receive from any source,
  // awaitArrival; a shared-memory step, ShmEngine's await hook): while one is, the peer is
  // awaited as by a posted receive (heartbeats, liveness checks). Calls pair up (on, off).
  void expectArrival(bool on);
  // Polled links (shared memory): moves them along. Cheap when there are none.
  bool polled() const { return polled_; }
  void poll();
  // The group's timer: heartbeats, stalled links, re-admission. Every few milliseconds.
  void tick();
  // Closing: a goodbye behind everything queued on every link up. drained(): nothing of this
  // rank's is left to go out (or nothing can go out any more).
  void sayGoodbye();
  bool drained() const;
  // Its data links' state: the network rails, and with `channels` a same-host channel too.
  std::vector<RailStatus> rails(bool channels = false) const;
  // Payload bytes sent over each link so far.
  uint64_t bytesSent(int link) const;
  // What is in progress with the peer, for a timeout's message: messages sent and received,
  // each link's state and frames queued, posted and kept, rendezvous under way.
  std::string stateSummary() const;
  bool lost() const;

  // The group failed (a FailureState hook): user memory is detached (nothing more is read or
  // written in it) and, when `tell_peers`, the peer gets the abort (`lost_rank` in it).
  void groupFailed(ErrorKind kind, const std::string& message, int lost_rank, bool tell_peers);

  // --- drivers: what happened on link `link`, with the lock held ---
  class Guard {
   public:
    explicit Guard(Messenger& messenger) : messenger_(messenger), lock_(messenger.mutex_) {}
    ~Guard() {
      lock_.unlock();
      messenger_.raisePending();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    Messenger& messenger_;
    std::unique_lock<std::mutex> lock_;
  };
  Guard guard() { return Guard(*this); }

  // The next `count` frames posted on the link completed there, in posting order.
  void completedLocked(int link, int count);
  // The link can take frames again.
  void roomLocked(int link);
  // Where an arriving frame's payload goes, decided from its header before a byte of it lands.
  struct Landing {
    uint8_t* target = nullptr;        // its header.length payload bytes go here
    bool discard = false;             // read them and drop them (a failure, a refused frame)
    std::shared_ptr<Incoming> entry;  // a piece of a message: the message
    std::vector<uint8_t> buffer;      // a control payload, or a device receive's bounce
  };
  Landing arrivingLocked(int link, const FrameHeader& header);
  // Its whole payload is where arrivingLocked said.
  void landedLocked(int link, const FrameHeader& header, Landing& landing);
  // Nothing more to take from the link for now (a reader that ran dry): acknowledgements go out.
  void idleLocked(int link);
  // What arrived on the link breaks the protocol (a bad frame header): the group fails.
  void protocolErrorLocked(int link, const std::string& what);
  // The link broke (`peer_closed`: the peer's side closed or reset it).
  void linkFailedLocked(int link, const std::string& why, bool peer_closed);
  // After shutdown(): nothing more arrives from the link or completes on it.
  void quiescedLocked(int link);
  // A re-dialled link (or a first connection a driver made) is up at `generation`.
  void linkUpLocked(int link, uint32_t generation);
  // Whether the link may be re-dialled at `generation` now (the accepting driver asks). A link
  // connected on first use may be dialled by either rank; when both dial at once, the higher
  // rank's connection is the one kept (each side refuses the other's dial only if it is the
  // higher and dialling itself).
  bool redialWantedLocked(int link, uint32_t generation) const;
  // The accepting driver took a first connection for the link: this rank dials it no more.
  void dialAcceptedLocked(int link);
  // A one-sided move posted with `cookie` is done (`ok` false: failed, the link fails too).
  void oneSidedDoneLocked(int link, uint64_t cookie);

  // Raises the failures found under the lock (Guard does).
  void raisePending();
  // Whether this rank awaits anything of the peer: a receive, a send or an acknowledgement
  // still to come, a rendezvous, a wait marked by expectArrival. Only an awaited peer is pinged
  // and checked for life: at 256 ranks every rank pinging every peer every 2 s was 32,000
  // pings a second, which starved the job (docs/scaling.md); a peer nobody waits on is
  // found lost when somebody next does (within the heartbeat timeout), or sooner by its
  // links (a closed socket, an exited process).
  bool busyLocked() const;

 private:
  enum class State : uint8_t { kConnecting, kUp, kDown };
  enum class Connect : uint8_t { kIdle, kAsked, kAccepted, kProbing };
  struct LinkState;
  struct OneSided;

  Clock::time_point now() const { return group_.now ? group_.now() : Clock::now(); }
  LinkState& at(int link) { return *links_[static_cast<size_t>(link)]; }
  std::string peerName() const;
  std::string describe(const MessageTag& tag) const;
  // A failure to raise once the lock is released.
  void failLocked(ErrorKind kind, std::string message, bool tell_peers = true);
  bool failed() const;
  // PeerLostError for this peer: recorded lost, the group fails.
  void peerLostLocked(const std::string& reason, const std::string& message);

  // messenger_send.cc
  void planLocked(const std::shared_ptr<SendOp>& op);
  // Queues `length` bytes of `op` from `offset` on `link`, cut into frames it can carry.
  void queuePiecesLocked(LinkState& link, const std::shared_ptr<SendOp>& op,
                         const FrameHeader& base, const uint8_t* data, uint64_t offset,
                         uint64_t length);
  void pumpLocked(LinkState& link);
  void pumpAllLocked();
  void postFrameLocked(LinkState& link, const OutFramePtr& frame);
  void frameCompleteLocked(LinkState& link, const OutFramePtr& frame);
  uint64_t deliveredLocked(LinkState& link, OutFrame& frame);  // its data bytes
  void releaseLocked(OutFrame& frame);
  void releaseByCopyLocked(SendOp& op);
  void completeLocked(Request& request);
  void markBusyLocked(LinkState& link);
  void maybeIdleLocked(LinkState& link);
  void sampleLocked(LinkState& link, uint64_t bytes, uint64_t when_ns);
  bool stealForLocked(LinkState& idle);
  void onAckLocked(const FrameHeader& header);
  void traceRailLocked(LinkState& link, const OutFrame& frame, const char* name);
  // The link control frames go on: an up control-only link, else the fastest data link up.
  LinkState* controlLinkLocked();
  void sendControlLocked(FrameHeader header, const std::string& payload = {},
                         LinkState* via = nullptr);
  bool retains() const { return data_links_ > 1; }
  // messenger_receive.cc
  void onDataLandedLocked(LinkState& link, const FrameHeader& header, Landing& landing);
  // The message is whole: `source` (its staging buffer or a bounce; null when it landed in
  // place) is copied into the receive's buffer, and the receive completes.
  void completeIncomingLocked(Incoming& entry, const uint8_t* source);
  // irecv and irecvChosen: `post` books the receive, unless the peer is gone already.
  RequestPtr postReceive(const RequestPtr& op, const MessageTag& tag,
                         FunctionRef<MessageBook::Posted(const RequestPtr&)> post);
  void sendAckLocked(LinkState& link, LinkState* via);
  void onByeLocked(LinkState& link, const FrameHeader& header);
  void onAbortLocked(const FrameHeader& header, const std::string& text);
  // messenger_links.cc
  void requeueUnpostedLocked(LinkState& link);
  void sendReportsLocked();
  // A kLinkDown report that arrived on `via`.
  void onReportLocked(LinkState& via, const FrameHeader& header, const std::string& why);
  // "RDMA rail mlx5_0:1 to rank 3", "rail0 to rank 3": a link in messages.
  std::string linkName(const LinkState& link) const;
  void resendLocked(LinkState& link, uint64_t consumed);
  // `complete`: it had completed on its link (not counted as unwritten any more).
  void resendFrameLocked(const OutFramePtr& frame, bool complete);
  bool rejoinableLocked(const LinkState& link) const;
  void startConnectLocked(LinkState& link);
  void onConnectLocked(LinkState& link, const FrameHeader& header, const std::string& record);
  void onConnectAckLocked(LinkState& link, const FrameHeader& header, const std::string& record);
  void upLocked(LinkState& link, uint32_t generation);
  void newGenerationLocked(LinkState& link, uint32_t generation);
  void wantLocked();
  // Links connected on first use that a driver dials: dialled (again, if an attempt failed).
  void dialFirstLocked(Clock::time_point now);
  // Links connected by records, first use: asked for once a link that carries control is up.
  void askRecordsLocked();
  void checkStallsLocked(Clock::time_point now);
  void heartbeatLocked(Clock::time_point now);
  void rejoinLocked(Clock::time_point now);
  std::string linksSummaryLocked() const;
  // "up", or "down: why" ("down: not connected" before its first connection).
  std::string linkStateLocked(const LinkState& link) const;
  std::string stateSummaryLocked() const;
  bool dataLinkUpLocked() const;
  bool dataLinkComingLocked() const;
  // messenger_rendezvous.cc
  bool offerLocked(const std::shared_ptr<SendOp>& op);
  void onOfferLocked(LinkState& link, const FrameHeader& header, Landing& landing);
  void onGrantLocked(const FrameHeader& header, const std::vector<uint8_t>& payload);
  void onEndLocked(const FrameHeader& header);
  void pumpOneSidedLocked();
  void oneSidedFinishedLocked(const std::shared_ptr<Rendezvous>& move);
  // Registers `move`'s local buffer with every one-sided data link up; false (nothing held)
  // when a registration fails, with `why`.
  bool registerLocked(Rendezvous& move, int access, std::string& why);
  void deregisterLocked(Rendezvous& move);
  // Cuts the move into pieces over the links where both sides registered its buffers.
  void planMovesLocked(Rendezvous& move);
  // An end (kReadDone / kWritten) of `move` behind its pieces on each link it used.
  void sendEndsLocked(const Rendezvous& move, FrameKind kind);
  void failOverOneSidedLocked(LinkState& link);
  void dropRegistrationsLocked();

  Group group_;
  MessengerOptions options_;
  bool connect_asked_ = false;  // connect() was called, or the peer asked (records)
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<LinkState>> links_;
  int data_links_ = 0;
  bool polled_ = false;
  std::unique_ptr<rails::RailScheduler> scheduler_;  // over the data links (LinkState::rail)
  std::vector<int> link_of_rail_;
  MessageBook book_;
  std::deque<std::shared_ptr<SendOp>> deferred_;  // sent before any data link was up
  bool wanted_ = false;                           // links connected on first use: asked for
  // Failures found under the lock, raised by raisePending().
  struct Pending {
    ErrorKind kind;
    std::string message;
    bool tell_peers;
  };
  std::vector<Pending> pending_;
  // The peer.
  bool lost_ = false;
  // Why: a send or receive that finds the peer lost names it too. The loss is raised by
  // raisePending() outside the lock, so another thread's operation can raise its own error
  // first, and that error must still say what failed (which rail, which heartbeat).
  std::string lost_why_;
  std::string unreachable_;  // every data link failed while nothing was pending: why
  bool bye_received_ = false;
  uint64_t bye_messages_ = 0;  // messages the peer sent before its goodbye
  bool bye_sent_ = false;
  Clock::time_point heard_{};           // anything arrived from the peer
  Clock::time_point heartbeat_sent_{};  // last ping
  int expecting_ = 0;                   // waits marked by expectArrival, open now
  Clock::time_point last_tick_{};
  // Rendezvous (messenger_rendezvous.cc): the moves this rank drives (reads, or writes once
  // granted), its offers waiting for the peer's ends or grant (by message), the grants it made
  // waiting for the peer's ends (by message), and which move each posted piece belongs to.
  std::vector<std::shared_ptr<Rendezvous>> moves_;
  std::map<uint64_t, std::shared_ptr<Rendezvous>> offered_;
  std::map<uint64_t, std::shared_ptr<Rendezvous>> granted_;
  std::map<uint64_t, std::shared_ptr<Rendezvous>> cookies_;
  uint64_t next_cookie_ = 1;
  bool pumping_one_sided_ = false;
  bool repump_one_sided_ = false;
  bool registration_logged_ = false;  // "cannot register a send buffer" is said once
};

}  // namespace railshard::transport::messaging
