// Links failing and coming back: failover with exact re-sending, stalled links, heartbeats
// and re-admission (the connection exchange itself: messenger_connect.cc).
//
// Failover. A link is taken out when its driver reports it broken, when it holds undelivered
// frames without progress for rail_timeout while another link still works, or when the peer
// says it took it out. The rank that takes it out shuts it down and, once nothing more can
// arrive on it (quiescedLocked), sends the peer, on a working link, a kLinkDown report: how many
// of the peer's sequenced frames on it it took whole. The peer takes the link out too, if it
// had not, and reports likewise. Each rank then re-sends, on the remaining links, exactly the
// frames the other did not take (a frame cut short by the failure landed nothing: it comes
// again whole). Frames never posted on the link move at once. Nothing is lost or delivered
// twice, so the receiver's count per message stays exact.
//
// Re-admission. Once both ranks are through a link's failover, the initiating rank (the higher
// of the pair) makes it again every rejoin interval: its driver dials again (TCP), or the two
// sides exchange connection records over a working link (an RDMA lane: kConnect, kConnectAck,
// then a kConnected frame on the lane itself, whose completion proves the path works both
// ways; messenger_connect.cc). A link connected on first use takes the same exchange at
// generation 1.
#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "base/logging.h"
#include "transport/messaging/messenger_internal.h"

