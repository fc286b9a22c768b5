// Zero-copy rendezvous for large host messages (RAILSHARD_IB_RENDEZVOUS bytes and more).
//
// Read rendezvous: the sender registers its buffer with every rail of the pair and writes one
// piece, the read descriptor (address and one rkey per rail), through the usual staging slot;
// the receiver matches it like any piece (MessageBook: tag and size checks, early messages),
// registers its destination (the receive's buffer, or the staging buffer when the receive is
// not posted yet) and reads the message with RDMA READs straight into it, cut into pieces
// striped over the lanes by the rail scheduler, which times them as it times writes. When
// every read is done it writes a zero-length kFin on each lane it read on (behind any read
// request the HCA repeated there); with all of them the sender deregisters and completes the
// send. Each byte crosses the wire once and no CPU copies it (the staged path copies it
// twice). The write rendezvous (ibverbs_transport_rendezvous_write.cc) shares the matching,
// the registration, the striping and the failover here; only who posts the pieces differs.
//
// Registration is per message: the sender's buffer from isend() until the kFin, the receiver's
// until its last read. A cache of host registrations would save the pinning on every message
// but cannot see free(): a later buffer at the same address would be read from the old pages
// (docs/rdma.md "Zero-copy rendezvous"). After any failure every registration is dropped at
// once under the transport's lock, so no HCA reads or writes a user buffer once the caller
// may have freed it: a peer still reading gets a remote access error, our own reads in flight
// a local protection error, and both are failures already being reported.
//
// Run over Soft-RoCE (rdma_rxe) in the qemu guest and over the in-process emulation; NOT YET
// RUN ON RDMA HARDWARE.

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

bool IbverbsTransport::prepareRendezvousLocked(Peer& peer, SendOp& op) {
  if (rendezvous_bytes_ == 0 || op.bytes() < rendezvous_bytes_ || op.device || peer.tcp_rail >= 0) {
    return false;
  }
  if (peer.lanes.size() > kMaxFinRails) return false;
  bool write = write_rendezvous_;
  for (const Lane* lane : peer.lanes) {
    if (lane->reads.empty()) write = true;  // the peer (or this HCA) does not read
  }
  op.regions.api = &api_;
  op.regions.mrs.assign(rails_.size(), nullptr);
  ReadDescriptor descriptor;
  descriptor.addr = reinterpret_cast<uint64_t>(op.data);
  for (const Lane* lane : peer.lanes) {
    const auto rail = static_cast<size_t>(lane->rail);
    // ibv_reg_mr takes a non-const pointer; with remote read (or local access) only, the pages
    // are never written.
    ibv_mr* mr = api_.reg_mr(rails_[rail]->pd, const_cast<uint8_t*>(op.data), op.bytes(),
                             write ? 0 : IBV_ACCESS_REMOTE_READ);
    if (mr == nullptr) {
      const int err = errno;
      op.regions.release();
      op.regions.mrs.clear();
      if (!rendezvous_logged_) {
        rendezvous_logged_ = true;
        RS_LOG_WARN(
            "rank {}: ibv_reg_mr of a {}-byte send buffer failed ({}): large messages are "
            "copied through the staging slots instead of moved in place (raise `ulimit -l`, "
            "or set RAILSHARD_IB_RENDEZVOUS=0 to stop trying)",
            options_.rank, op.bytes(), std::strerror(err));
      }
      return false;
    }
    op.regions.mrs[rail] = mr;
    descriptor.rkeys.push_back(mr->rkey);
  }
  op.rendezvous = true;
  op.write = write;
  if (!write) op.descriptor = descriptor.encode();  // a write offer carries nothing
  return true;
}

