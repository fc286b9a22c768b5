// messaging::PieceLink: another layer's pieces (the RDMA transport's, striped over its lanes
// and these connections) in kPiece frames. They take the path this transport's own data takes
// (queues, rails, failover, tail stealing, detaching after a failure); only their reading
// differs: the header goes to the sink, which says where the payload lands, and the sink is
// told what landed.
#include <thread>

#include "base/error.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

namespace {

// Counts a call into the sink for setPieceSink's wait; the sink is read after counting.
class SinkCall {
 public:
  explicit SinkCall(std::atomic<int>& calls) : calls_(calls) { calls_.fetch_add(1); }
  ~SinkCall() { calls_.fetch_sub(1); }
  SinkCall(const SinkCall&) = delete;
  SinkCall& operator=(const SinkCall&) = delete;

 private:
  std::atomic<int>& calls_;
};

}  // namespace

void TcpTransport::setPieceSink(messaging::PieceSink* sink) {
  piece_sink_.store(sink);
  while (sink_calls_.load() != 0) std::this_thread::yield();
}

RequestPtr TcpTransport::sendPiece(int peer_rank, const messaging::PieceInfo& piece,
                                   const void* data) {
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("sendPiece: bad peer rank " + std::to_string(peer_rank));
  }
  // No rethrow here: the caller may hold a lock the reader needs to quiesce; it learns the
  // error from checkHealthy() later.
  if (failed_.load()) return nullptr;
  return post(peer_rank, FrameKind::kPiece, piece.message, piece, data);
}

double TcpTransport::pieceGbps(int peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= options_.peer_rails.size()) return 0;
  double sum = 0;
  for (const auto& rail : options_.peer_rails[static_cast<size_t>(peer)]) {
    if (rail.gbps <= 0) return 0;  // one unknown rail makes the sum unknown
    sum += rail.gbps;
  }
  return sum;
}

uint64_t TcpTransport::pieceBytesSent(int peer_rank) const {
  const auto& peer = peers_[static_cast<size_t>(peer_rank)];
  if (!peer) return 0;
  std::lock_guard<std::mutex> lock(peer->mutex);
  return peer->piece_bytes_sent;
}

bool TcpTransport::onPieceHeader(Peer& peer, Channel& channel) {
  const FrameHeader& header = channel.header;
  channel.piece =
      messaging::PieceInfo{header.message, header.tag,           header.total_bytes,
                           header.offset,  header.payload_bytes, header.error_kind == kPieceResent};
  SinkCall call(sink_calls_);
  messaging::PieceSink* sink = piece_sink_.load();
  messaging::PieceSink::Landing landing;
  if (sink == nullptr) {
    landing.problem = messaging::Problem{
        ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " + peerName(peer.rank) +
                                  " sent a piece of another layer's message, but no layer here "
                                  "takes them (do all ranks use the same RAILSHARD_STRIPE_TCP?)"};
  } else {
    landing = sink->pieceArriving(peer.rank, channel.piece);
  }
  if (landing.problem) {
    // The payload has nowhere safe to go; after fail() the reader drops it.
    fail(makeError(landing.problem->kind, landing.problem->text), true);
    return false;
  }
  channel.target = landing.target;
  channel.target_in.reset();
  return true;
}

void TcpTransport::onPieceLanded(Peer& peer, const messaging::PieceInfo& piece, uint64_t bytes) {
  SinkCall call(sink_calls_);
  if (messaging::PieceSink* sink = piece_sink_.load()) sink->pieceLanded(peer.rank, piece, bytes);
}

}  // namespace railshard::transport::tcp