namespace railshard::transport::messaging {

namespace {

std::string seconds(Duration d) {
  std::ostringstream out;
  out.precision(3);
  out << std::chrono::duration<double>(d).count() << " s";
  return out.str();
}

}  // namespace

bool Messenger::dataLinkUpLocked() const {
  for (const auto& link : links_) {
    if (link->data() && link->up()) return true;
  }
  return false;
}

bool Messenger::dataLinkComingLocked() const {
  for (const auto& link : links_) {
    if (link->data() && link->state == State::kConnecting) return true;
  }
  return false;
}

std::string Messenger::linksSummaryLocked() const {
  std::string text;
  for (const auto& link : links_) {
    if (!link->data()) continue;
    char rate[32] = "";
    if (data_links_ > 1)
      std::snprintf(rate, sizeof(rate), " %.3f Gbit/s", scheduler_->gbps(link->rail));
    text +=
        (text.empty() ? "" : ", ") + link->attributes().name + rate + " " + linkStateLocked(*link);
  }
  return text;
}

std::string Messenger::linkStateLocked(const LinkState& link) const {
  if (link.up()) return "up";
  return "down: " + (link.down_reason.empty() ? std::string("not connected") : link.down_reason);
}

void Messenger::linkFailedLocked(int index, const std::string& why, bool peer_closed) {
  LinkState& link = at(index);
  if (link.connect != Connect::kIdle && !link.up()) {
    // An attempt to (re)connect it failed (its probe, say): its new connection goes, and it is
    // tried again later, once nothing more completes on it.
    RS_LOG_DEBUG("rank {}: {} to rank {}: connecting failed: {}; tried again later", group_.rank,
                 link.attributes().name, options_.peer, why);
    link.connect = Connect::kIdle;
    link.quiesced = false;
    link.link->shutdown();
    return;
  }
  if (!link.up()) return;
  // After its goodbye on this link the peer sent nothing more on it: closed, not failed (its
  // status stays as it was; nothing more goes to a peer that said goodbye) — unless a move in
  // place still needed it (the peer closed before its offer was read: that is a failure).
  if (link.bye && !book_.awaitsFrom(bye_messages_) && moves_.empty()) {
    RS_LOG_DEBUG("rank {}: {} closed", group_.rank, linkName(link));
    link.closed = true;
    // Nobody reads it any more: this rank's own goodbye goes; a message still queued for the
    // peer will never be received (it closed its communicator first).
    for (const auto& frame : link.queue) {
      if (!frame->op) continue;
      failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(group_.rank) + ": cannot send " +
                                           describe(frame->op->tag()) + " to " + peerName() +
                                           ": it closed its communicator");
      break;
    }
    link.queue.clear();
    link.link->shutdown();
    return;
  }
  link.state = State::kDown;
  link.down_reason = why;
  ++link.outages;
  link.quiesced = false;
  link.report_sent = false;
  link.report_received = false;
  link.busy = false;
  link.sample_open = false;
  if (link.data()) scheduler_->markDown(link.rail, why);
  link.link->shutdown();  // the peer, if it can still hear, sees the close at once
  if (failed() || group_.failure->closing() || lost_) {
    // Survivors keep a failed group's links open until they re-form or give up; one that ends
    // without a goodbye means the peer's process is gone (or left).
    if (failed() && peer_closed && link.attributes().sees_peer_exit) {
      group_.failure->recordLost(options_.peer, "its connection ended after this rank's failure");
    }
    return;
  }
  const bool sees = link.attributes().sees_peer_exit;
  const bool other_sees =
      std::any_of(links_.begin(), links_.end(), [&](const std::unique_ptr<LinkState>& other) {
        return other.get() != &link && other->up() && other->attributes().sees_peer_exit;
      });
  if (peer_closed && sees && !other_sees) {
    // The connection that ends with the peer's process ended without a goodbye.
    peerLostLocked(why, "rank " + std::to_string(group_.rank) + ": lost connection to " +
                            peerName() + ": " + why +
                            (data_links_ > 1 ? " (" + linksSummaryLocked() + ")" : ""));
    return;
  }
  if (link.data() && !dataLinkUpLocked()) {
    const std::string message = "rank " + std::to_string(group_.rank) + ": lost " + peerName() +
                                ": every link to it is down (" + linksSummaryLocked() + ")";
    if (busyLocked()) {
      peerLostLocked(why, message);
    } else {
      // Nothing pending with the peer (it closed its communicator, say, and this rank found
      // out by writing to it): an error only if it is needed again.
      RS_LOG_DEBUG("{} (nothing pending with that rank: an error only if it is needed again)",
                   message);
      unreachable_ = message;
      group_.failure->recordLost(options_.peer, why);
    }
    return;
  }
  uint64_t moved = 0;
  for (const auto& frame : link.queue) moved += frame->header.length;
  requeueUnpostedLocked(link);
  failOverOneSidedLocked(link);
  RS_LOG_WARN(
      "rank {}: rail {} ({} -> {}) to rank {} taken out: {}; {} unsent bytes moved to the other "
      "rails ({})",
      group_.rank, link.attributes().name,
      link.attributes().local.empty() ? "-" : link.attributes().local, link.attributes().remote,
      options_.peer, why, moved, linksSummaryLocked());
}

void Messenger::requeueUnpostedLocked(LinkState& link) {
  std::deque<OutFramePtr> queue;
  queue.swap(link.queue);
  for (auto& frame : queue) {
    if (kindOf(frame->header) == FrameKind::kBye) continue;  // the other links carry theirs
    resendFrameLocked(frame, false);
  }
  pumpAllLocked();
}

void Messenger::quiescedLocked(int index) {
  LinkState& link = at(index);
  link.quiesced = true;
  if (link.state != State::kDown || failed() || lost_) return;
  link.report_consumed = link.landed;
  sendReportsLocked();
}

void Messenger::sendReportsLocked() {
  // Every report not yet answered goes out again with each new one: if the link that carried
  // an earlier report died too, this one carries it.
  LinkState* via = controlLinkLocked();
  if (via == nullptr) return;
  for (auto& link : links_) {
    if (link->state != State::kDown || !link->quiesced ||
        (link->report_sent && link->report_received)) {
      continue;
    }
    FrameHeader report;
    report.kind = static_cast<uint8_t>(FrameKind::kLinkDown);
    report.link = static_cast<uint16_t>(link->index);
    report.generation = link->generation;
    report.message = link->report_consumed;
    // With why: the peer's error then names the first cause (a verbs status, say), not only
    // this report.
    sendControlLocked(report, link->down_reason.substr(0, 1024), via);
    link->report_sent = true;
  }
}

