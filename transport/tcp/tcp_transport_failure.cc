#include "transport/tcp/tcp_transport.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/base/error.h"
#include "core/base/logging.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

void TcpTransport::fail(std::exception_ptr error, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (failing_) return;
    failing_ = true;
    error_ = error;
  }
  ErrorKind kind = ErrorKind::kGeneric;
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    kind = kindOf(e);
    message = e.what();
  }
  // Before anyone learns of the failure (and may free the buffers of the collective that
  // failed), stop using user memory: unstarted sends are dropped, a half-written one keeps a
  // private copy of its remainder. The reader stops writing into receive buffers once it
  // sees failed_, and waiters wait for it to say so (reader_quiesced_).
  detachUserMemory();
  if (tell_peers && !stopping_.load()) queueAbortFrames(kind, message);
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    failed_.store(true);
  }
  state_changed_.notify_all();
  wake();
  if (!stopping_.load()) RS_LOG_ERROR("{}", message);
}

void TcpTransport::detachUserMemory() {
  for (auto& peer : peers_) {
    if (!peer) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    std::deque<std::shared_ptr<SendOp>> kept;
    for (auto& op : peer->sends) {
      if (op->internal) {
        kept.push_back(op);
      } else if (op->written > 0) {
        const size_t sent_payload =
            op->written > sizeof(FrameHeader) ? op->written - sizeof(FrameHeader) : 0;
        op->owned.assign(reinterpret_cast<const char*>(op->data) + sent_payload,
                         op->header.payload_bytes - sent_payload);
        // Re-base so that data + sent_payload points at the copy.
        op->data = reinterpret_cast<const uint8_t*>(op->owned.data()) - sent_payload;
        op->internal = true;
        kept.push_back(op);
      }
    }
    peer->sends.swap(kept);
    peer->recvs.clear();
  }
}

void TcpTransport::queueAbortFrames(ErrorKind kind, const std::string& message) {
  for (auto& peer : peers_) {
    if (!peer) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    if (peer->lost) continue;
    // A half-written frame (detached by detachUserMemory) must finish first or the peer
    // would read the abort as payload.
    auto abort = std::make_shared<SendOp>(peer->rank, nullptr, 0, MessageTag{}, true);
    abort->owned = message.substr(0, kMaxAbortMessage);
    abort->data = reinterpret_cast<const uint8_t*>(abort->owned.data());
    abort->header.kind = static_cast<uint8_t>(FrameKind::kAbort);
    abort->header.error_kind = static_cast<uint8_t>(kind);
    abort->header.payload_bytes = abort->owned.size();
    peer->sends.push_back(abort);
    flushSendsLocked(*peer);
    if (!peer->sends.empty()) setWriteInterest(*peer, true);
  }
}

void TcpTransport::drainAfterFailure(Peer& peer) {
  // After a failure nothing is parsed any more: bytes are read and dropped until the peer
  // closes, so that our own close sends a FIN rather than a reset (a reset can destroy the
  // abort message we sent the peer before it reads it).
  static thread_local std::vector<uint8_t> sink(size_t{1} << 16);
  while (true) {
    const ssize_t n = ::recv(peer.fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    std::lock_guard<std::mutex> lock(peer.mutex);
    peer.lost = true;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, peer.fd.get(), nullptr);
    peer.fd.reset();
    return;
  }
}

void TcpTransport::onConnectionLost(Peer& peer, const std::string& reason) {
  bool graceful;
  bool pending;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    graceful = peer.bye_received;
    pending = !peer.recvs.empty() || !peer.sends.empty();
    if (peer.fd.valid()) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, peer.fd.get(), nullptr);
    if (graceful && !pending) {
      // The peer said goodbye and half-closed; it is lingering for our goodbye, so the
      // socket stays open for writing until we close ourselves.
      peer.read_closed = true;
    } else {
      peer.lost = true;
      peer.fd.reset();
    }
  }
  if (closing_.load() || (graceful && !pending)) {
    RS_LOG_DEBUG("rank {}: connection to rank {} closed", options_.rank, peer.rank);
    return;
  }
  fail(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                           ": lost connection to " + peerName(peer.rank) + ": " +
                                           reason),
       true);
}

}  // namespace railshard::transport::tcp
