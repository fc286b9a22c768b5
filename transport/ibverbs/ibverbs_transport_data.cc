// The RDMA data path: posting sends and receives, cutting messages into slot-sized pieces over
// the lanes, and taking arriving pieces apart (ibverbs_transport.h has the protocol).

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "core/base/error.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

RequestPtr IbverbsTransport::isend(int peer_rank, const void* data, size_t bytes,
                                   const MessageTag& tag) {
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("isend: bad peer rank " + std::to_string(peer_rank));
  }
  Peer* peer = peers_[static_cast<size_t>(peer_rank)].get();
  if (peer == nullptr) return control_->isend(peer_rank, data, bytes, tag);
  checkHealthy();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!peer->idle_failure.empty()) {
    failLocked(ErrorKind::kPeerLost, peer->idle_failure);
    lock.unlock();
    checkHealthy();
  }
  auto op = std::make_shared<SendOp>(peer_rank, data, bytes, tag, peer->next_send++);
  if (cuda_ != nullptr && bytes > 0 && cuda_->isDeviceMemory(data))
    prepareDeviceSendLocked(*peer, *op);
  const size_t rails = peer->lanes.size();
  op->per_rail.resize(rails);
  op->next.assign(rails, 0);
  std::vector<rails::Piece> pieces;
  if (bytes > 0) {
    pieces = peer->scheduler->split(bytes);  // PeerLostError when no rail is up
  } else {
    // An empty message still travels: it carries the tag the receiver checks.
    int fastest = 0;
    for (size_t r = 0; r < rails; ++r) {
      if (peer->scheduler->gbps(static_cast<int>(r)) > peer->scheduler->gbps(fastest)) {
        fastest = static_cast<int>(r);
      }
    }
    pieces.push_back(rails::Piece{fastest, 0, 0});
  }
  for (const auto& piece : pieces) {
    const Lane& lane = *peer->lanes[static_cast<size_t>(piece.rail)];
    const size_t payload = lane.remote.slot_bytes - kHeaderBytes;
    auto& chunks = op->per_rail[static_cast<size_t>(piece.rail)];
    size_t done = 0;
    do {
      const size_t length = std::min(payload, piece.length - done);
      chunks.push_back(SendOp::Chunk{piece.offset + done, length});
      done += length;
      ++op->unposted;
    } while (done < piece.length);
  }
  peer->sending.push_back(op);
  pumpLocked(*peer);
  lock.unlock();
  raisePendingFailure();
  if (poisoned_.load()) checkHealthy();  // a failure while posting is raised here, as over TCP
  return op;
}

RequestPtr IbverbsTransport::irecv(int peer_rank, void* data, size_t bytes, const MessageTag& tag) {
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("irecv: bad peer rank " + std::to_string(peer_rank));
  }
  Peer* peer = peers_[static_cast<size_t>(peer_rank)].get();
  if (peer == nullptr) return control_->irecv(peer_rank, data, bytes, tag);
  checkHealthy();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!peer->idle_failure.empty() && peer->early.count(peer->next_recv) == 0) {
    failLocked(ErrorKind::kPeerLost, peer->idle_failure);
    lock.unlock();
    checkHealthy();
  }
  auto op = std::make_shared<RecvOp>(peer_rank, data, bytes, tag, peer->next_recv++);
  op->device = cuda_ != nullptr && bytes > 0 && cuda_->isDeviceMemory(data);
  auto early = peer->early.find(op->message);
  if (early == peer->early.end()) {
    peer->receiving.emplace(op->message, op);
    return op;
  }
  Peer::Early& staged = early->second;
  if (!(staged.tag == tag)) {
    failLocked(ErrorKind::kMismatch,
               options_.formatter.mismatch
                   ? options_.formatter.mismatch(options_.rank, tag, peer_rank, staged.tag)
                   : "tag mismatch");
  } else if (staged.total != bytes) {
    failLocked(ErrorKind::kMismatch, "rank " + std::to_string(options_.rank) + " expected " +
                                         std::to_string(bytes) + " bytes for " + describe(tag) +
                                         " but rank " + std::to_string(peer_rank) + " sent " +
                                         std::to_string(staged.total) +
                                         " (do all ranks use the same RAILSHARD_CHUNK_BYTES?)");
  } else {
    // Pieces still to come land in `data` directly; those here are copied over once (the
    // parts of the staging buffer not yet written are overwritten by those pieces later).
    if (bytes > 0 && !copyInLocked(*op, 0, staged.data.data(), bytes)) {
      lock.unlock();
      raisePendingFailure();
      checkHealthy();
    }
    op->received = staged.received;
    op->offsets = std::move(staged.offsets);
    peer->early.erase(early);
    // An early entry exists only once a piece arrived, so an empty message is complete here.
    if (op->received == bytes) {
      completeLocked(op);
    } else {
      peer->receiving.emplace(op->message, op);
    }
  }
  lock.unlock();
  raisePendingFailure();
  if (poisoned_.load()) checkHealthy();  // a mismatch with the early message is raised here
  return op;
}

