// The RDMA data path: posting sends and receives, cutting messages into slot-sized pieces over
// the lanes, and taking arriving pieces apart (ibverbs_transport.h has the protocol).

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/error.h"
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
  auto op = std::make_shared<SendOp>(peer_rank, data, bytes, tag, peer->book.numberSend());
  if (cuda_ != nullptr && bytes > 0 && cuda_->isDeviceMemory(data))
    prepareDeviceSendLocked(*peer, *op);
  if (!peer->connected) {
    // Lanes connected on first use: planned once one is up, in message order.
    peer->deferred.push_back(op);
    wantLocked(*peer);
    return op;
  }
  planSendLocked(*peer, op);
  lock.unlock();
  raisePendingFailure();
  if (poisoned_.load()) checkHealthy();  // a failure while posting is raised here, as over TCP
  return op;
}

void IbverbsTransport::planSendLocked(Peer& peer, const std::shared_ptr<SendOp>& op) {
  const size_t bytes = op->bytes();
  const auto rails = static_cast<size_t>(peer.scheduler->rails());  // lanes, then TCP
  op->per_rail.resize(rails);
  op->next.assign(rails, 0);
  // A rendezvous is one piece, the offer, on the fastest rail up; the one-sided pieces that
  // follow are striped (by the reader, or by this rank once granted).
  const bool rendezvous = bytes > 0 && prepareRendezvousLocked(peer, *op);
  // PeerLostError when no rail is up; an empty message is one empty piece on the fastest.
  std::vector<rails::Piece> pieces;
  try {
    pieces = peer.scheduler->split(rendezvous ? 0 : bytes);
  } catch (...) {
    op->regions.release();  // never queued: nothing else would deregister it
    throw;
  }
  if (rendezvous) pieces.front().length = op->descriptor.size();
  for (const auto& piece : pieces) {
    if (piece.rail == peer.tcp_rail) {
      // One piece: the TCP transport cuts it for its own rails.
      op->per_rail[static_cast<size_t>(piece.rail)].push_back(
          SendOp::Chunk{piece.offset, piece.length});
      ++op->unposted;
      continue;
    }
    const Lane& lane = *peer.lanes[static_cast<size_t>(piece.rail)];
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
  peer.sending.push_back(op);
  pumpLocked(peer);
}

int IbverbsTransport::awaitArrival(const std::vector<int>& peers,
                                   const std::function<bool(const MessageTag&)>& accept,
                                   Deadline deadline) {
  std::vector<int> over_tcp;
  std::vector<int> over_rdma;
  for (int r : peers) {
    if (r < 0 || r >= options_.size || r == options_.rank) {
      throw InvalidArgument("awaitArrival: bad peer rank " + std::to_string(r));
    }
    (peers_[static_cast<size_t>(r)] == nullptr ? over_tcp : over_rdma).push_back(r);
  }
  if (over_rdma.empty()) return control_->awaitArrival(over_tcp, accept, deadline);
  {
    // Nothing arrives from a peer whose lanes are not connected: connecting them is its first use.
    std::lock_guard<std::mutex> lock(mutex_);
    for (int r : over_rdma) wantLocked(*peers_[static_cast<size_t>(r)]);
  }
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    checkHealthy();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int r : over_rdma) {
        const MessageTag* tag = peers_[static_cast<size_t>(r)]->book.nextArrivedTag();
        if (tag != nullptr && accept(*tag)) return r;
      }
    }
    if (!over_tcp.empty()) {
      const int found = control_->awaitArrival(over_tcp, accept, Clock::now());
      if (found >= 0) return found;
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

RequestPtr IbverbsTransport::irecv(int peer_rank, void* data, size_t bytes, const MessageTag& tag) {
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("irecv: bad peer rank " + std::to_string(peer_rank));
  }
  Peer* peer = peers_[static_cast<size_t>(peer_rank)].get();
  if (peer == nullptr) return control_->irecv(peer_rank, data, bytes, tag);
  checkHealthy();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!peer->idle_failure.empty() && !peer->book.nextArrived()) {
    failLocked(ErrorKind::kPeerLost, peer->idle_failure);
    lock.unlock();
    checkHealthy();
  }
  wantLocked(*peer);
  auto op = std::make_shared<RecvOp>(peer_rank, data, bytes, tag);
  op->device = cuda_ != nullptr && bytes > 0 && cuda_->isDeviceMemory(data);
  messaging::MessageBook::Posted posted = peer->book.post(op, data, bytes, tag);
  if (posted.problem) {
    failLocked(posted.problem->kind, posted.problem->text);
  } else if (posted.complete) {
    // It had arrived whole before this receive: one copy out of the staging buffer.
    if (bytes == 0 || copyInLocked(*op, 0, posted.complete->staged.data(), bytes)) {
      completeLocked(op);
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
    if (op->rendezvous && op->unposted > 0 && !peer.awaiting_fin.contains(finValue(op->message))) {
      // The peer's kFin writes must find receives posted: a few offers at a time.
      if (peer.awaiting_fin.size() >= kMaxRendezvousInFlight) break;
      peer.awaiting_fin.emplace(finValue(op->message), op);
    }
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
    if (peer.tcp_rail >= 0) {
      // TCP takes every piece at once (it queues them itself), in message order.
      const auto t = static_cast<size_t>(peer.tcp_rail);
      auto& chunks = op->per_rail[t];
      bool posted = false;
      while (op->next[t] < chunks.size()) {
        const SendOp::Chunk chunk = chunks[op->next[t]++];
        --op->unposted;
        posted = true;
        if (!postTcpPieceLocked(peer, *op, chunk.offset, chunk.length, chunk.resend)) return;
      }
      if (posted && op->unposted == 0 && op->outstanding == 0) rdmaPartDoneLocked(op);
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
  if (op.grant) {
    header.magic = PieceHeader::kMagicGrant;  // a second one is told apart by its message
  } else if (op.rendezvous && op.write) {
    header.magic = resend ? PieceHeader::kMagicWriteOfferResend : PieceHeader::kMagicWriteOffer;
  } else if (op.rendezvous) {
    header.magic = resend ? PieceHeader::kMagicRendezvousResend : PieceHeader::kMagicRendezvous;
  } else if (resend) {
    header.magic = PieceHeader::kMagicResend;
  }
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
  } else if (op.rendezvous || op.grant) {
    if (length > 0) std::memcpy(base + kHeaderBytes, op.descriptor.data(), length);
    sge[0].length = static_cast<uint32_t>(kHeaderBytes + length);
  } else {
    if (length > 0 && !copyOutLocked(op, base + kHeaderBytes, offset, length)) return;
    sge[0].length = static_cast<uint32_t>(kHeaderBytes + length);
  }
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(lane.id(), WorkKind::kData, slot);
  wr.sg_list = sge;
  wr.num_sge = num_sge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(encodeImmediate(Immediate{ImmKind::kData, slot}));
  wr.wr.rdma.remote_addr = lane.remote.ring_addr + uint64_t{slot} * lane.remote.slot_bytes;
  wr.wr.rdma.rkey = lane.remote.ring_rkey;
  if (const int rc = postSend(lane, wr); rc != 0) {
    lane.failed = true;
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) + ": " +
                                         laneName(lane) +
                                         ": ibv_post_send failed: " + std::strerror(rc) +
                                         " while sending " + describe(op.tag()));
    return;
  }
  ++lane.send_outstanding;
  ++op.outstanding;
  if (!op.rendezvous && !op.grant) lane.bytes_sent += length;
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
  const bool rendezvous = header.magic == PieceHeader::kMagicRendezvous ||
                          header.magic == PieceHeader::kMagicRendezvousResend ||
                          header.magic == PieceHeader::kMagicWriteOffer ||
                          header.magic == PieceHeader::kMagicWriteOfferResend;
  const bool grant = header.magic == PieceHeader::kMagicGrant;
  if (header.magic != PieceHeader::kMagic && !resent && !rendezvous && !grant) {
    problem = "a piece without the header magic";
  } else if (byte_len != kHeaderBytes + header.length) {
    problem = "a write of " + std::to_string(byte_len) + " bytes for a piece of " +
              std::to_string(header.length);
  } else if (header.length > lane.local.slot_bytes - kHeaderBytes) {
    problem = "a piece of " + std::to_string(header.length) + " bytes in a slot of " +
              std::to_string(lane.local.slot_bytes);
  }
  if (!problem.empty()) {
    failLocked(ErrorKind::kProtocol,
               "rank " + std::to_string(options_.rank) + ": " + from + " sent " + problem);
    return;
  }
  if (rendezvous || grant) {
    if (grant) {
      onGrantLocked(lane, header, base + kHeaderBytes);
    } else {
      onRendezvousLocked(lane, header, base + kHeaderBytes);
    }
    lane.recv->release(slot);
    returnCreditsLocked(lane, false);
    return;
  }
  // After a lane failed, a piece can arrive twice (it landed, its acknowledgement was lost,
  // it was sent again on another lane): from the first re-sent piece on, the book drops such
  // duplicates; anything else is an error.
  const messaging::MessageBook::Arrival arrival = arriveLocked(
      lane,
      messaging::PieceInfo{header.message, header.tag, header.total, header.offset, header.length},
      resent);
  if (arrival.entry) {
    messaging::Incoming& entry = *arrival.entry;
    if (poisoned_.load()) return;  // the buffer may be gone
    const uint8_t* payload = base + kHeaderBytes;
    if (entry.staging) {
      if (header.length > 0)
        std::memcpy(entry.staged.data() + header.offset, payload, header.length);
    } else if (header.length > 0 && !copyInLocked(static_cast<RecvOp&>(*entry.request),
                                                  header.offset, payload, header.length)) {
      return;
    }
    if (!landedLocked(peer, header.message, entry, header.length)) return;
  }
  lane.recv->release(slot);
  returnCreditsLocked(lane, false);
}

