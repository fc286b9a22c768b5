// Rail failure (several connections to a peer): failover, stalls, tail stealing, status.
//
// Failover protocol. A connection is taken out when it errors, or when it holds undelivered
// data without progress for rail_timeout while another connection to the same peer still
// works. The rank that takes it out stops reading it, closes it, and sends the peer, on a
// working connection, a kRailDown report: how many bytes of the peer's stream on it were
// consumed (at a frame boundary, or inside a data payload, whose bytes already landed). The
// peer takes the connection out too, if it had not, and sends its own report. Each rank then
// re-sends, on the remaining connections, exactly what the other did not consume: pieces it
// never started whole, and the unconsumed tail of pieces it had written. Nothing is lost or
// delivered twice, so the receiver's byte count per message stays exact. Re-admission:
// tcp_transport_rejoin.cc.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

namespace {

std::string seconds(Duration d) {
  std::ostringstream out;
  out.precision(3);
  out << std::chrono::duration<double>(d).count() << " s";
  return out.str();
}

}  // namespace

std::string TcpTransport::railsSummaryLocked(const Peer& peer) const {
  std::string text;
  for (const auto& channel : peer.channels) {
    char rate[32] = "";
    if (peer.scheduler) {
      std::snprintf(rate, sizeof(rate), " %.3f Gbit/s", peer.scheduler->gbps(channel->index));
    }
    text += (text.empty() ? "" : ", ") + channel->name + rate + " " +
            (channel->up ? "up" : "down: " + channel->down_reason);
  }
  return text;
}

void TcpTransport::railDown(Peer& peer, Channel& channel, const std::string& why) {
  std::string summary;
  bool every_rail_down = false;
  uint64_t resent = 0;
  // Another layer's piece cut short: what landed of it is reported once the lock is released
  // (its sink takes its own lock, which is held around sendPiece calls into this transport).
  std::optional<std::pair<messaging::PieceInfo, uint64_t>> partial_piece;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!channel.up) return;
    channel.up = false;
    channel.down_reason = why;
    peer.scheduler->markDown(channel.index, why);
    closeChannelLocked(channel);  // the peer, if it can still hear, sees the close at once
    channel.write_interest = false;
    channel.busy = false;
    channel.sample_open = false;

    // How much of the peer's stream on it we consumed. Inside a data payload the bytes read
    // are in place: count them for the message, and the peer re-sends from there.
    uint64_t consumed = channel.consumed;
    if (channel.in_payload && channel.header.kind == static_cast<uint8_t>(FrameKind::kPiece) &&
        channel.target != nullptr) {
      partial_piece.emplace(channel.piece, channel.payload_got);
    } else if (channel.in_payload &&
               channel.header.kind == static_cast<uint8_t>(FrameKind::kData) && channel.target_in) {
      // Not the whole piece, so it cannot complete the message: the rest is re-sent.
      peer.book.landed(channel.header.message, *channel.target_in, channel.payload_got);
    } else if (channel.in_payload) {
      consumed -= channel.payload_got + sizeof(FrameHeader);
    } else {
      consumed -= channel.header_got;
    }
    channel.in_payload = false;
    channel.header_got = 0;
    channel.payload_got = 0;
    channel.target = nullptr;
    channel.target_in.reset();
    channel.report_consumed = consumed;
    channel.report_sent = false;

    // Our pieces on it: a half-written one waits with the written ones for the peer's report;
    // those never started go to the other rails now.
    std::vector<std::shared_ptr<Segment>> unstarted;
    for (auto& segment : channel.sends) {
      if (!isDataFrame(segment->header)) continue;
      if (segment->written > 0) {
        channel.unacked.push_back(segment);
      } else {
        unstarted.push_back(segment);
      }
    }
    channel.sends.clear();

    if (peer.scheduler->upCount() == 0) {
      every_rail_down = true;
      peer.lost = true;
      summary = railsSummaryLocked(peer);
    } else {
      for (auto& segment : unstarted) {
        resent += segment->header.payload_bytes;
        resendPieceLocked(peer, *segment, 0);
      }
      sendRailReportsLocked(peer);
      summary = railsSummaryLocked(peer);
    }
  }
  if (partial_piece) {
    onPieceLanded(peer, partial_piece->first, partial_piece->second);
  }
  if (every_rail_down) {
    fail(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                             ": lost every connection to " + peerName(peer.rank) +
                                             " (" + summary + ")"),
         true);
    return;
  }
  RS_LOG_WARN(
      "rank {}: rail {} ({} -> {}) to rank {} taken out: {}; {} unsent bytes moved to the other "
      "rails ({})",
      options_.rank, channel.name, channel.local.empty() ? "-" : channel.local, channel.remote,
      peer.rank, why, resent, summary);
}

