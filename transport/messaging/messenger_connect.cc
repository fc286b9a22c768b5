// Links connected and made again: the re-dial tie-break, connection on first use (a pair that
// first sends or receives dials its TCP links and exchanges its RDMA lanes' records) and the
// record exchange itself (kConnect, kConnectAck), which re-admission also takes.
#include "base/logging.h"
#include "transport/messaging/messenger_internal.h"

namespace railshard::transport::messaging {

bool Messenger::rejoinableLocked(const LinkState& link) const {
  return link.state == State::kDown && link.quiesced && link.report_sent && link.report_received &&
         link.connect == Connect::kIdle;
}

bool Messenger::redialWantedLocked(int index, uint32_t generation) const {
  const LinkState& link = *links_.at(static_cast<size_t>(index));
  if (lost_ || failed()) return false;
  if (link.state == State::kConnecting) {
    // One connection per link: not a second one while the first awaits adoption, nor the
    // peer's while this (higher) rank's own dial is under way (the peer accepts that one).
    if (link.connect == Connect::kAccepted) return false;
    if (link.connect == Connect::kAsked && group_.rank > options_.peer) return false;
    return generation == link.generation + 1;
  }
  return rejoinableLocked(link) && generation == link.generation + 1;
}

void Messenger::dialAcceptedLocked(int index) {
  LinkState& link = at(index);
  if (link.state != State::kConnecting) return;
  link.connect = Connect::kAccepted;
  link.last_attempt = now();
}

void Messenger::wantLocked() {
  if (wanted_) return;
  wanted_ = true;
  connect_asked_ = true;
  dialFirstLocked(now());
  askRecordsLocked();
}

namespace {

// A first dial that has not brought its link up by then is made again: longer than a dial
// waits for its answer (a second, TcpDriver), so that one attempt is over before the next.
constexpr Duration kFirstDialRetry = std::chrono::milliseconds(1500);

}  // namespace

void Messenger::dialFirstLocked(Clock::time_point t) {
  if (!wanted_ || lost_ || failed()) return;
  for (auto& link : links_) {
    if (link->state != State::kConnecting || !link->attributes().redials) continue;
    if (link->connect != Connect::kIdle) {
      if (t - link->last_attempt < kFirstDialRetry) continue;
      link->connect = Connect::kIdle;  // unanswered, or accepted and never adopted
    }
    link->connect = Connect::kAsked;
    link->last_attempt = t;
    link->link->redial(link->generation + 1);
  }
}

void Messenger::askRecordsLocked() {
  if (!wanted_) return;
  bool pending = false;
  for (const auto& link : links_) {
    pending = pending || (link->state == State::kConnecting && !link->attributes().redials);
  }
  // Records travel over a working link: with the TCP connection itself made on first use,
  // they wait until it is up (upLocked asks again).
  if (!pending || controlLinkLocked() == nullptr) return;
  if (options_.initiator) {
    for (auto& link : links_) {
      if (link->state == State::kConnecting && !link->attributes().redials &&
          link->connect == Connect::kIdle) {
        startConnectLocked(*link);
      }
    }
    return;
  }
  // The other rank initiates: ask it (a record-less kConnect).
  FrameHeader want;
  want.kind = static_cast<uint8_t>(FrameKind::kConnect);
  sendControlLocked(want);
}

void Messenger::startConnectLocked(LinkState& link) {
  const uint32_t generation = link.generation + 1;
  link.last_attempt = now();
  std::string record;
  try {
    record = link.link->connectRecord(generation);
  } catch (const Error& e) {
    if (!link.ever_up) {
      // Its first connection: what start-up would raise, raised now.
      failLocked(ErrorKind::kConfig,
                 "rank " + std::to_string(group_.rank) + ": " + link.attributes().name +
                     " to rank " + std::to_string(options_.peer) + ": cannot connect: " + e.what());
    } else if (!link.attempt_warned) {
      // Once per outage: it is tried again every re-admission interval while it lasts.
      link.attempt_warned = true;
      RS_LOG_WARN("rank {}: {} to rank {}: cannot make it again: {} (tried again every {:.1f} s)",
                  group_.rank, link.attributes().name, options_.peer, e.what(),
                  std::chrono::duration<double>(link.attributes().rejoin_interval).count());
    } else {
      RS_LOG_DEBUG("rank {}: {} to rank {}: cannot make it again yet: {}", group_.rank,
                   link.attributes().name, options_.peer, e.what());
    }
    return;
  }
  link.generation = generation;
  link.connect = Connect::kAsked;
  FrameHeader ask;
  ask.kind = static_cast<uint8_t>(FrameKind::kConnect);
  ask.link = static_cast<uint16_t>(link.index);
  ask.generation = generation;
  sendControlLocked(ask, record);
}

void Messenger::onConnectLocked(LinkState& link, const FrameHeader& header,
                                const std::string& record) {
  if (record.empty()) {
    // The peer wants the links connected on first use: this rank initiates.
    if (options_.initiator && !wanted_) wantLocked();
    return;
  }
  if (options_.initiator) {
    RS_LOG_WARN("rank {}: rank {} sent a connection record for {}, but this rank initiates",
                group_.rank, options_.peer, link.attributes().name);
    return;
  }
  // Any newer generation of a link that is not up, once this side is through its failover.
  if (link.up() || header.generation <= link.generation ||
      (link.state == State::kDown && link.connect == Connect::kIdle && !rejoinableLocked(link))) {
    RS_LOG_DEBUG("rank {}: connection record {} for {} from rank {} not wanted now", group_.rank,
                 header.generation, link.attributes().name, options_.peer);
    return;
  }
  std::string reply;
  try {
    reply = link.link->acceptRecord(header.generation, record);
  } catch (const Error& e) {
    RS_LOG_WARN("rank {}: {} to rank {}: cannot connect generation {}: {}", group_.rank,
                link.attributes().name, options_.peer, header.generation, e.what());
    return;
  }
  newGenerationLocked(link, header.generation);
  link.connect = Connect::kAccepted;
  FrameHeader ack;
  ack.kind = static_cast<uint8_t>(FrameKind::kConnectAck);
  ack.link = static_cast<uint16_t>(link.index);
  ack.generation = header.generation;
  sendControlLocked(ack, reply);
}

void Messenger::onConnectAckLocked(LinkState& link, const FrameHeader& header,
                                   const std::string& record) {
  if (link.connect != Connect::kAsked || header.generation != link.generation) return;  // stale
  try {
    link.link->completeRecord(header.generation, record);
  } catch (const Error& e) {
    RS_LOG_WARN("rank {}: {} to rank {}: cannot connect generation {}: {}", group_.rank,
                link.attributes().name, options_.peer, header.generation, e.what());
    link.connect = Connect::kIdle;
    return;
  }
  newGenerationLocked(link, header.generation);
  link.connect = Connect::kProbing;
  // A frame on the link itself: its completion says the path works both ways (a queue pair
  // connects without sending anything; a link whose path is still down would otherwise be
  // put back, given pieces and fail again, over and over).
  auto probe = std::make_shared<OutFrame>();
  probe->header.kind = static_cast<uint8_t>(FrameKind::kConnected);
  probe->header.link = static_cast<uint16_t>(link.index);
  probe->header.generation = header.generation;
  postFrameLocked(link, probe);
}

}  // namespace railshard::transport::messaging
