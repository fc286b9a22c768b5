#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "base/error.h"
#include "base/logging.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

void TcpTransport::handleReadable(Peer& peer, Channel& channel, bool after_send_failure) {
  size_t budget = after_send_failure ? SIZE_MAX : detail::kReadBudget;
  while (budget > 0 && channel.fd.valid() && (after_send_failure || !channel.lost)) {
    if (failed_.load()) {
      reader_quiesced_.store(true);
      drainAfterFailure(peer, channel);
      return;
    }
    ssize_t n;
    if (!channel.in_payload) {
      n = ::recv(channel.fd.get(), reinterpret_cast<uint8_t*>(&channel.header) + channel.header_got,
                 sizeof(FrameHeader) - channel.header_got, MSG_DONTWAIT);
    } else {
      const size_t want =
          std::min<size_t>(channel.header.payload_bytes - channel.payload_got, budget);
      n = ::recv(channel.fd.get(), channel.target + channel.payload_got, want, MSG_DONTWAIT);
    }
    if (n == 0) {
      onConnectionLost(peer, channel, "connection closed by the peer (process exited or crashed?)");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      onConnectionLost(peer, channel, "connection error: " + errnoText(errno));
      return;
    }
    bytes_received_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    channel.consumed += static_cast<uint64_t>(n);
    budget -= std::min(budget, static_cast<size_t>(n));
    if (!channel.in_payload) {
      channel.header_got += static_cast<size_t>(n);
      if (channel.header_got == sizeof(FrameHeader)) onHeader(peer, channel);
    } else {
      channel.payload_got += static_cast<size_t>(n);
      if (channel.payload_got == channel.header.payload_bytes) onPayloadComplete(peer, channel);
    }
  }
  peer.heard = Clock::now();  // heartbeat: any byte proves the peer's process runs
  if (peer.multi() && channel.fd.valid() && !channel.lost && !failed_.load()) {
    channel.last_heard = peer.heard;
    maybeAck(peer, channel);
  }
}

void TcpTransport::maybeAck(Peer& peer, Channel& channel) {
  // Acknowledge at a frame boundary once the socket has run dry (the sender then releases
  // what it kept for re-sending and times the rail), and in any case every kAckEveryBytes.
  const uint64_t unacked = channel.consumed - channel.ack_sent;
  const bool boundary = !channel.in_payload && channel.header_got == 0;
  if (unacked < detail::kAckEveryBytes && !(channel.ack_wanted && boundary)) return;
  std::lock_guard<std::mutex> lock(peer.mutex);
  // On the fastest rail rather than this one: an ack queues behind our own data on the rail
  // it takes, and a slow rail's backlog would delay it by milliseconds and make the rail look
  // slower than it is. A ping is answered on the rail it came on: that is its point.
  Channel* carrier = &channel;
  if (!channel.ping_wanted && peer.scheduler->upCount() > 0) {
    carrier = peer.channels[static_cast<size_t>(peer.scheduler->fastest())].get();
  }
  queueControlLocked(peer, *carrier, FrameKind::kAck, static_cast<uint64_t>(channel.index),
                     channel.consumed, channel.generation);
  channel.ack_sent = channel.consumed;
  channel.ack_wanted = false;
  channel.ping_wanted = false;
}