void IbverbsTransport::onRendezvousLocked(Lane& lane, const PieceHeader& header,
                                          const uint8_t* payload) {
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  const std::string from = "rank " + std::to_string(lane.peer) + " (" + laneName(lane) + ")";
  const bool write = header.magic == PieceHeader::kMagicWriteOffer ||
                     header.magic == PieceHeader::kMagicWriteOfferResend;
  ReadDescriptor remote;
  try {
    if (write) {
      if (header.length != 0) throw ProtocolError("a write offer with a payload");
      if (peer.lanes.size() > kMaxFinRails) throw ProtocolError("a write offer on too many rails");
    } else {
      remote = ReadDescriptor::decode(payload, header.length, peer.lanes.size());
      for (const Lane* other : peer.lanes) {
        if (other->reads.empty()) throw ProtocolError("a read offer on a pair that does not read");
      }
    }
  } catch (const ProtocolError& e) {
    failLocked(ErrorKind::kProtocol,
               "rank " + std::to_string(options_.rank) + ": " + from + " sent " + e.what());
    return;
  }
  // The whole message as one piece: the book checks it as it checks written pieces.
  const bool resent = header.magic == PieceHeader::kMagicRendezvousResend ||
                      header.magic == PieceHeader::kMagicWriteOfferResend;
  const messaging::MessageBook::Arrival arrival = arriveLocked(
      lane, messaging::PieceInfo{header.message, header.tag, header.total, 0, header.total},
      resent);
  if (!arrival.entry || poisoned_.load()) return;  // a duplicate offer, or the buffer may be gone
  if (peer.tcp_rail >= 0) {
    failLocked(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " + from +
                                         " offered a rendezvous on a pair striped over TCP");
    return;
  }
  auto op = std::make_shared<OneSidedOp>();
  op->write = write;
  op->message = header.message;
  op->entry = arrival.entry;
  op->remote = std::move(remote);
  op->total = header.total;
  messaging::Incoming& entry = *op->entry;
  if (!entry.staging && static_cast<RecvOp&>(*entry.request).device) {
    op->bounce.resize(op->total);  // GPU memory: moved to the host, then copied in
    op->local = op->bounce.data();
  } else {
    op->local = entry.base();
  }
  const std::string what = describe(header.tag) + " from rank " + std::to_string(lane.peer);
  if (write) {
    // The sender writes into it: the grant names it (ibverbs_transport_rendezvous_write.cc).
    if (registerDestinationLocked(peer, *op, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                  what)) {
      grantLocked(peer, op, header.tag);
    }
    return;
  }
  // Planned before anything is registered: split() throws when no rail is up.
  planOneSidedLocked(peer, *op);
  if (!registerDestinationLocked(peer, *op, IBV_ACCESS_LOCAL_WRITE, what)) return;
  peer.reading.push_back(op);
  pumpOneSidedLocked(peer, false);
}

bool IbverbsTransport::registerDestinationLocked(Peer& peer, OneSidedOp& op, int access,
                                                 const std::string& what) {
  op.regions.api = &api_;
  op.regions.mrs.assign(rails_.size(), nullptr);
  for (const Lane* lane : peer.lanes) {
    const auto rail = static_cast<size_t>(lane->rail);
    ibv_mr* mr = api_.reg_mr(rails_[rail]->pd, op.local, op.total, access);
    if (mr == nullptr) {
      const int err = errno;
      op.regions.release();
      failLocked(ErrorKind::kGeneric,
                 "rank " + std::to_string(options_.rank) + ": ibv_reg_mr of a " +
                     std::to_string(op.total) + "-byte receive buffer for " + what +
                     " failed: " + std::strerror(err) +
                     " (raise `ulimit -l`, or set RAILSHARD_IB_RENDEZVOUS=0 on every rank)");
      return false;
    }
    op.regions.mrs[rail] = mr;
  }
  return true;
}

void IbverbsTransport::planOneSidedLocked(Peer& peer, OneSidedOp& op) {
  // Striped as a staged send of the same size would be; each rail's share in pieces.
  op.per_rail.assign(peer.lanes.size(), {});
  op.next.assign(peer.lanes.size(), 0);
  for (const auto& piece : peer.scheduler->split(op.total)) {
    auto& chunks = op.per_rail[static_cast<size_t>(piece.rail)];
    for (size_t done = 0; done < piece.length;) {
      const size_t length = std::min(kOneSidedPieceBytes, piece.length - done);
      chunks.push_back(SendOp::Chunk{piece.offset + done, length});
      done += length;
      ++op.unposted;
    }
  }
}

void IbverbsTransport::pumpOneSidedLocked(Peer& peer, bool write) {
  if (poisoned_.load()) return;
  auto& pending = write ? peer.writing : peer.reading;
  std::vector<bool> blocked(peer.lanes.size(), false);
  for (auto& op : pending) {
    for (size_t r = 0; r < peer.lanes.size(); ++r) {
      auto& chunks = op->per_rail[r];
      Lane& lane = *peer.lanes[r];
      auto& table = lane.slotsFor(write);
      while (!blocked[r] && op->next[r] < chunks.size()) {
        const auto free_slot = std::find_if(table.begin(), table.end(),
                                            [](const Lane::OneSided& piece) { return !piece.op; });
        if (lane.failed || lane.send_outstanding >= lane.send_depth || free_slot == table.end()) {
          blocked[r] = true;
          break;
        }
        const SendOp::Chunk chunk = chunks[op->next[r]++];
        --op->unposted;
        const auto slot = static_cast<uint32_t>(free_slot - table.begin());
        const auto rail = static_cast<size_t>(lane.rail);
        ibv_sge sge{};
        sge.addr = reinterpret_cast<uint64_t>(op->local + chunk.offset);
        sge.length = static_cast<uint32_t>(chunk.length);
        sge.lkey = op->lkey(rail);
        ibv_send_wr wr{};
        wr.wr_id = makeWorkId(lane.id(), write ? WorkKind::kWrite : WorkKind::kRead, slot);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = op->remote.addr + chunk.offset;
        wr.wr.rdma.rkey = op->remote.rkeys[rail];
        if (const int rc = postSend(lane, wr); rc != 0) {
          lane.failed = true;
          failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) + ": " +
                                               laneName(lane) + ": ibv_post_send of a " +
                                               (write ? "rendezvous write" : "read") +
                                               " failed: " + std::strerror(rc));
          return;
        }
        *free_slot = Lane::OneSided{op, chunk.offset, chunk.length, Clock::now(),
                                    trace::enabled() ? trace::now() : 0};
        ++lane.send_outstanding;
        ++op->outstanding;
        op->rails_used |= 1u << lane.rail;
      }
      if (op->next[r] < chunks.size()) blocked[r] = true;
    }
  }
  while (!pending.empty() && pending.front()->unposted == 0) pending.pop_front();
}