void TcpTransport::sendRailReportsLocked(Peer& peer) {
  // Every report not yet answered goes out again with each new one: if the connection that
  // carried an earlier report died too, this one carries it.
  Channel& via = *peer.channels[static_cast<size_t>(peer.scheduler->fastest())];
  for (auto& channel : peer.channels) {
    if (channel->up || (channel->report_sent && channel->report_received)) continue;
    queueControlLocked(peer, via, FrameKind::kRailDown, static_cast<uint64_t>(channel->index),
                       channel->report_consumed, channel->generation);
    channel->report_sent = true;
  }
}

void TcpTransport::onRailDownReport(Peer& peer, int index, uint64_t consumed, uint16_t generation) {
  Channel& channel = *peer.channels[static_cast<size_t>(index)];
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!channel.up && !peer.lost && generation == static_cast<uint16_t>(channel.generation + 1)) {
      // The peer accepted our reconnection and lost it again before our side of the
      // handshake finished: we never used that incarnation. Catch up and answer (we
      // consumed nothing of it) so that the peer re-sends what it put on it.
      channel.generation = generation;
      channel.report_consumed = 0;
      channel.report_sent = false;
      channel.report_received = false;
      sendRailReportsLocked(peer);
      resendLocked(peer, channel, consumed);
      return;
    }
    // A report about an earlier life of a connection that has since been re-made: stale.
    if (generation != channel.generation) return;
  }
  if (channel.up) railDown(peer, channel, "the peer took it out");
  std::lock_guard<std::mutex> lock(peer.mutex);
  if (peer.lost || channel.report_received) return;
  resendLocked(peer, channel, consumed);
}

void TcpTransport::resendLocked(Peer& peer, Channel& channel, uint64_t consumed) {
  channel.report_received = true;
  uint64_t resent = 0;
  for (auto& segment : channel.unacked) {
    const uint64_t payload_begin = segment->stream_begin + sizeof(FrameHeader);
    if (consumed >= segment->streamEnd()) {
      releaseLocked(*segment);  // delivered before the rail failed
      continue;
    }
    const uint64_t skip = consumed > payload_begin ? consumed - payload_begin : 0;
    resent += segment->header.payload_bytes - skip;
    resendPieceLocked(peer, *segment, skip);
  }
  channel.unacked.clear();
  RS_LOG_INFO(
      "rank {}: rail {} to rank {}: the peer had consumed {} bytes of it; {} bytes "
      "re-sent on the other rails",
      options_.rank, channel.name, peer.rank, consumed, resent);
}

void TcpTransport::resendPieceLocked(Peer& peer, Segment& old, uint64_t skip) {
  const uint64_t length = old.header.payload_bytes - skip;
  std::vector<rails::Piece> pieces = peer.scheduler->split(length);
  for (const auto& p : pieces) {
    auto segment = std::make_shared<Segment>();
    segment->header = old.header;
    segment->header.offset = old.header.offset + skip + p.offset;
    segment->header.payload_bytes = p.length;
    segment->data = old.data + skip + p.offset;
    segment->retained = true;
    if (old.parent) {
      segment->parent = old.parent;
      ++old.parent->outstanding;
      ++old.parent->unwritten;
    } else {
      segment->own();  // the original was a copy already; its send has completed
    }
    queueSegmentLocked(peer, *peer.channels[static_cast<size_t>(p.rail)], segment);
  }
  if (old.parent && old.written < sizeof(FrameHeader) + old.header.payload_bytes) {
    --old.parent->unwritten;  // it never will be, the new pieces stand in
  }
  releaseLocked(old);  // the new pieces count for it now
}