bool IbverbsTransport::landedLocked(Peer& peer, uint64_t message, messaging::Incoming& entry,
                                    uint64_t bytes) {
  messaging::IncomingPtr done = peer.book.landed(message, entry, bytes);
  if (!done) return true;
  // Staged, and its receive was posted meanwhile: one copy into the receive's buffer.
  if (done->staging && done->total > 0 &&
      !copyInLocked(static_cast<RecvOp&>(*done->request), 0, done->staged.data(), done->total)) {
    return false;
  }
  completeLocked(done->request);
  return true;
}

messaging::MessageBook::Arrival IbverbsTransport::arriveLocked(Lane& lane,
                                                               const messaging::PieceInfo& piece,
                                                               bool resent) {
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  if (resent) peer.book.allowDuplicates();
  messaging::MessageBook::Arrival arrival = peer.book.arrive(
      piece, [&](const MessageTag& theirs) { return current_.unsolicited(lane.peer, theirs); });
  if (arrival.problem) {
    failLocked(arrival.problem->kind, arrival.problem->kind == ErrorKind::kProtocol
                                          ? arrival.problem->text + " (on " + laneName(lane) + ")"
                                          : arrival.problem->text);
    arrival.entry = nullptr;
  }
  return arrival;
}

void IbverbsTransport::returnCreditsLocked(Lane& lane, bool force) {
  if (lane.failed || lane.send_outstanding >= lane.send_depth) return;  // retried later
  const uint32_t batch = std::max<uint32_t>(1, lane.local.slots / 2);
  const uint32_t count = lane.recv->takeCredits(batch, force);
  if (count == 0) return;
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(lane.id(), WorkKind::kCredit, count);
  wr.num_sge = 0;  // a zero-length write: only the immediate matters
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(encodeImmediate(Immediate{ImmKind::kCredit, count}));
  wr.wr.rdma.remote_addr = lane.remote.ring_addr;
  wr.wr.rdma.rkey = lane.remote.ring_rkey;
  if (const int rc = postSend(lane, wr); rc != 0) {
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

void IbverbsTransport::enterCollective(const MessageTag& tag) {
  control_->enterCollective(tag);
  current_.enter(tag);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // What arrived before this rank got here.
    for (const auto& peer : peers_) {
      if (!peer) continue;
      if (auto mismatch = peer->book.checkStaged(
              [&](const MessageTag& theirs) { return current_.unsolicited(peer->rank, theirs); })) {
        failLocked(ErrorKind::kMismatch, *mismatch);
        break;
      }
    }
  }
  raisePendingFailure();
  checkHealthy();
}

}  // namespace railshard::transport::ibverbs