std::string Messenger::linkName(const LinkState& link) const {
  return std::string(link.attributes().kind == links::LinkKind::kRdma ? "RDMA rail " : "") +
         link.attributes().name + " to rank " + std::to_string(options_.peer);
}

void Messenger::onReportLocked(LinkState& via, const FrameHeader& header, const std::string& why) {
  if (header.link >= links_.size()) {
    failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                         " reported link " + std::to_string(header.link) +
                                         " down, but there are " + std::to_string(links_.size()));
    return;
  }
  LinkState& link = at(header.link);
  if (lost_) return;
  if (!link.up() && header.generation == link.generation + 1 && link.attributes().redials) {
    // The peer adopted our re-dialled connection and lost it again before our side of the
    // handshake finished: we never used that incarnation. Catch up and answer (we took nothing
    // of it) so that the peer re-sends what it put on it.
    newGenerationLocked(link, header.generation);
    link.state = State::kDown;
    link.quiesced = true;
    sendReportsLocked();
    resendLocked(link, header.message);
    return;
  }
  // A report about an earlier life of a link that has since been re-made: stale.
  if (header.generation != link.generation) return;
  if (link.up()) {
    linkFailedLocked(link.index,
                     linkName(link) + ": rank " + std::to_string(options_.peer) +
                         "'s side failed (it said so on " + linkName(via) + ")" +
                         (why.empty() ? "" : ": " + why),
                     false);
  }
  if (lost_ || link.report_received || failed()) return;
  resendLocked(link, header.message);
}

void Messenger::resendLocked(LinkState& link, uint64_t consumed) {
  link.report_received = true;
  uint64_t resent = 0;
  // Kept frames first (they completed on the link), then those still posted: in sequence.
  for (auto* frames : {&link.unacked, &link.posted}) {
    const bool complete = frames == &link.unacked;
    for (auto& frame : *frames) {
      if (!frame->sequenced()) continue;
      if (frame->seq < consumed) {
        if (!complete && frame->op) --frame->op->unwritten;
        releaseLocked(*frame);  // it arrived before the link failed
        continue;
      }
      resent += frame->header.length;
      resendFrameLocked(frame, complete);
    }
    frames->clear();
  }
  pumpAllLocked();
  RS_LOG_INFO(
      "rank {}: rail {} to rank {}: the peer had taken {} frames of it; {} bytes re-sent on the "
      "other rails",
      group_.rank, link.attributes().name, options_.peer, consumed, resent);
}

void Messenger::resendFrameLocked(const OutFramePtr& frame, bool complete) {
  std::shared_ptr<SendOp> op = frame->op;
  if (complete && op) ++op->unwritten;  // counted once more until its new pieces are written
  if (kindOf(frame->header) != FrameKind::kData) {
    // An offer, a grant, an end: whole, on the fastest link up (an end keeps the link it
    // speaks for; a second one is ignored).
    frame->header.flags |= kFrameResent;
    LinkState* via = dataLinkUpLocked()
                         ? &at(link_of_rail_[static_cast<size_t>(scheduler_->fastest())])
                         : controlLinkLocked();
    if (via == nullptr) return;
    via->queue.push_back(frame);
    markBusyLocked(*via);
    return;
  }
  if (!dataLinkUpLocked()) return;  // the caller reports the peer lost
  FrameHeader base = frame->header;
  base.flags |= kFrameResent;
  for (const auto& piece : scheduler_->split(frame->header.length)) {
    LinkState& to = at(link_of_rail_[static_cast<size_t>(piece.rail)]);
    const size_t before = to.queue.size();
    // Its pieces count for the send now, not the frame they replace.
    queuePiecesLocked(to, op, base, frame->data + piece.offset, frame->header.offset + piece.offset,
                      piece.length);
    if (!op) {
      // A copy already (its send completed): the new pieces copy their part of it.
      for (size_t i = before; i < to.queue.size(); ++i) to.queue[i]->own();
    }
  }
  if (op) --op->unwritten;
  releaseLocked(*frame);
}