void IbverbsTransport::onOneSidedDoneLocked(Lane& lane, uint32_t slot, bool write) {
  auto& table = lane.slotsFor(write);
  if (slot >= table.size() || !table[slot].op) {
    throw ProtocolError(std::string("a ") + (write ? "rendezvous write" : "read") +
                        " completion for an idle slot " + std::to_string(slot));
  }
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  Lane::OneSided done = std::move(table[slot]);
  table[slot] = Lane::OneSided{};
  --lane.send_outstanding;
  const Clock::time_point now = Clock::now();
  const Clock::time_point start = std::max(done.posted, lane.last_completion);
  lane.last_completion = now;
  lane.bytes_sent += done.bytes;
  lane.bytes_in_place += done.bytes;
  if (done.trace_ns != 0 && trace::enabled())
    traceRailLocked(lane, done.bytes, done.trace_ns, write ? "rdma_write" : "rdma_read");
  if (done.bytes > 0 && now > start && options_.rail_weights == RailWeights::kAdaptive) {
    peer.scheduler->record(lane.rail, done.bytes,
                           std::chrono::duration<double>(now - start).count());
  }
  OneSidedOp& op = *done.op;
  --op.outstanding;
  if (op.unposted > 0 || op.outstanding > 0) return;
  const ImmKind end = write ? ImmKind::kWritten : ImmKind::kFin;
  if (write) {
    // Every write acknowledged: the send is done, its buffer no longer needed.
    const std::shared_ptr<SendOp> send = op.send;
    send->regions.release();
    peer.awaiting_fin.erase(finValue(op.message));
    if (poisoned_.load()) return;
    send->fin = true;
    maybeSendDoneLocked(send);
  } else if (!finishIncomingLocked(peer, op)) {
    return;
  }
  // One end on each lane the pieces went on, behind them there.
  const auto lanes = static_cast<uint32_t>(__builtin_popcount(op.rails_used));
  for (uint32_t rail = 0; rail < kMaxFinRails; ++rail) {
    if ((op.rails_used & (1u << rail)) == 0) continue;
    peer.ends.push_back(
        Peer::End{Immediate{end, finImmediate(op.message, rail, lanes)}, static_cast<int>(rail)});
  }
  pumpEndsLocked(peer);
  if (write) pumpLocked(peer);  // room for the next offer
}

bool IbverbsTransport::finishIncomingLocked(Peer& peer, OneSidedOp& op) {
  op.regions.release();
  if (poisoned_.load()) return false;  // the buffer may be gone
  messaging::Incoming& entry = *op.entry;
  if (!op.bounce.empty() &&
      !copyInLocked(static_cast<RecvOp&>(*entry.request), 0, op.bounce.data(), op.total)) {
    return false;
  }
  return landedLocked(peer, op.message, entry, op.total);
}

void IbverbsTransport::pumpEndsLocked(Peer& peer) {
  if (poisoned_.load()) return;
  // Lane-down notices first (they unblock the peer), then ends of reads and writes.
  while (!peer.lanes_down.empty() || !peer.ends.empty()) {
    const bool notice = !peer.lanes_down.empty();
    const int rail = notice ? -1 : peer.ends.front().rail;
    const auto room = [](const Lane* lane) {
      return !lane->failed && lane->send_outstanding < lane->send_depth;
    };
    Lane* lane = nullptr;
    if (rail >= 0 && !peer.lanes[static_cast<size_t>(rail)]->failed) {
      // Its own lane, behind its pieces; when that lane is busy, wait for room there.
      lane = peer.lanes[static_cast<size_t>(rail)];
      if (!room(lane)) return;
    } else {
      for (Lane* candidate : peer.lanes) {
        if (room(candidate)) {
          lane = candidate;
          break;
        }
      }
    }
    if (lane == nullptr) return;  // posted when a completion frees room (or a lane fails over)
    const Immediate imm =
        notice ? Immediate{ImmKind::kLaneDown, peer.lanes_down.front()} : peer.ends.front().imm;
    ibv_send_wr wr{};
    wr.wr_id = makeWorkId(lane->id(), notice ? WorkKind::kNotice : WorkKind::kFin, imm.value);
    wr.num_sge = 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(encodeImmediate(imm));
    wr.wr.rdma.remote_addr = lane->remote.ring_addr;
    wr.wr.rdma.rkey = lane->remote.ring_rkey;
    if (const int rc = postSend(*lane, wr); rc != 0) {
      lane->failed = true;
      failLocked(ErrorKind::kPeerLost,
                 "rank " + std::to_string(options_.rank) + ": " + laneName(*lane) +
                     ": ibv_post_send of a rendezvous end failed: " + std::strerror(rc));
      return;
    }
    ++lane->send_outstanding;
    if (notice) {
      peer.lanes_down.pop_front();  // best effort: a lane failing under it is noticed itself
      continue;
    }
    peer.ends.pop_front();
    lane->ends.push_back(imm);
  }
}