void TcpTransport::onHeader(Peer& peer, Channel& channel) {
  try {
    validateFrameHeader(channel.header);
  } catch (const ProtocolError& e) {
    fail(makeError(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " +
                                             peerName(peer.rank) +
                                             " broke the protocol: " + e.what()),
         true);
    return;
  }
  const FrameHeader& header = channel.header;
  channel.header_got = 0;
  channel.payload_got = 0;
  channel.in_payload = true;
  switch (static_cast<FrameKind>(header.kind)) {
    case FrameKind::kBye: {
      channel.in_payload = false;
      bool pending;
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        channel.bye_received = true;
        if (!peer.bye_received) {
          peer.bye_received = true;
          peer.bye_messages = header.message;
        }
        // Receives the peer will never send to (those it did send may still be arriving on
        // other rails).
        pending = peer.book.awaitsFrom(peer.bye_messages);
      }
      if (pending && !stopping_.load()) {
        fail(makeError(ErrorKind::kPeerLost,
                       "rank " + std::to_string(options_.rank) + ": " + peerName(peer.rank) +
                           " closed its communicator while this rank still waited for data "
                           "from it"),
             true);
      }
      return;
    }
    case FrameKind::kAck: {
      channel.in_payload = false;
      // For the connection `message` (in its current incarnation), whichever carried it.
      if (header.message >= peer.channels.size()) {
        fail(makeError(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " +
                                                 peerName(peer.rank) + " acknowledged connection " +
                                                 std::to_string(header.message) + " of " +
                                                 std::to_string(peer.channels.size())),
             true);
        return;
      }
      Channel& acked = *peer.channels[header.message];
      if (acked.up && static_cast<uint16_t>(header.total_bytes) == acked.generation) {
        onAck(peer, acked, header.offset, header.tag.sequence);
      }
      return;
    }
    case FrameKind::kPing:
      channel.in_payload = false;
      channel.ack_wanted = true;
      channel.ping_wanted = true;
      return;
    case FrameKind::kRailDown:
      channel.in_payload = false;
      channel.ack_wanted = true;
      if (header.message >= peer.channels.size()) {
        fail(makeError(ErrorKind::kProtocol,
                       "rank " + std::to_string(options_.rank) + ": " + peerName(peer.rank) +
                           " reported connection " + std::to_string(header.message) +
                           " down, but there are " + std::to_string(peer.channels.size())),
             true);
        return;
      }
      onRailDownReport(peer, static_cast<int>(header.message), header.offset,
                       static_cast<uint16_t>(header.total_bytes));
      return;
    case FrameKind::kAbort:
      channel.abort_text.assign(header.payload_bytes, '\0');
      channel.target = reinterpret_cast<uint8_t*>(channel.abort_text.data());
      break;
    case FrameKind::kPiece:
      if (!onPieceHeader(peer, channel)) return;
      break;
    case FrameKind::kData: {
      std::optional<messaging::Problem> problem;
      bool early = false;  // nobody asked for it yet: a receive from any source may want it
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        messaging::MessageBook::Arrival arrival = peer.book.arrive(
            messaging::PieceInfo{header.message, header.tag, header.total_bytes, header.offset,
                                 header.payload_bytes},
            [&](const MessageTag& theirs) { return current_.unsolicited(peer.rank, theirs); });
        if (arrival.entry) {
          early = arrival.entry->request == nullptr;
          channel.target = arrival.entry->base() + header.offset;
          channel.target_in = std::move(arrival.entry);
        } else {
          // TCP never delivers a piece twice: a duplicate is as wrong as any other problem.
          problem =
              arrival.problem
                  ? std::move(arrival.problem)
                  : messaging::Problem{ErrorKind::kProtocol,
                                       "rank " + std::to_string(peer.rank) + " sent a piece twice"};
        }
      }
      if (problem) {
        // The payload has nowhere safe to go; after fail() the reader drops it.
        fail(makeError(problem->kind, problem->text), true);
        return;
      }
      if (early) {
        arrivals_.fetch_add(1);
        if (waiters_.load() > 0) {
          { std::lock_guard<std::mutex> lock(state_mutex_); }
          state_changed_.notify_all();
        }
      }
      break;
    }
  }
  if (header.payload_bytes == 0) onPayloadComplete(peer, channel);
}