void IbverbsTransport::pumpLocked(Peer& peer) {
  if (poisoned_.load()) return;  // user memory is off limits after a failure
  // Per rail, pieces go out in message order: a later message never takes a slot an earlier
  // one is waiting for.
  std::vector<bool> blocked(peer.lanes.size(), false);
  for (auto& op : peer.sending) {
    for (size_t r = 0; r < peer.lanes.size(); ++r) {
      auto& chunks = op->per_rail[r];
      Lane& lane = *peer.lanes[r];
      while (!blocked[r] && op->next[r] < chunks.size()) {
        if (lane.failed || lane.send_outstanding >= lane.send_depth) {
          blocked[r] = true;
          break;
        }
        const std::optional<uint32_t> slot = lane.send->acquire();
        if (!slot) {
          blocked[r] = true;
          break;
        }
        const SendOp::Chunk chunk = chunks[op->next[r]++];
        --op->unposted;
        lane.in_flight[*slot] = Lane::InFlight{op, chunk.offset, chunk.length, Clock::now(),
                                               trace::enabled() ? trace::now() : 0};
        postPieceLocked(lane, *op, chunk.offset, chunk.length, chunk.resend);
        if (!pending_failures_.empty()) return;
      }
      if (op->next[r] < chunks.size()) blocked[r] = true;
    }
  }
  while (!peer.sending.empty() && peer.sending.front()->unposted == 0) {
    peer.sending.pop_front();
  }
}

void IbverbsTransport::postPieceLocked(Lane& lane, SendOp& op, size_t offset, size_t length,
                                       bool resend) {
  // The slot just acquired is the one before the window's next.
  const auto slot = static_cast<uint32_t>((lane.send->written() - 1) % lane.remote.slots);
  uint8_t* base = lane.send_ring.data + size_t{slot} * lane.remote.slot_bytes;
  PieceHeader header;
  if (resend) header.magic = PieceHeader::kMagicResend;
  header.length = static_cast<uint32_t>(length);
  header.message = op.message;
  header.offset = offset;
  header.total = op.bytes();
  header.tag = op.tag();
  std::memcpy(base, &header, sizeof(header));
  ibv_sge sge[2]{};
  sge[0].addr = reinterpret_cast<uint64_t>(base);
  sge[0].lkey = lane.send_ring.mr->lkey;
  int num_sge = 1;
  if (op.device && !op.staged && length > 0) {
    // GPUDirect RDMA: the HCA reads the payload from GPU memory; only the header is staged.
    const auto& lease = op.leases[static_cast<size_t>(lane.rail)];
    sge[0].length = static_cast<uint32_t>(kHeaderBytes);
    sge[1].addr = reinterpret_cast<uint64_t>(op.data + offset);
    sge[1].length = static_cast<uint32_t>(length);
    sge[1].lkey = lease->lkey;
    num_sge = 2;
  } else {
    if (length > 0 && !copyOutLocked(op, base + kHeaderBytes, offset, length)) return;
    sge[0].length = static_cast<uint32_t>(kHeaderBytes + length);
  }
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(lane.index, WorkKind::kData, slot);
  wr.sg_list = sge;
  wr.num_sge = num_sge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(encodeImmediate(Immediate{ImmKind::kData, slot}));
  wr.wr.rdma.remote_addr = lane.remote.ring_addr + uint64_t{slot} * lane.remote.slot_bytes;
  wr.wr.rdma.rkey = lane.remote.ring_rkey;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(lane.qp, &wr, &bad); rc != 0) {
    lane.failed = true;
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) + ": " +
                                         laneName(lane) +
                                         ": ibv_post_send failed: " + std::strerror(rc) +
                                         " while sending " + describe(op.tag()));
    return;
  }
  ++lane.send_outstanding;
  ++op.outstanding;
  lane.bytes_sent += length;
}

