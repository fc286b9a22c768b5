#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

void TcpTransport::fail(std::exception_ptr error, bool tell_peers) {
  {
    std::unique_lock<std::mutex> lock(state_mutex_);
    if (failing_) {
      // Another thread claimed the failure and is still detaching user memory and queueing
      // abort frames; failed_ is not set yet. A user thread goes on to raise the failure
      // (rethrowAfterQuiesce), so return only once it is published: returning now let a
      // wait() that ran into its deadline return as if its receive had completed, and the
      // collective reduce a buffer that was never filled. (The one that claimed the failure
      // may re-enter from inside it, and must not wait for itself.)
      if (failing_thread_ != std::this_thread::get_id()) {
        state_changed_.wait(lock, [&] { return failed_.load(); });
      }
      return;
    }
    failing_ = true;
    failing_thread_ = std::this_thread::get_id();
    error_ = error;
  }
  if (fail_hook_for_testing_) fail_hook_for_testing_();
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
  int lost_rank = -1;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (!lost_peers_.empty()) lost_rank = lost_peers_.front().rank;
  }
  if (tell_peers && !stopping_.load()) queueAbortFrames(kind, message, lost_rank);
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    failed_.store(true);
  }
  state_changed_.notify_all();
  wake();
  {
    std::lock_guard<std::mutex> lock(listener_mutex_);
    if (failure_listener_) failure_listener_(kind, message);
  }
  // A failure this rank tells its peers about is news. One it keeps to itself is the
  // communicator being retired by shrink() or grow() while everyone re-forms: not an error.
  if (!stopping_.load()) {
    if (tell_peers) {
      RS_LOG_ERROR("{}", message);
    } else {
      RS_LOG_DEBUG("{}", message);
    }
  }
}

void TcpTransport::detachUserMemory() {
  for (auto& peer : peers_) {
    if (!peer) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    for (auto& channel : peer->channels) {
      std::deque<std::shared_ptr<Segment>> kept;
      for (auto& segment : channel->sends) {
        const bool data = isDataFrame(segment->header);
        if (segment->written > 0) {
          if (data && segment->owned.empty()) {
            // Half on the wire: finish it from a copy so the peer's parser stays in step.
            const size_t sent_payload =
                segment->written > sizeof(FrameHeader) ? segment->written - sizeof(FrameHeader) : 0;
            segment->owned.assign(reinterpret_cast<const char*>(segment->data) + sent_payload,
                                  segment->header.payload_bytes - sent_payload);
            // Re-base so that data + sent_payload points at the copy.
            segment->data = reinterpret_cast<const uint8_t*>(segment->owned.data()) - sent_payload;
          }
          segment->parent.reset();
          kept.push_back(segment);
        } else if (!data) {
          kept.push_back(segment);
        }
      }
      channel->sends.swap(kept);
      channel->unacked.clear();
    }
    peer->book.clear();
  }
}

void TcpTransport::queueAbortFrames(ErrorKind kind, const std::string& message, int lost_rank) {
  for (auto& peer : peers_) {
    if (!peer) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    if (peer->lost) continue;
    // On every connection (the first to arrive wins), behind a half-written frame, which
    // must finish first or the peer would read the abort as payload.
    for (auto& channel : peer->channels) {
      if (channel->lost) continue;
      auto abort = std::make_shared<Segment>();
      abort->owned = message.substr(0, kMaxAbortMessage);
      abort->data = reinterpret_cast<const uint8_t*>(abort->owned.data());
      abort->header.kind = static_cast<uint8_t>(FrameKind::kAbort);
      abort->header.error_kind = static_cast<uint8_t>(kind);
      abort->header.payload_bytes = abort->owned.size();
      abort->header.message = static_cast<uint64_t>(lost_rank + 1);  // 0: nobody was lost
      queueSegmentLocked(*peer, *channel, abort);
    }
  }
}

void TcpTransport::drainAfterFailure(Peer& peer, Channel& channel) {
  // After a failure nothing is parsed any more: bytes are read and dropped until the peer
  // closes, so that our own close sends a FIN rather than a reset (a reset can destroy the
  // abort message we sent the peer before it reads it).
  static thread_local std::vector<uint8_t> sink(size_t{1} << 16);
  while (true) {
    const ssize_t n = ::recv(channel.fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    bool goodbye;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      goodbye = channel.bye_received || peer.bye_received;
      closeChannelLocked(channel);
    }
    // Survivors keep a failed communicator's connections open until they shrink() or give
    // up; one that ends without a goodbye means the peer's process is gone (or left).
    if (!goodbye) recordLost(peer.rank, "its connection ended after this rank's failure");
    return;
  }
}