void Messenger::newGenerationLocked(LinkState& link, uint32_t generation) {
  link.generation = generation;
  link.next_seq = 0;
  link.landed = 0;
  link.ack_sent = 0;
  link.ack_bytes = 0;
  link.ack_wanted = false;
  link.bye = false;
  link.closed = false;
  link.report_sent = false;
  link.report_received = false;
  link.report_consumed = 0;
  link.busy = false;
  link.sample_open = false;
}

void Messenger::upLocked(LinkState& link, uint32_t generation) {
  if (link.up() && link.generation == generation) return;
  if (generation != link.generation) newGenerationLocked(link, generation);
  const bool first = !link.ever_up;
  link.state = State::kUp;
  link.connect = Connect::kIdle;
  link.ever_up = true;
  link.attempt_warned = false;
  link.quiesced = false;
  link.down_reason.clear();
  link.last_progress = link.last_heard = now();
  if (link.data()) scheduler_->markUp(link.rail);
  group_.wake->bump();  // a set-up wait may be waiting for it (Mesh::waitUntil)
  if (first) {
    RS_LOG_DEBUG("rank {}: {} to rank {} connected (generation {})", group_.rank,
                 link.attributes().name, options_.peer, generation);
  } else {
    RS_LOG_WARN(
        "rank {}: rail {} ({} -> {}) to rank {} is back; re-admitted at {:.3f} Gbit/s", group_.rank,
        link.attributes().name, link.attributes().local.empty() ? "-" : link.attributes().local,
        link.attributes().remote, options_.peer, link.data() ? scheduler_->gbps(link.rail) : 0.0);
  }
  if (link.data()) {
    // Sends made before any data link was up, in message order.
    while (!deferred_.empty() && !failed()) {
      std::shared_ptr<SendOp> op = std::move(deferred_.front());
      deferred_.pop_front();
      planLocked(op);
    }
  }
  // Lanes connected on first use whose records waited for this connection (made on first use
  // too) ask now.
  if (first && link.attributes().redials) askRecordsLocked();
  pumpAllLocked();
  pumpOneSidedLocked();
}

void Messenger::linkUpLocked(int index, uint32_t generation) {
  LinkState& link = at(index);
  if (lost_ || failed()) return;
  upLocked(link, generation);
}

void Messenger::heartbeatLocked(Clock::time_point t) {
  const Duration timeout = options_.links.heartbeat_timeout;
  // If this process itself did not run for a good part of the timeout (it was stopped, or
  // starved of CPU), the silence is ours, not the peer's: start counting again.
  const bool we_slept = last_tick_ != Clock::time_point{} && t - last_tick_ > timeout / 2;
  last_tick_ = t;
  // Silence counts only while the peer is awaited (and since then): nobody is kept waiting
  // by a peer that computes, and not pinging it keeps the work of a tick O(peers in use).
  const bool awaited = busyLocked();
  if (heard_ == Clock::time_point{} || we_slept || !awaited) heard_ = t;
  if (timeout <= Duration::zero() || bye_received_ || !awaited) return;
  if (t - heartbeat_sent_ >= timeout / 5) {
    FrameHeader ping;
    ping.kind = static_cast<uint8_t>(FrameKind::kPing);
    LinkState* via = controlLinkLocked();
    if (via != nullptr) {
      sendControlLocked(ping, {}, via);
      heartbeat_sent_ = t;
    }
  }
  const Duration quiet = t - heard_;
  if (quiet <= timeout) return;
  // A pair connected on first use whose connection never came up: its dials went unanswered.
  const bool never = std::none_of(links_.begin(), links_.end(),
                                  [](const std::unique_ptr<LinkState>& l) { return l->ever_up; });
  std::ostringstream text;
  text << std::fixed << std::setprecision(1)
       << (never ? "could not be connected: no connection to " + options_.peer_address + " for "
                 : std::string("stopped answering: nothing heard from it for "))
       << std::chrono::duration<double>(quiet).count() << " s (RAILSHARD_HEARTBEAT_TIMEOUT is "
       << std::chrono::duration<double>(timeout).count()
       << " s; the process is stopped or hung, or its host is unreachable)";
  peerLostLocked(text.str(),
                 "rank " + std::to_string(group_.rank) + ": " + peerName() + " " + text.str());
}

