// The write rendezvous (RAILSHARD_IB_RENDEZVOUS_VERB=write; the default on software devices,
// whose RDMA READ is slow): the sender's offer carries nothing; the receiver matches it,
// registers its destination for remote writes and answers with a grant (its address and one
// rkey per rail) in a control piece through the usual staging slot; the sender writes the
// message there with plain RDMA WRITEs striped over the lanes, completes the send once every
// write is acknowledged, and writes a zero-length kWritten on each lane it wrote on, behind
// that lane's writes (a write the HCA repeated travels ahead of it on the same queue pair);
// with them all the receiver deregisters and completes the receive. One message more than the
// read rendezvous (the grant), and the same zero copies.
//
// A remote write targets user memory here, unlike every other path: it is allowed only while
// the receive's buffer is registered, and every registration is dropped under the transport's
// lock the moment a failure poisons it (dropRendezvousLocked), before any error reaches the
// caller, so no peer can write into a buffer the caller may have freed.
//
// Run over Soft-RoCE (rdma_rxe) in the qemu guest and over the in-process emulation; NOT YET
// RUN ON RDMA HARDWARE.

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

void IbverbsTransport::grantLocked(Peer& peer, const std::shared_ptr<OneSidedOp>& op,
                                   const MessageTag& tag) {
  ReadDescriptor destination;
  destination.addr = reinterpret_cast<uint64_t>(op->local);
  for (const Lane* lane : peer.lanes) {
    destination.rkeys.push_back(op->regions.mrs[static_cast<size_t>(lane->rail)]->rkey);
  }
  peer.awaiting_written[finValue(op->message)] = op;
  // A control piece numbered as the peer's message it answers; the staged path carries it
  // (and sends it again on another lane if its own fails).
  auto grant = std::make_shared<SendOp>(peer.rank, nullptr, 0, tag, op->message);
  grant->grant = true;
  grant->descriptor = destination.encode();
  grant->per_rail.resize(static_cast<size_t>(peer.scheduler->rails()));
  grant->next.assign(grant->per_rail.size(), 0);
  const rails::Piece fastest = peer.scheduler->split(0).front();  // throws when no rail is up
  grant->per_rail[static_cast<size_t>(fastest.rail)].push_back(
      SendOp::Chunk{0, grant->descriptor.size()});
  grant->unposted = 1;
  // Ahead of this rank's own queued sends: the peer's writes wait for nothing else.
  peer.sending.push_front(grant);
  pumpLocked(peer);
}

void IbverbsTransport::onGrantLocked(Lane& lane, const PieceHeader& header,
                                     const uint8_t* payload) {
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  const auto it = peer.awaiting_fin.find(finValue(header.message));
  if (it == peer.awaiting_fin.end() || it->second->granted) {
    // Sent again after the lane carrying the first one failed unacknowledged: both arrived
    // (the first one's writes may be done already).
    RS_LOG_DEBUG("rank {}: ibverbs: a second grant for message {} from rank {}", options_.rank,
                 header.message, peer.rank);
    return;
  }
  const std::shared_ptr<SendOp> send = it->second;
  if (send->message != header.message || !send->write) {
    throw ProtocolError("a grant for message " + std::to_string(header.message) +
                        ", which was not offered for writing");
  }
  ReadDescriptor destination = ReadDescriptor::decode(payload, header.length, peer.lanes.size());
  if (poisoned_.load()) return;  // the send's buffer may be gone
  send->granted = true;
  auto op = std::make_shared<OneSidedOp>();
  op->write = true;
  op->message = send->message;
  op->send = send;
  op->remote = std::move(destination);
  op->local = const_cast<uint8_t*>(send->data);  // only read: the source of the writes
  op->total = send->bytes();
  planOneSidedLocked(peer, *op);
  peer.writing.push_back(op);
  pumpOneSidedLocked(peer, true);
}

void IbverbsTransport::onWrittenLocked(Peer& peer, uint32_t value) {
  const auto it = peer.awaiting_written.find(value & 0xffffu);
  if (it == peer.awaiting_written.end()) {
    // Sent again after the lane carrying the first one failed unacknowledged: both arrived.
    RS_LOG_DEBUG("rank {}: ibverbs: a second end of write {} from rank {}", options_.rank, value,
                 peer.rank);
    return;
  }
  // Taken only once every lane that carried writes said so.
  if (!endsComplete(it->second->ends_seen, value)) return;
  const std::shared_ptr<OneSidedOp> done = it->second;
  peer.awaiting_written.erase(it);
  finishIncomingLocked(peer, *done);
}

}  // namespace railshard::transport::ibverbs