void IbverbsTransport::onPieceLocked(Lane& lane, uint32_t slot, uint32_t byte_len) {
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  const std::string from = "rank " + std::to_string(lane.peer) + " (" + laneName(lane) + ")";
  try {
    lane.recv->arrived(slot);
  } catch (const ProtocolError& e) {
    failLocked(ErrorKind::kProtocol, std::string(e.what()) + " from " + from);
    return;
  }
  const uint8_t* base = lane.recv_ring.data + size_t{slot} * lane.local.slot_bytes;
  PieceHeader header;
  std::memcpy(&header, base, sizeof(header));
  // Everything in the header is checked before a byte of it is used.
  std::string problem;
  const bool resent = header.magic == PieceHeader::kMagicResend;
  if (resent) peer.resends_seen = true;
  // After a lane failed, a piece can arrive twice (it landed, its acknowledgement was lost,
  // it was sent again on another lane): such duplicates are dropped, anything else is an error.
  const bool duplicates_possible = peer.resends_seen;
  if (header.magic != PieceHeader::kMagic && !resent) {
    problem = "a piece without the header magic";
  } else if (byte_len != kHeaderBytes + header.length) {
    problem = "a write of " + std::to_string(byte_len) + " bytes for a piece of " +
              std::to_string(header.length);
  } else if (header.length > lane.local.slot_bytes - kHeaderBytes || header.offset > header.total ||
             header.length > header.total - header.offset) {
    problem = "a piece [" + std::to_string(header.offset) + ", +" + std::to_string(header.length) +
              ") outside its message of " + std::to_string(header.total) + " bytes";
  } else if (header.message < peer.next_recv && peer.receiving.count(header.message) == 0) {
    if (duplicates_possible) {
      lane.recv->release(slot);
      returnCreditsLocked(lane, false);
      return;
    }
    problem = "a piece of message " + std::to_string(header.message) + ", already complete";
  }
  if (!problem.empty()) {
    failLocked(ErrorKind::kProtocol,
               "rank " + std::to_string(options_.rank) + ": " + from + " sent " + problem);
    return;
  }
  auto posted = peer.receiving.find(header.message);
  if (posted != peer.receiving.end()) {
    RecvOp& op = *posted->second;
    if (!(op.tag() == header.tag)) {
      failLocked(ErrorKind::kMismatch,
                 options_.formatter.mismatch
                     ? options_.formatter.mismatch(options_.rank, op.tag(), lane.peer, header.tag)
                     : "tag mismatch");
      return;
    }
    if (op.bytes() != header.total) {
      failLocked(ErrorKind::kMismatch, "rank " + std::to_string(options_.rank) + " expected " +
                                           std::to_string(op.bytes()) + " bytes for " +
                                           describe(op.tag()) + " but rank " +
                                           std::to_string(lane.peer) + " sent " +
                                           std::to_string(header.total) +
                                           " (do all ranks use the same RAILSHARD_CHUNK_BYTES?)");
      return;
    }
    if (poisoned_.load()) return;  // the buffer may be gone
    const bool fresh = op.offsets.insert(header.offset).second;
    if (!fresh && duplicates_possible) {
      lane.recv->release(slot);
      returnCreditsLocked(lane, false);
      return;
    }
    if (!fresh || op.received + header.length > op.bytes()) {
      failLocked(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " + from +
                                           " sent more bytes of message " +
                                           std::to_string(header.message) + " than its size");
      return;
    }
    if (header.length > 0 && !copyInLocked(op, header.offset, base + kHeaderBytes, header.length)) {
      return;
    }
    op.received += header.length;
    if (op.received == op.bytes()) {
      auto request = posted->second;
      peer.receiving.erase(posted);
      completeLocked(request);
    }
  } else {
    auto found = peer.early.find(header.message);
    if (found == peer.early.end()) {
      if (auto mismatch = checkUnsolicitedLocked(lane.peer, header.tag)) {
        failLocked(ErrorKind::kMismatch, *mismatch);
        return;
      }
      Peer::Early early;
      early.tag = header.tag;
      early.total = header.total;
      early.data.resize(header.total);
      found = peer.early.emplace(header.message, std::move(early)).first;
    } else if (!(found->second.tag == header.tag) || found->second.total != header.total) {
      failLocked(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " + from +
                                           " sent pieces of message " +
                                           std::to_string(header.message) +
                                           " that disagree on its tag or size");
      return;
    }
    const bool fresh = found->second.offsets.insert(header.offset).second;
    if (!fresh && duplicates_possible) {
      lane.recv->release(slot);
      returnCreditsLocked(lane, false);
      return;
    }
    if (!fresh || found->second.received + header.length > found->second.total) {
      failLocked(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " + from +
                                           " sent more bytes of message " +
                                           std::to_string(header.message) + " than its size");
      return;
    }
    if (header.length > 0) {
      std::memcpy(found->second.data.data() + header.offset, base + kHeaderBytes, header.length);
    }
    found->second.received += header.length;
  }
  lane.recv->release(slot);
  returnCreditsLocked(lane, false);
}

