#pragma once

// Internals shared by the ibverbs_transport_*.cc files.

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "base/clock.h"
#include "base/trace.h"
#include "transport/ibverbs/ibverbs_transport.h"
#include "transport/ibverbs/registration_cache.h"
#include "transport/messaging/message_book.h"

namespace railshard::transport::ibverbs {

constexpr size_t kHeaderBytes = sizeof(PieceHeader);
// RDMA reads outstanding per lane (the rendezvous), at most; the HCA may allow fewer.
constexpr int kMaxReadDepth = 8;
// Rendezvous RDMA writes outstanding per lane, at most (the write rendezvous).
constexpr int kMaxWriteDepth = 8;
// A rendezvous message is read (or written) in pieces of at most this: the unit the rail
// scheduler times and a failed lane's pieces move in. Depth x piece (2 MiB) is what a lane has
// requested and not yet received: it must arrive well within the ACK timeout, or the
// requester retries reads the responder is still serving (seen over rxe with 8 x 1 MiB and a
// 268 ms timeout; 1 MiB pieces were no faster there than 256 KiB ones).
constexpr size_t kOneSidedPieceBytes = size_t{256} << 10;
// Rendezvous sends to one peer in progress at once (offered, not yet finished): the peer's
// kFin writes (read rendezvous) or this side's kWritten writes (write rendezvous) must find
// receives posted (each lane has 8 beyond its ring; credit writes take at most 2).
constexpr size_t kMaxRendezvousInFlight = 4;

// RAILSHARD_IB_CONNECT=auto: lanes are connected at start-up to at most this many RDMA peers,
// on first use beyond (8 peers x 8 MiB of rings per rail: what eager costs is bounded).
constexpr long kEagerPeers = 8;

// wr_id: lane index (16 bits) and its queue pair's generation (16; Lane::id()) | kind (8) |
// slot, count, read slot or message (24).
enum class WorkKind : uint8_t {
  kData = 1,
  kCredit = 2,
  kRecv = 3,
  kRead = 4,
  kFin = 5,
  kNotice = 6,
  kWrite = 7,
  kProbe = 8
};
inline uint64_t makeWorkId(uint32_t lane, WorkKind kind, uint32_t value) {
  return (uint64_t{lane} << 32) | (uint64_t{static_cast<uint8_t>(kind)} << 24) |
         (value & 0xffffffu);
}
inline uint32_t workLane(uint64_t id) {
  return static_cast<uint32_t>(id >> 32);
}
// A rendezvous message in the sender's books and in a kFin immediate: the low 16 bits of its
// number (at most kMaxRendezvousInFlight are pending, so they never collide).
inline uint32_t finValue(uint64_t message) {
  return static_cast<uint32_t>(message & 0xffffu);
}
// The receiver writes one kFin on each lane it read the message on, after that lane's reads:
// a read request the HCA sent again (its response was late) travels ahead of the kFin on the
// same queue pair, so the responder serves it before the sender deregisters. The immediate
// says which lane (rail, 4 bits) and how many kFins to expect (4 bits); the sender
// deregisters when it has them all. Pairs of more than kMaxFinRails rails stay staged. The
// write rendezvous ends the same way the other way round: the sender writes a kWritten on
// each lane it wrote on, behind that lane's writes, and the receiver deregisters when it has
// them all.
constexpr uint32_t kMaxFinRails = 15;
inline uint32_t finImmediate(uint64_t message, uint32_t rail, uint32_t lanes) {
  return finValue(message) | (rail << 16) | (lanes << 20);
}
inline uint32_t finRail(uint32_t value) {
  return (value >> 16) & 0xfu;
}
inline uint32_t finLanes(uint32_t value) {
  return (value >> 20) & 0xfu;
}
// Counts the end (kFin or kWritten) `value` into `seen`, a bit per rail (a second end of one
// lane, sent again after a failover, counts once); true once every lane's end is in.
inline bool endsComplete(uint32_t& seen, uint32_t value) {
  seen |= 1u << finRail(value);
  return static_cast<uint32_t>(__builtin_popcount(seen)) >= finLanes(value);
}
// A kLaneDown notice's value: the rail (8 bits) and the generation of the lane's queue pair
// that failed (16 bits).
inline uint32_t laneDownValue(uint32_t rail, uint16_t generation) {
  return (rail & 0xffu) | (uint32_t{generation} << 8);
}
inline uint32_t laneDownRail(uint32_t value) {
  return value & 0xffu;
}
inline uint16_t laneDownGeneration(uint32_t value) {
  return static_cast<uint16_t>(value >> 8);
}
inline WorkKind workKind(uint64_t id) {
  return static_cast<WorkKind>((id >> 24) & 0xff);
}
inline uint32_t workValue(uint64_t id) {
  return static_cast<uint32_t>(id & 0xffffffu);
}

// Page-aligned host memory registered with one protection domain.
struct RegisteredBuffer {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  ibv_mr* mr = nullptr;
};

// User memory registered for one rendezvous message, one memory region per rail (each rail
// has its own protection domain); deregistered when the message is done, or at once after a
// failure, so that no HCA reads or writes it once the caller may have freed it.
struct UserRegions {
  const VerbsApi* api = nullptr;
  std::vector<ibv_mr*> mrs;  // by rail
  void release() {
    for (ibv_mr*& mr : mrs) {
      if (mr != nullptr) api->dereg_mr(mr);
      mr = nullptr;
    }
  }
  bool held() const {
    for (const ibv_mr* mr : mrs) {
      if (mr != nullptr) return true;
    }
    return false;
  }
};

struct IbverbsTransport::Rail {
  HcaPort port;
  uint8_t rd_atomic = 0;  // reads this rail serves and issues per queue pair (LaneInfo)
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  // GPU buffers registered with this rail's protection domain (GPUDirect), made on first use.
  std::unique_ptr<RegistrationCache> device_cache;
};

struct IbverbsTransport::Lane {
  uint32_t index = 0;  // in lanes_
  // Re-admission (ibverbs_transport_readmit.cc): how often the queue pair was made again; a
  // completion of an older one is stale. `posted`: work requests posted on the current queue
  // pair whose completion was not seen yet (a failed one is made again only once it is 0:
  // every piece that landed on it has been taken).
  uint16_t generation = 0;
  int posted = 0;
  enum class Readmit : uint8_t { kIdle, kPublished, kConnected, kProbing };
  Readmit readmit = Readmit::kIdle;
  Clock::time_point readmit_since{};  // when its record was published
  bool ever_up = false;               // connected once (a lazy lane starts without)
  uint32_t id() const { return index | (uint32_t{generation} << 16); }
  int peer = -1;
  int rail = 0;  // index in rails_ and in the peer's scheduler
  ibv_qp* qp = nullptr;
  LaneInfo local;
  LaneInfo remote;
  RegisteredBuffer recv_ring;  // local.slots x local.slot_bytes, written by the peer
  RegisteredBuffer send_ring;  // remote.slots x remote.slot_bytes, our staging copies
  std::optional<SendWindow> send;
  std::optional<ReceiveWindow> recv;
  int send_depth = 0;        // max_send_wr
  int send_outstanding = 0;  // posted, completion not yet seen
  bool failed = false;
  // Payload bytes this rank moved over the lane: written, or read (a rendezvous message's
  // bytes count once, on the rank that reads or writes them; offers and grants are no
  // payload).
  uint64_t bytes_sent = 0;
  uint64_t bytes_in_place = 0;  // of those, read or written by the rendezvous
  // Per staging slot: the message piece in flight from it.
  struct InFlight {
    std::shared_ptr<SendOp> op;
    size_t offset = 0;
    size_t bytes = 0;
    Clock::time_point posted{};
    int64_t trace_ns = 0;  // trace clock at posting; 0 when tracing was off
  };
  std::vector<InFlight> in_flight;
  // Per read slot (readDepth(); empty when the pair never reads) and per rendezvous write
  // slot (kMaxWriteDepth): the rendezvous piece being read or written with it.
  struct OneSided {
    std::shared_ptr<OneSidedOp> op;
    size_t offset = 0;
    size_t bytes = 0;
    Clock::time_point posted{};
    int64_t trace_ns = 0;
  };
  std::vector<OneSided> reads;
  std::vector<OneSided> writes;
  std::vector<OneSided>& slotsFor(bool write) { return write ? writes : reads; }
  // kFin and kWritten immediates posted on this lane, completion not yet seen: sent again on
  // another lane if this one fails.
  std::deque<Immediate> ends;
  Clock::time_point last_completion{};  // for the rail scheduler's service-time samples
  int32_t trace_track = 0;              // this lane's track in the trace, made on first use
};

// Posts one work request on the lane's current queue pair and counts it (Lane::posted); the
// verbs error code, 0 when posted.
inline int postSend(IbverbsTransport::Lane& lane, ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(lane.qp, &wr, &bad);
  if (rc == 0) ++lane.posted;
  return rc;
}
inline int postRecv(IbverbsTransport::Lane& lane, ibv_recv_wr& wr) {
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_recv(lane.qp, &wr, &bad);
  if (rc == 0) ++lane.posted;
  return rc;
}

struct IbverbsTransport::SendOp : Request {
  SendOp(int peer, const void* data_in, size_t bytes, const MessageTag& tag, uint64_t message_in)
      : Request(Kind::kSend, peer, bytes, tag),
        data(static_cast<const uint8_t*>(data_in)),
        message(message_in) {}
  struct Chunk {
    size_t offset = 0;
    size_t length = 0;
    bool resend = false;  // its first lane failed before the write was acknowledged
  };
  const uint8_t* data;
  uint64_t message;
  std::vector<std::vector<Chunk>> per_rail;  // what each rail carries, in order
  std::vector<size_t> next;                  // per rail: first chunk not yet posted
  size_t unposted = 0;
  size_t outstanding = 0;  // posted, local completion not yet seen
  // CUDA device memory: written straight from GPU memory through `leases` (one per rail,
  // GPUDirect RDMA), or, when it cannot be registered, copied to the staging slot (`staged`).
  bool device = false;
  bool staged = false;
  std::vector<RegistrationCache::Lease> leases;
  // Zero-copy rendezvous (host memory of RAILSHARD_IB_RENDEZVOUS bytes or more): one piece,
  // the offer, is written. Read rendezvous: the offer is a read descriptor, the peer reads the
  // rest from `regions` and says so with a kFin, which completes the send. Write rendezvous
  // (`write`): the offer is empty, the peer answers with a grant (its buffer), this rank
  // writes the message there and completes the send when the writes are acknowledged.
  bool rendezvous = false;
  bool write = false;
  bool granted = false;    // write: the grant arrived (a second one is ignored)
  bool fin = false;        // the one-sided part is done
  uint32_t fin_rails = 0;  // read: rails whose kFin arrived (bit per rail)
  UserRegions regions;
  std::vector<uint8_t> descriptor;  // the piece written: a ReadDescriptor (the read offer or
                                    // a grant), empty for a write offer
  // A grant: a control piece of the peer's message `message` (numbered in the other
  // direction), not a message of this direction; nobody waits for it.
  bool grant = false;
  // Pieces over TCP (RAILSHARD_STRIPE_TCP), guarded by the transport's mutex until
  // rdma_finished is set; final from then on (failover only moves RDMA lanes' pieces).
  std::vector<RequestPtr> tcp_parts;
  std::vector<std::vector<uint8_t>> tcp_host;  // device memory: host copies the pieces send
  uint64_t tcp_bytes = 0;
  Clock::time_point posted = Clock::now();
  std::atomic<bool> rdma_finished{false};  // every RDMA piece acknowledged
};

// A piece arriving over TCP: the message it lands in, or a bounce buffer (a receive in device
// memory is copied in once it landed; a duplicate is dropped).
struct IbverbsTransport::TcpLanding {
  messaging::IncomingPtr entry;
  std::vector<uint8_t> bounce;
  bool discard = false;
};

// A rendezvous message moved one-sided in pieces over the lanes: read by this rank from the
// peer's buffer into the receive's (or the staging buffer, when it arrived before its
// receive), or — the write rendezvous — written by this rank from its send buffer into the
// buffer the receiver granted. The receiver of a write rendezvous keeps one too, with no
// pieces: its registered destination, until every kWritten arrived.
struct IbverbsTransport::OneSidedOp {
  bool write = false;
  uint64_t message = 0;
  messaging::IncomingPtr entry;  // the receive (read, and the receiver's side of a write)
  std::shared_ptr<SendOp> send;  // the send (write): its regions hold the source's lkeys
  ReadDescriptor remote;         // the peer's buffer and rkeys
  uint8_t* local = nullptr;      // read: entry->base() or `bounce`; write: the send's data
  std::vector<uint8_t> bounce;   // a receive in device memory: landed here, then copied in
  UserRegions regions;           // the receiver's buffer, registered with each rail
  std::vector<std::vector<SendOp::Chunk>> per_rail;
  std::vector<size_t> next;
  size_t unposted = 0;
  size_t outstanding = 0;
  uint64_t total = 0;
  uint32_t rails_used = 0;  // rails a piece of it went on (bit per rail): a kFin/kWritten on each
  uint32_t ends_seen = 0;   // the receiver of a write: rails whose kWritten arrived
  uint32_t lkey(size_t rail) const { return (write ? send->regions : regions).mrs[rail]->lkey; }
};

struct IbverbsTransport::RecvOp : Request {
  RecvOp(int peer, void* data_in, size_t bytes, const MessageTag& tag)
      : Request(Kind::kRecv, peer, bytes, tag), data(static_cast<uint8_t*>(data_in)) {}
  uint8_t* data;
  bool device = false;  // CUDA device memory: pieces are copied in by the driver
};

struct IbverbsTransport::Peer {
  int rank = -1;
  std::vector<Lane*> lanes;  // by rail
  std::optional<rails::RailScheduler> scheduler;
  // Numbering, matching, staging and the checks before a byte lands.
  messaging::MessageBook book{-1, -1, nullptr};
  std::deque<std::shared_ptr<SendOp>> sending;  // not fully posted, in message order
  // Lanes connected on first use (ibverbs_transport_lazy.cc): false until the first is up;
  // `wanted` once this rank talked to the peer (or was told the peer wants it: `asked`);
  // `announced` once the peer was told; the sends made before, not yet cut into pieces.
  bool connected = true;
  bool wanted = false;
  bool asked = false;
  bool announced = false;
  std::deque<std::shared_ptr<SendOp>> deferred;
  std::deque<std::shared_ptr<OneSidedOp>> reading;  // rendezvous reads not fully posted
  std::deque<std::shared_ptr<OneSidedOp>> writing;  // rendezvous writes not fully posted
  // Rendezvous sends in progress (offered; read: waiting for the peer's kFin; write: for the
  // grant, then for the writes), by the low 16 bits of the message number.
  std::map<uint32_t, std::shared_ptr<SendOp>> awaiting_fin;
  // Write rendezvous messages this rank receives: granted, waiting for every kWritten.
  std::map<uint32_t, std::shared_ptr<OneSidedOp>> awaiting_written;
  // kFin / kWritten writes to post: the immediate, and the rail it must go on (-1: any lane,
  // its own having failed).
  struct End {
    Immediate imm;
    int rail = -1;
  };
  std::deque<End> ends;
  std::deque<uint32_t> lanes_down;  // kLaneDown notices to post (laneDownValue())
  int tcp_rail = -1;  // the TCP connections' rail in the scheduler (RAILSHARD_STRIPE_TCP)
  // A lane failed while nothing was pending with this peer (typically: it closed its
  // communicator and our credit write found its queue pair gone). Not an error until this
  // rank asks the peer for something; then it is the PeerLostError.
  std::string idle_failure;
  bool busy() const {
    if (!sending.empty() || !deferred.empty() || book.awaitsAny()) return true;
    if (!reading.empty() || !writing.empty()) return true;
    if (!awaiting_fin.empty() || !awaiting_written.empty()) return true;
    for (const Lane* lane : lanes) {
      for (const auto& flight : lane->in_flight) {
        if (flight.op && !flight.op->grant) return true;
      }
      for (const auto* table : {&lane->reads, &lane->writes}) {
        for (const auto& piece : *table) {
          if (piece.op) return true;
        }
      }
    }
    return false;
  }
};

// A failed lane's share of pending sends (SendOp) or one-sided moves (OneSidedOp), both cut into
// chunks per rail: every chunk of `rail` not yet posted is handed to `reassign` (which queues it on
// another rail), and `touched` ops that had left `pending` (fully posted) go back to its front.
template <typename Op, typename Reassign>
void takeUnposted(std::deque<std::shared_ptr<Op>>& pending, size_t rail, Reassign&& reassign) {
  for (auto& op : pending) {
    auto& chunks = op->per_rail[rail];
    for (size_t i = op->next[rail]; i < chunks.size(); ++i) {
      --op->unposted;
      reassign(op, chunks[i]);
    }
    op->next[rail] = chunks.size();
  }
}
template <typename Op>
void requeue(std::deque<std::shared_ptr<Op>>& pending,
             const std::vector<std::shared_ptr<Op>>& touched) {
  for (const auto& op : touched) {
    if (std::find(pending.begin(), pending.end(), op) == pending.end()) pending.push_front(op);
  }
}

}  // namespace railshard::transport::ibverbs