void TcpTransport::onPayloadComplete(Peer& peer, Channel& channel) {
  channel.in_payload = false;
  channel.header_got = 0;
  const FrameHeader& header = channel.header;
  if (static_cast<FrameKind>(header.kind) == FrameKind::kAbort) {
    // Forward it (tell_peers): a rank that fails only closes its connections after its own
    // abort frames, so every peer reads an abort before it sees that rank's connection end.
    const bool tagged = channel.abort_text.find("[reported by rank") != std::string::npos;
    if (header.message > 0 && header.message <= static_cast<uint64_t>(options_.size)) {
      recordLost(static_cast<int>(header.message - 1),
                 "reported lost by rank " + std::to_string(peer.rank) + ": " + channel.abort_text);
    }
    fail(makeError(
             static_cast<ErrorKind>(header.error_kind),
             tagged ? channel.abort_text
                    : channel.abort_text + " [reported by rank " + std::to_string(peer.rank) + "]"),
         true);
    return;
  }
  channel.ack_wanted = true;
  if (static_cast<FrameKind>(header.kind) == FrameKind::kPiece) {
    channel.target = nullptr;
    onPieceLanded(peer, channel.piece, header.payload_bytes);
    return;
  }
  messaging::IncomingPtr done;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    done = peer.book.landed(header.message, *channel.target_in, header.payload_bytes);
    // Staged, and its receive was posted meanwhile: one copy into the receive's buffer.
    if (done && done->staging && done->total > 0) {
      std::memcpy(done->user, done->staged.data(), done->total);
    }
  }
  if (done) completeRequest(*done->request);
  channel.target_in.reset();
  channel.target = nullptr;
}

void TcpTransport::onAck(Peer& peer, Channel& channel, uint64_t consumed, uint64_t peer_clock_ns) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  if (consumed <= channel.acked || consumed > channel.stream_written) return;
  const uint64_t delta = consumed - channel.acked;
  channel.acked = consumed;
  const Clock::time_point now = Clock::now();
  channel.last_progress = now;
  while (!channel.unacked.empty() && channel.unacked.front()->streamEnd() <= consumed) {
    releaseLocked(*channel.unacked.front());
    channel.unacked.pop_front();
  }
  const bool idle = channel.sends.empty() && channel.unacked.empty();
  if (peer.scheduler && options_.rail_weights == RailWeights::kAdaptive && channel.busy) {
    // Bytes delivered between acks while the connection had data to deliver: the rail's
    // rate when loaded, whatever share of the traffic it carries. Timed by the receiver's
    // clock (each ack says when it was sent), from the first ack of a busy period: acks
    // queue behind other data on their way back, by a delay that varies with the load and
    // would otherwise pass for a slower or faster rail.
    if (!channel.sample_open) {
      channel.sample_open = true;
      channel.sample_peer_ns = peer_clock_ns;
      channel.sample_bytes = 0;
    } else {
      channel.sample_bytes += delta;
    }
    if (channel.sample_bytes >= detail::kMinSampleBytes && peer_clock_ns > channel.sample_peer_ns) {
      const double seconds = static_cast<double>(peer_clock_ns - channel.sample_peer_ns) * 1e-9;
      peer.scheduler->record(channel.index, channel.sample_bytes, seconds);
      channel.sample_bytes = 0;
      channel.sample_peer_ns = peer_clock_ns;
      sizeSendBufferLocked(peer, channel);
    }
  }
  if (idle) {
    channel.busy = false;
    channel.sample_open = false;
  }
}

// A receive from any source looks ahead in the books: the first listed peer whose next message
// has begun to arrive with a tag `accept` takes; woken by each early message's first piece.
int TcpTransport::awaitArrival(const std::vector<int>& peers,
                               const std::function<bool(const MessageTag&)>& accept,
                               Deadline deadline) {
  for (int r : peers) {
    if (r < 0 || r >= options_.size || r == options_.rank) {
      throw InvalidArgument("awaitArrival: bad peer rank " + std::to_string(r));
    }
  }
  for (;;) {
    const uint64_t seen = arrivals_.load();
    if (failed_.load()) rethrowAfterQuiesce();
    for (int r : peers) {
      Peer& peer = *peers_[static_cast<size_t>(r)];
      std::lock_guard<std::mutex> lock(peer.mutex);
      const MessageTag* tag = peer.book.nextArrivedTag();
      if (tag != nullptr && accept(*tag)) return r;
    }
    if (Clock::now() >= deadline) return -1;
    waiters_.fetch_add(1);
    {
      std::unique_lock<std::mutex> lock(state_mutex_);
      state_changed_.wait_until(lock, deadline,
                                [&] { return arrivals_.load() != seen || failed_.load(); });
    }
    waiters_.fetch_sub(1);
  }
}

}  // namespace railshard::transport::tcp
