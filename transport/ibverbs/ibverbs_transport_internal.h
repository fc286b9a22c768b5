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
// A rendezvous message is read in pieces of at most this: the unit the rail scheduler times
// and a failed lane's reads move in. Depth x piece (2 MiB) is what a lane has requested and
// not yet received: it must arrive well within the ACK timeout, or the requester retries
// reads the responder is still serving (seen over rxe with 8 x 1 MiB and a 268 ms timeout;
// 1 MiB pieces were no faster there than 256 KiB ones).
constexpr size_t kReadPieceBytes = size_t{256} << 10;
// Rendezvous sends to one peer awaiting their kFin at once: the peer's fin writes must find
// receives posted (each lane has 8 beyond its ring; credit writes take at most 2).
constexpr size_t kMaxRendezvousInFlight = 4;

// wr_id: lane index (32 bits) | kind (8) | slot, count, read slot or message (24).
enum class WorkKind : uint8_t {
  kData = 1,
  kCredit = 2,
  kRecv = 3,
  kRead = 4,
  kFin = 5,
  kNotice = 6
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
// deregisters when it has them all. Pairs of more than kMaxFinRails rails stay staged.
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
  // bytes count once, on the rank that reads them; its descriptor is no payload).
  uint64_t bytes_sent = 0;
  // Per staging slot: the message piece in flight from it.
  struct InFlight {
    std::shared_ptr<SendOp> op;
    size_t offset = 0;
    size_t bytes = 0;
    Clock::time_point posted{};
    int64_t trace_ns = 0;  // trace clock at posting; 0 when tracing was off
  };
  std::vector<InFlight> in_flight;
  // Per read slot (readDepth(); empty when the pair never reads): the rendezvous piece being
  // read with it.
  struct Reading {
    std::shared_ptr<ReadOp> op;
    size_t offset = 0;
    size_t bytes = 0;
    Clock::time_point posted{};
    int64_t trace_ns = 0;
  };
  std::vector<Reading> reads;
  // kFin writes posted on this lane, completion not yet seen: sent again on another lane if
  // this one fails.
  std::deque<uint32_t> fins;
  Clock::time_point last_completion{};  // for the rail scheduler's service-time samples
  int32_t trace_track = 0;              // this lane's track in the trace, made on first use
};

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
  // the read descriptor, is written; the peer reads the rest from `regions` and says so with
  // a kFin, which completes the send.
  bool rendezvous = false;
  bool fin = false;
  uint32_t fin_rails = 0;  // rails whose kFin arrived (bit per rail)
  UserRegions regions;
  std::vector<uint8_t> descriptor;  // the piece written: a ReadDescriptor
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

// A rendezvous message this rank reads from the peer's buffer into the receive's (or the
// staging buffer, when it arrived before its receive), in pieces over the lanes.
struct IbverbsTransport::ReadOp {
  uint64_t message = 0;
  messaging::IncomingPtr entry;
  ReadDescriptor remote;
  uint8_t* dest = nullptr;  // entry->base(), or `bounce` for a receive in device memory
  std::vector<uint8_t> bounce;
  UserRegions regions;  // dest, registered with each rail
  std::vector<std::vector<SendOp::Chunk>> per_rail;
  std::vector<size_t> next;
  size_t unposted = 0;
  size_t outstanding = 0;
  uint64_t total = 0;
  uint32_t rails_read = 0;  // rails a read of it went on (bit per rail): a kFin on each
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
  std::deque<std::shared_ptr<ReadOp>> reading;  // rendezvous reads not fully posted
  // Rendezvous sends waiting for the peer's kFin, by the low 24 bits of the message number.
  std::map<uint32_t, std::shared_ptr<SendOp>> awaiting_fin;
  // kFin writes to post: the immediate's value, and the rail it must go on (-1: any lane, its
  // own having failed).
  struct Fin {
    uint32_t value = 0;
    int rail = -1;
  };
  std::deque<Fin> fins;
  std::deque<uint32_t> lanes_down;  // kLaneDown notices to post: rails whose lane failed here
  int tcp_rail = -1;  // the TCP connections' rail in the scheduler (RAILSHARD_STRIPE_TCP)
  // A lane failed while nothing was pending with this peer (typically: it closed its
  // communicator and our credit write found its queue pair gone). Not an error until this
  // rank asks the peer for something; then it is the PeerLostError.
  std::string idle_failure;
  bool busy() const {
    if (!sending.empty() || book.awaitsAny()) return true;
    if (!reading.empty() || !awaiting_fin.empty()) return true;
    for (const Lane* lane : lanes) {
      for (const auto& flight : lane->in_flight) {
        if (flight.op) return true;
      }
      for (const auto& read : lane->reads) {
        if (read.op) return true;
      }
    }
    return false;
  }
};

// A failed lane's share of pending sends (SendOp) or reads (ReadOp), both cut into chunks per
// rail: every chunk of `rail` not yet posted is handed to `reassign` (which queues it on
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