void IbverbsTransport::returnCreditsLocked(Lane& lane, bool force) {
  if (lane.failed || lane.send_outstanding >= lane.send_depth) return;  // retried later
  const uint32_t batch = std::max<uint32_t>(1, lane.local.slots / 2);
  const uint32_t count = lane.recv->takeCredits(batch, force);
  if (count == 0) return;
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(lane.index, WorkKind::kCredit, count);
  wr.num_sge = 0;  // a zero-length write: only the immediate matters
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(encodeImmediate(Immediate{ImmKind::kCredit, count}));
  wr.wr.rdma.remote_addr = lane.remote.ring_addr;
  wr.wr.rdma.rkey = lane.remote.ring_rkey;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(lane.qp, &wr, &bad); rc != 0) {
    lane.failed = true;
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) + ": " +
                                         laneName(lane) +
                                         ": ibv_post_send of credits failed: " + std::strerror(rc));
    return;
  }
  ++lane.send_outstanding;
}

void IbverbsTransport::completeLocked(const std::shared_ptr<Request>& request) {
  if (trace::enabled()) traceTransfer(*request, trace_rank_.load(std::memory_order_relaxed));
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    request->markDone();
  }
  state_changed_.notify_all();
}

std::optional<std::string> IbverbsTransport::checkUnsolicitedLocked(
    int peer, const MessageTag& theirs) const {
  return unsolicitedMismatch(options_.formatter, options_.rank, in_collective_, current_, peer,
                             theirs);
}

void IbverbsTransport::enterCollective(const MessageTag& tag) {
  control_->enterCollective(tag);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = tag;
    in_collective_ = true;
    // What arrived before this rank got here.
    for (const auto& peer : peers_) {
      if (!peer) continue;
      for (const auto& [message, early] : peer->early) {
        if (auto mismatch = checkUnsolicitedLocked(peer->rank, early.tag)) {
          failLocked(ErrorKind::kMismatch, *mismatch);
          break;
        }
      }
    }
  }
  raisePendingFailure();
  checkHealthy();
}

}  // namespace railshard::transport::ibverbs