void TcpTransport::closeChannelLocked(Channel& channel) {
  if (channel.fd.valid()) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, channel.fd.get(), nullptr);
  channel.fd.reset();
  channel.lost = true;
}

bool TcpTransport::otherRailUpLocked(const Peer& peer, const Channel& channel) {
  for (const auto& other : peer.channels) {
    if (other.get() != &channel && other->up && !other->lost) return true;
  }
  return false;
}

bool TcpTransport::otherRailUp(Peer& peer, const Channel& channel) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  return otherRailUpLocked(peer, channel);
}

void TcpTransport::onConnectionLost(Peer& peer, Channel& channel, const std::string& reason) {
  bool graceful;
  bool pending;
  bool other_rail = false;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    graceful = channel.bye_received;
    // After its goodbye on this connection the peer sent nothing more on it; what is still
    // missing is either arriving on another rail or will never come.
    pending = !channel.sends.empty();
    if (graceful) {
      if (peer.book.awaitsFrom(peer.bye_messages)) pending = true;
    }
    other_rail = otherRailUpLocked(peer, channel);
    if (graceful && !pending) {
      // The peer said goodbye and half-closed; it is lingering for our goodbye, so the
      // socket stays open for writing until we close ourselves.
      if (channel.fd.valid())
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, channel.fd.get(), nullptr);
      channel.read_closed = true;
    }
  }
  if (graceful && !pending) {
    RS_LOG_DEBUG("rank {}: connection {} to rank {} closed", options_.rank, channel.name,
                 peer.rank);
    return;
  }
  if (closing_.load()) {
    std::lock_guard<std::mutex> lock(peer.mutex);
    closeChannelLocked(channel);
    return;
  }
  if (peer.multi() && channel.up && other_rail && !failed_.load()) {
    // One rail failed, not the peer: fail over to the others.
    railDown(peer, channel, reason);
    return;
  }
  std::string rails;
  recordLost(peer.rank, reason);
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    closeChannelLocked(channel);
    channel.up = false;
    channel.down_reason = reason;
    peer.lost = true;
    if (peer.multi()) rails = " (" + railsSummaryLocked(peer) + ")";
  }
  fail(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                           ": lost connection to " + peerName(peer.rank) + ": " +
                                           reason + rails),
       true);
}

void TcpTransport::recordLost(int peer, const std::string& reason) {
  if (peer == options_.rank) return;  // the others wrote this rank off: its own error says so
  std::lock_guard<std::mutex> lock(state_mutex_);
  for (const auto& lost : lost_peers_) {
    if (lost.rank == peer) return;
  }
  lost_peers_.push_back(LostPeer{peer, reason});
}

std::vector<LostPeer> TcpTransport::lostPeers() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return lost_peers_;
}

void TcpTransport::checkHeartbeats() {
  const Clock::time_point now = Clock::now();
  const Duration timeout = options_.heartbeat_timeout;
  // If this process itself did not run for a good part of the timeout (it was stopped, or
  // starved of CPU), the silence is ours, not the peers': start counting again. Whatever they
  // sent meanwhile (an abort, say) is read on the next turn.
  const bool we_slept = last_loop_ != Clock::time_point{} && now - last_loop_ > timeout / 2;
  last_loop_ = now;
  for (auto& peer_ptr : peers_) {
    if (!peer_ptr) continue;
    Peer& peer = *peer_ptr;
    if (peer.heard == Clock::time_point{} || we_slept) peer.heard = now;
    std::string silent;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      if (peer.lost || peer.bye_received) continue;
      if (now - peer.heartbeat_sent >= timeout / 5) {
        for (auto& channel : peer.channels) {
          if (channel->up && !channel->lost) {
            queueControlLocked(peer, *channel, FrameKind::kPing, 0, 0);
            peer.heartbeat_sent = now;
            break;
          }
        }
      }
      const Duration quiet = now - peer.heard;
      if (quiet <= timeout) continue;
      std::ostringstream text;
      text << std::fixed << std::setprecision(1) << "stopped answering: nothing heard from it for "
           << std::chrono::duration<double>(quiet).count() << " s (RAILSHARD_HEARTBEAT_TIMEOUT is "
           << std::chrono::duration<double>(timeout).count()
           << " s; the process is stopped or hung, or its host is unreachable)";
      silent = text.str();
      peer.lost = true;
    }
    recordLost(peer.rank, silent);
    fail(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) + ": " +
                                             peerName(peer.rank) + " " + silent),
         true);
    return;
  }
}

}  // namespace railshard::transport::tcp