bool TcpTransport::stealForLocked(Peer& peer, Channel& idle) {
  // The split at isend is only as good as the estimates; whatever they miss shows at the end
  // of a burst as one rail still draining while another idles. A rail that runs dry takes,
  // from the back of the queue that needs longest to drain, the share that makes both
  // finish together (by their current rates). Only unstarted pieces move: nothing on the
  // wire changes rails.
  Channel* donor = nullptr;
  double donor_seconds = 0;
  uint64_t donor_bytes = 0;
  for (auto& channel : peer.channels) {
    if (channel.get() == &idle || !channel->up) continue;
    uint64_t bytes = 0;
    for (const auto& segment : channel->sends) {
      if (segment->written == 0 && isDataFrame(segment->header)) {
        bytes += segment->header.payload_bytes;
      }
    }
    const double seconds =
        static_cast<double>(bytes) / std::max(1e-9, peer.scheduler->gbps(channel->index));
    if (bytes > 0 && seconds > donor_seconds) {
      donor = channel.get();
      donor_seconds = seconds;
      donor_bytes = bytes;
    }
  }
  if (donor == nullptr) return false;
  const double mine = peer.scheduler->gbps(idle.index);
  const double theirs = peer.scheduler->gbps(donor->index);
  uint64_t want = static_cast<uint64_t>(static_cast<double>(donor_bytes) * mine / (mine + theirs));
  if (want < detail::kMinStealBytes) return false;
  std::vector<std::shared_ptr<Segment>> taken;  // from the back, so in reverse order
  while (want > 0 && !donor->sends.empty()) {
    Segment& back = *donor->sends.back();
    if (back.written > 0 || !isDataFrame(back.header)) break;
    const uint64_t length = back.header.payload_bytes;
    if (length <= want) {
      taken.push_back(donor->sends.back());
      donor->sends.pop_back();
      want -= length;
      continue;
    }
    const uint64_t tail = want / 64 * 64;  // whole cache lines, whole elements
    if (tail == 0) break;
    auto piece = std::make_shared<Segment>();
    piece->header = back.header;
    piece->header.offset = back.header.offset + (length - tail);
    piece->header.payload_bytes = tail;
    piece->retained = back.retained;
    if (!back.owned.empty()) {
      piece->owned = back.owned.substr(length - tail, tail);
      piece->data = reinterpret_cast<const uint8_t*>(piece->owned.data());
    } else {
      piece->data = back.data + (length - tail);
    }
    if (back.parent) {
      piece->parent = back.parent;
      ++back.parent->outstanding;
      ++back.parent->unwritten;
    }
    back.header.payload_bytes = length - tail;
    taken.push_back(std::move(piece));
    want = 0;
  }
  if (taken.empty()) return false;
  for (auto it = taken.rbegin(); it != taken.rend(); ++it) {
    donor->payload_sent -= (*it)->header.payload_bytes;
    idle.payload_sent += (*it)->header.payload_bytes;
    idle.sends.push_back(std::move(*it));
  }
  markBusyLocked(idle);
  setWriteInterest(idle, true);
  return true;
}

void TcpTransport::checkStalls() {
  const Clock::time_point now = Clock::now();
  for (auto& peer_ptr : peers_) {
    if (!peer_ptr || !peer_ptr->multi()) continue;
    Peer& peer = *peer_ptr;
    std::vector<std::pair<Channel*, std::string>> stalled;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      if (peer.lost) continue;
      for (auto& channel : peer.channels) {
        if (!channel->up || !channel->busy) continue;
        const Duration quiet = now - channel->last_progress;
        if (quiet > options_.rail_timeout / 2 && channel->pinged < channel->last_progress) {
          // Suspicious: ask every other rail for an ack, so that a working one proves the
          // peer is alive (a rail that merely idles would otherwise prove nothing).
          channel->pinged = now;
          for (auto& other : peer.channels) {
            if (other.get() != channel.get() && other->up) {
              queueControlLocked(peer, *other, FrameKind::kPing, 0, 0);
            }
          }
        }
        if (quiet <= options_.rail_timeout) continue;
        for (auto& other : peer.channels) {
          if (other.get() != channel.get() && other->up &&
              other->last_heard > channel->last_progress) {
            stalled.emplace_back(channel.get(), "no progress for " + seconds(quiet) + " while " +
                                                    other->name + " delivered");
            break;
          }
        }
      }
    }
    for (auto& [channel, why] : stalled) railDown(peer, *channel, why);
  }
}

std::vector<RailStatus> TcpTransport::rails() const {
  std::vector<RailStatus> result;
  for (const auto& peer : peers_) {
    if (!peer) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    for (const auto& channel : peer->channels) {
      RailStatus status;
      status.peer = peer->rank;
      status.name = channel->name;
      status.local = channel->local;
      status.remote = channel->remote;
      status.up = peer->scheduler ? channel->up : !channel->lost;
      status.gbps = peer->scheduler ? peer->scheduler->gbps(channel->index) : 0;
      status.fraction =
          peer->scheduler ? peer->scheduler->fraction(channel->index) : (status.up ? 1.0 : 0.0);
      status.bytes_sent = channel->payload_sent;
      status.down_reason = channel->down_reason;
      result.push_back(status);
    }
  }
  return result;
}

void TcpTransport::breakConnectionForTesting(int peer_rank, int channel) {
  Peer& peer = *peers_.at(static_cast<size_t>(peer_rank));
  std::lock_guard<std::mutex> lock(peer.mutex);
  Channel& c = *peer.channels.at(static_cast<size_t>(channel));
  if (c.fd.valid()) ::shutdown(c.fd.get(), SHUT_RDWR);
}

}  // namespace railshard::transport::tcp