void Messenger::checkStallsLocked(Clock::time_point t) {
  std::vector<std::pair<int, std::string>> stalled;
  for (auto& link : links_) {
    if (!link->up() || !link->busy || !link->data()) continue;
    // Bytes leaving the link count as progress as deliveries do: a frame of a megabyte on a
    // 250 Mbit/s rail shared by 8 connections takes a quarter of a second, and a re-admitted
    // connection's first frames far longer while its congestion window opens (measured:
    // benchmarks/nccl_plugin_rail_down.sh, where rails were taken out again and again).
    if (const uint64_t taken = link->link->bytesTaken(); taken != link->taken_seen) {
      link->taken_seen = taken;
      link->last_progress = t;
    }
    const Duration quiet = t - link->last_progress;
    if (quiet > options_.links.rail_timeout / 2 && link->pinged < link->last_progress) {
      // Suspicious: ask every other link for an acknowledgement, so that a working one proves
      // the peer is alive (a link that merely idles would otherwise prove nothing).
      link->pinged = t;
      for (auto& other : links_) {
        if (other.get() == link.get() || !other->up()) continue;
        FrameHeader ping;
        ping.kind = static_cast<uint8_t>(FrameKind::kPing);
        sendControlLocked(ping, {}, other.get());
      }
    }
    if (quiet <= options_.links.rail_timeout) continue;
    for (auto& other : links_) {
      if (other.get() != link.get() && other->up() && other->last_heard > link->last_progress) {
        stalled.emplace_back(link->index, "no progress for " + seconds(quiet) + " while " +
                                              other->attributes().name + " delivered");
        break;
      }
    }
  }
  for (auto& [index, why] : stalled) linkFailedLocked(index, why, false);
}

void Messenger::rejoinLocked(Clock::time_point t) {
  if (!options_.initiator) return;
  const bool other_up = std::any_of(links_.begin(), links_.end(),
                                    [](const std::unique_ptr<LinkState>& l) { return l->up(); });
  if (!other_up) return;  // a link is made again only beside a working one
  for (auto& link : links_) {
    const Duration interval = link->attributes().rejoin_interval;
    const bool first = link->state == State::kConnecting && connect_asked_;
    if (!first && (interval <= Duration::zero() || !rejoinableLocked(*link))) continue;
    if (link->connect == Connect::kAsked || link->connect == Connect::kProbing) {
      // An exchange under way: asked again if it went unanswered for a while.
      if (t - link->last_attempt < std::max<Duration>(interval, std::chrono::seconds(5))) continue;
      link->connect = Connect::kIdle;
    }
    if (link->connect != Connect::kIdle || !link->quiesced) continue;
    const Duration retry =
        interval > Duration::zero() ? interval : Duration(std::chrono::seconds(1));
    if (link->last_attempt != Clock::time_point{} && t - link->last_attempt < retry) continue;
    if (link->attributes().redials) {
      link->last_attempt = t;
      link->link->redial(link->generation + 1);
    } else {
      startConnectLocked(*link);
    }
  }
}

}  // namespace railshard::transport::messaging
