// RAILSHARD_STRIPE_TCP: the TCP connections to a peer as one more rail of its scheduler,
// beside the RDMA lanes. Pieces the scheduler gives that rail go through the TCP transport's
// PieceLink (kPiece frames, cut and failed over across its own rails as its data is) and
// land, on the other side, through this transport's PieceSink in the same MessageBook as the
// lanes' pieces, with the same checks. A lane that fails moves its pieces to the other lanes,
// or to TCP when it was the last one.
#include <cstring>

#include "base/error.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

namespace {

// TCP service-time samples shorter than this are latency, not bandwidth.
constexpr uint64_t kMinTcpSampleBytes = uint64_t{256} << 10;

}  // namespace

bool IbverbsTransport::postTcpPieceLocked(Peer& peer, SendOp& op, size_t offset, size_t length,
                                          bool resend) {
  const uint8_t* data = op.data + offset;
  if (op.device && length > 0) {
    // Sockets cannot read GPU memory: a host copy of the piece, kept until the send completes.
    auto& host = op.tcp_host.emplace_back(length);
    if (!copyOutLocked(op, host.data(), offset, length)) return false;
    data = host.data();
  }
  messaging::PieceInfo piece{op.message, op.tag(), op.bytes(), offset, length, resend};
  RequestPtr request;
  try {
    request = tcp_link_->sendPiece(peer.rank, piece, data);
  } catch (const std::exception& e) {
    failLocked(kindOf(e), e.what());
    return false;
  }
  if (!request) {
    // The TCP transport failed (its error is the one every waiter gets).
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                         ": the TCP rail to rank " + std::to_string(peer.rank) +
                                         " failed while sending " + describe(op.tag()));
    return false;
  }
  op.tcp_parts.push_back(std::move(request));
  op.tcp_bytes += length;
  return true;
}

void IbverbsTransport::rdmaPartDoneLocked(const std::shared_ptr<SendOp>& op) {
  if (op->tcp_parts.empty()) {
    completeLocked(op);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    op->rdma_finished.store(true);
  }
  state_changed_.notify_all();
}

void IbverbsTransport::finishTcpParts(const RequestPtr& request, SendOp& op, Deadline deadline) {
  // tcp_parts is final once rdma_finished is set. Each wait raises the TCP transport's error
  // (or its timeout, naming the peer) as any of its own sends would.
  for (const RequestPtr& part : op.tcp_parts) control_->wait(part, deadline);
  const double seconds = std::chrono::duration<double>(Clock::now() - op.posted).count();
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& peer = *peers_[static_cast<size_t>(op.peer())];
  if (options_.rail_weights == RailWeights::kAdaptive && op.tcp_bytes >= kMinTcpSampleBytes &&
      seconds > 0) {
    // From posting to written (acknowledged, over several TCP rails): the rail's rate as this
    // send saw it, queueing behind the pieces before it included.
    peer.scheduler->record(peer.tcp_rail, op.tcp_bytes, seconds);
  }
  if (!request->done()) completeLocked(request);
}

messaging::PieceSink::Landing IbverbsTransport::pieceArriving(int peer_rank,
                                                              const messaging::PieceInfo& piece) {
  std::lock_guard<std::mutex> lock(mutex_);
  Landing landing;
  Peer* peer = peer_rank >= 0 && peer_rank < options_.size
                   ? peers_[static_cast<size_t>(peer_rank)].get()
                   : nullptr;
  if (peer == nullptr || peer->tcp_rail < 0) {
    landing.problem = messaging::Problem{
        ErrorKind::kProtocol,
        "rank " + std::to_string(options_.rank) + ": rank " + std::to_string(peer_rank) +
            " sent an RDMA message's piece over TCP, but this rank does not stripe over TCP to "
            "it (do all ranks use the same RAILSHARD_STRIPE_TCP?)"};
    return landing;
  }
  auto slot = std::make_unique<TcpLanding>();
  if (poisoned_.load()) {
    slot->discard = true;  // user memory is off limits after a failure
  } else {
    if (piece.resend) peer->book.allowDuplicates();
    messaging::MessageBook::Arrival arrival = peer->book.arrive(
        piece, [&](const MessageTag& theirs) { return current_.unsolicited(peer_rank, theirs); });
    if (arrival.problem) {
      landing.problem = std::move(arrival.problem);
      return landing;
    }
    slot->discard = arrival.duplicate;
    slot->entry = std::move(arrival.entry);
  }
  const bool device =
      slot->entry && !slot->entry->staging && static_cast<RecvOp&>(*slot->entry->request).device;
  if (slot->discard || device) {
    slot->bounce.resize(piece.length);
    landing.target = slot->bounce.data();
  } else {
    landing.target = slot->entry->base() + piece.offset;
  }
  tcp_landings_[{peer_rank, piece.message, piece.offset}] = std::move(slot);
  return landing;
}

void IbverbsTransport::pieceLanded(int peer_rank, const messaging::PieceInfo& piece,
                                   uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = tcp_landings_.find({peer_rank, piece.message, piece.offset});
  if (found == tcp_landings_.end()) return;
  std::unique_ptr<TcpLanding> slot = std::move(found->second);
  tcp_landings_.erase(found);
  if (slot->discard || poisoned_.load()) return;
  Peer& peer = *peers_[static_cast<size_t>(peer_rank)];
  messaging::Incoming& entry = *slot->entry;
  if (bytes == 0 && piece.length > 0) {
    // Its connection broke before a byte of it arrived: it comes again at the same offset.
    peer.book.withdraw(entry, piece.offset);
    return;
  }
  if (!slot->bounce.empty() && !copyInLocked(static_cast<RecvOp&>(*entry.request), piece.offset,
                                             slot->bounce.data(), bytes)) {
    return;
  }
  landedLocked(peer, piece.message, entry, bytes);
}

}  // namespace railshard::transport::ibverbs