void IbverbsTransport::onFinLocked(Peer& peer, uint32_t value) {
  const auto it = peer.awaiting_fin.find(value & 0xffffu);
  if (it == peer.awaiting_fin.end()) {
    // Sent again after the lane carrying the first one failed unacknowledged: both arrived.
    RS_LOG_DEBUG("rank {}: ibverbs: a second end of read {} from rank {}", options_.rank, value,
                 peer.rank);
    return;
  }
  const std::shared_ptr<SendOp> op = it->second;
  if (op->write) throw ProtocolError("a read's end for a message offered for writing");
  // Deregistered only once every lane that read it said so.
  if (!endsComplete(op->fin_rails, value)) return;
  peer.awaiting_fin.erase(it);
  op->regions.release();
  op->fin = true;
  maybeSendDoneLocked(op);
  pumpLocked(peer);  // room for the next rendezvous offer
}

void IbverbsTransport::maybeSendDoneLocked(const std::shared_ptr<SendOp>& op) {
  if (op->grant) return;  // a control piece: nobody waits for it
  if (op->unposted == 0 && op->outstanding == 0 && (!op->rendezvous || op->fin)) {
    rdmaPartDoneLocked(op);
  }
}

void IbverbsTransport::failOverOneSidedLocked(Lane& lane) {
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  std::vector<size_t> up;
  for (const Lane* other : peer.lanes) {
    if (!other->failed) up.push_back(static_cast<size_t>(other->rail));
  }
  if (up.empty()) return;  // the caller reports the peer lost
  size_t next = 0;
  std::vector<std::shared_ptr<OneSidedOp>> touched[2];  // reads, writes
  auto reassign = [&](const std::shared_ptr<OneSidedOp>& op, SendOp::Chunk chunk) {
    op->per_rail[up[next++ % up.size()]].push_back(chunk);
    ++op->unposted;
    touched[op->write ? 1 : 0].push_back(op);
  };
  // A read or a write of the same bytes to the same place is idempotent: one that failed may
  // have landed part of its bytes; it is done again.
  for (auto* table : {&lane.reads, &lane.writes}) {
    for (auto& piece : *table) {
      if (!piece.op) continue;
      --piece.op->outstanding;
      reassign(piece.op, SendOp::Chunk{piece.offset, piece.bytes});
      piece = Lane::OneSided{};
    }
  }
  takeUnposted(peer.reading, static_cast<size_t>(lane.rail), reassign);
  takeUnposted(peer.writing, static_cast<size_t>(lane.rail), reassign);
  requeue(peer.reading, touched[0]);
  requeue(peer.writing, touched[1]);
  // Ends that may not have arrived: sent again (a second one is ignored).
  for (auto end = lane.ends.rbegin(); end != lane.ends.rend(); ++end) {
    peer.ends.push_front(Peer::End{*end, -1});
  }
  lane.ends.clear();
  pumpOneSidedLocked(peer, false);
  pumpOneSidedLocked(peer, true);
  pumpEndsLocked(peer);
}

void IbverbsTransport::dropRendezvousLocked() {
  for (auto& peer : peers_) {
    if (!peer) continue;
    // A write in progress holds its send, which stays in awaiting_fin until it is done.
    for (auto& op : peer->sending) op->regions.release();
    for (auto& [value, op] : peer->awaiting_fin) op->regions.release();
    for (auto& op : peer->reading) op->regions.release();
    for (auto& [value, op] : peer->awaiting_written) op->regions.release();
    for (Lane* lane : peer->lanes) {
      for (auto* table : {&lane->reads, &lane->writes}) {
        for (auto& piece : *table) {
          if (!piece.op) continue;
          piece.op->regions.release();
          if (piece.op->send) piece.op->send->regions.release();
        }
      }
    }
  }
}

}  // namespace railshard::transport::ibverbs
