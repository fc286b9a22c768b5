// Sending: striping a message over the data links, posting frames as links have room, keeping
// them until the peer has them, acknowledgements and rate samples, tail stealing.
#include <algorithm>
#include <cstring>

#include "base/logging.h"
#include "base/trace.h"
#include "transport/cuda_driver.h"
#include "transport/messaging/messenger_internal.h"
#include "transport/messaging/rendezvous.h"

namespace railshard::transport::messaging {

namespace {

uint64_t steadyNs(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

}  // namespace

void Messenger::planLocked(const std::shared_ptr<SendOp>& op) {
  if (offerLocked(op)) return;  // moved in place (messenger_rendezvous.cc)
  std::vector<rails::Piece> pieces;
  try {
    // PeerLostError when no data link is up; an empty message is one empty piece.
    pieces = scheduler_->split(op->bytes());
  } catch (const PeerLostError& e) {
    peerLostLocked(e.what(), "rank " + std::to_string(group_.rank) + ": cannot send " +
                                 describe(op->tag()) + " to " + peerName() + ": " + e.what());
    return;
  }
  FrameHeader base;
  base.kind = static_cast<uint8_t>(FrameKind::kData);
  base.message = op->message;
  base.total = op->bytes();
  base.tag = op->tag();
  // Each link's share is posted as it is queued: a link that runs dry steals only from shares
  // queued before its own, never from one that has not had a chance to start. The plan holds
  // the send open meanwhile: a first share that completes at once (a socket took it whole)
  // must not complete the send before the other shares are queued.
  ++op->outstanding;
  for (const auto& piece : pieces) {
    LinkState& link = at(link_of_rail_[static_cast<size_t>(piece.rail)]);
    queuePiecesLocked(link, op, base, op->data + piece.offset, piece.offset, piece.length);
    pumpLocked(link);
  }
  if (--op->outstanding == 0) completeLocked(*op);
}

void Messenger::queuePiecesLocked(LinkState& link, const std::shared_ptr<SendOp>& op,
                                  const FrameHeader& base, const uint8_t* data, uint64_t offset,
                                  uint64_t length) {
  const uint64_t most = std::max<uint64_t>(1, link.attributes().max_payload);
  // A link that cannot read GPU memory gets a host copy of its pieces, kept until they are sent.
  const bool staged = op && op->device && !link.attributes().device_memory;
  uint64_t done = 0;
  do {
    auto frame = std::make_shared<OutFrame>();
    frame->header = base;
    frame->header.offset = offset + done;
    frame->header.length = std::min(most, length - done);
    frame->data = data + done;
    frame->device = op && op->device;
    if (staged && frame->header.length > 0) {
      frame->owned.resize(frame->header.length);
      std::string why;
      if (group_.cuda == nullptr ||
          !group_.cuda->copyToHost(frame->owned.data(), frame->data, frame->header.length, why)) {
        failLocked(ErrorKind::kGeneric, "rank " + std::to_string(group_.rank) +
                                            ": copying a piece out of GPU memory failed: " + why);
        return;
      }
      frame->data = reinterpret_cast<const uint8_t*>(frame->owned.data());
      frame->device = false;
    }
    frame->op = op;
    if (op) {
      ++op->outstanding;
      ++op->unwritten;
    }
    done += frame->header.length;
    link.queue.push_back(std::move(frame));
  } while (done < length);
  markBusyLocked(link);
}

void Messenger::pumpAllLocked() {
  for (auto& link : links_) pumpLocked(*link);
}

void Messenger::pumpLocked(LinkState& link) {
  while (true) {
    while (link.up() && !link.queue.empty() && link.link->canPost() && !failed()) {
      OutFramePtr frame = std::move(link.queue.front());
      link.queue.pop_front();
      postFrameLocked(link, frame);
    }
    // The split is only as good as the estimates; whatever they miss shows at the end of a
    // burst as one link still draining while another idles: a link that runs dry takes work
    // from the back of the slowest queue. Dry means its last frame is out too, not merely
    // posted: stealing while a link still writes its own share moved work off a slower link
    // that was on time, and cut every message into extra pieces (2 hosts x 2 ranks on 1 Gbit
    // + 250 Mbit rails: 1.4 % slower than with the rule of the old TCP transport).
    if (!link.up() || !link.queue.empty() || !link.posted.empty() || !link.data() ||
        data_links_ < 2 || options_.links.weights != RailWeights::kAdaptive || failed() ||
        !stealForLocked(link)) {
      return;
    }
  }
}

void Messenger::postFrameLocked(LinkState& link, const OutFramePtr& frame) {
  if (frame->sequenced()) frame->seq = link.next_seq++;
  frame->posted = now();
  frame->trace_ns = trace::enabled() ? trace::now() : 0;
  link.posted.push_back(frame);
  if (link.link->post(frame)) {
    // Complete at once: so is everything posted before it.
    while (!link.posted.empty()) {
      OutFramePtr done = std::move(link.posted.front());
      link.posted.pop_front();
      frameCompleteLocked(link, done);
    }
  }
}

void Messenger::completedLocked(int index, int count) {
  LinkState& link = at(index);
  for (int i = 0; i < count && !link.posted.empty(); ++i) {
    OutFramePtr frame = std::move(link.posted.front());
    link.posted.pop_front();
    frameCompleteLocked(link, frame);
  }
  // Written out: a link that ran dry may now take over part of a slower one's backlog.
  if (link.posted.empty() && link.queue.empty()) pumpLocked(link);
  maybeIdleLocked(link);
}

void Messenger::roomLocked(int index) {
  pumpLocked(at(index));
}

void Messenger::frameCompleteLocked(LinkState& link, const OutFramePtr& frame) {
  const FrameKind kind = kindOf(frame->header);
  if (kind == FrameKind::kConnected) {
    // The probe of a re-made link arrived: the path works both ways.
    if (link.connect == Connect::kProbing) upLocked(link, link.generation);
    return;
  }
  if (!frame->sequenced()) return;
  if (frame->op) --frame->op->unwritten;
  if (kind == FrameKind::kData) {
    link.bytes_sent += frame->header.length;
    if (frame->trace_ns != 0 && trace::enabled()) {
      traceRailLocked(link, *frame, link.attributes().trace_name);
    }
  }
  if (link.attributes().delivery == links::Delivery::kCompletion) {
    sampleLocked(link, deliveredLocked(link, *frame), steadyNs(now()));
    return;
  }
  if (!retains()) {
    // One data link: nothing to fail over to, so nothing is kept.
    releaseLocked(*frame);
    return;
  }
  // Kept until the peer acknowledges it, so that it can be re-sent if this link fails. A
  // small piece is copied so that its send completes now rather than an acknowledgement later.
  std::shared_ptr<SendOp> op = frame->op;
  if (op && frame->header.length <= kCopyPieceBytes && !frame->device) {
    frame->own();
    releaseLocked(*frame);
  }
  link.unacked.push_back(frame);
  if (op && op->waited && op->unwritten == 0 && !op->done()) releaseByCopyLocked(*op);
}

void Messenger::releaseByCopyLocked(SendOp& op) {
  // The caller blocks on a send that is all on the wire: rather than wait for the peer's
  // acknowledgement (which queues behind the peer's own data), keep a copy of what is not
  // acknowledged yet and complete now. Bounded by what the links hold, not by the message.
  for (auto& link : links_) {
    for (auto& frame : link->unacked) {
      if (frame->op.get() != &op || frame->device) continue;
      frame->own();
      releaseLocked(*frame);
    }
  }
}

uint64_t Messenger::deliveredLocked(LinkState& link, OutFrame& frame) {
  link.last_progress = now();
  const uint64_t bytes = kindOf(frame.header) == FrameKind::kData ? frame.header.length : 0;
  releaseLocked(frame);
  return bytes;
}

void Messenger::releaseLocked(OutFrame& frame) {
  if (!frame.op) return;
  std::shared_ptr<SendOp> op = std::move(frame.op);
  if (--op->outstanding == 0 && (!op->rendezvous || op->rendezvous->finished)) {
    completeLocked(*op);
  }
}

void Messenger::completeLocked(Request& request) {
  if (request.done()) return;
  if (trace::enabled() && group_.trace_rank != nullptr) {
    traceTransfer(request, group_.trace_rank->load(std::memory_order_relaxed));
  }
  request.markDone();
  group_.wake->bump();
}

void Messenger::markBusyLocked(LinkState& link) {
  if (link.busy) return;
  link.busy = true;
  link.sample_open = false;
  link.last_progress = now();
}

void Messenger::maybeIdleLocked(LinkState& link) {
  if (link.queue.empty() && link.posted.empty() && link.unacked.empty()) {
    link.busy = false;
    link.sample_open = false;
  }
}

void Messenger::sampleLocked(LinkState& link, uint64_t bytes, uint64_t when_ns) {
  if (bytes == 0 || !link.busy || !link.data() || data_links_ < 2 ||
      options_.links.weights != RailWeights::kAdaptive) {
    return;
  }
  // Bytes delivered between deliveries while the link had data to deliver: its rate when
  // loaded, whatever share of the traffic it carries. From the first delivery of a busy period
  // on, timed by the receiver's clock where it acknowledges (acknowledgements queue behind
  // other data on their way back, by a delay that would pass for a slower or faster link).
  // One sample per delivery event (an acknowledgement, a completion): what an event that opens
  // the window covers arrived before it, so none of it counts.
  if (!link.sample_open) {
    link.sample_open = true;
    link.sample_ns = when_ns;
    link.sample_bytes = 0;
    return;
  }
  link.sample_bytes += bytes;
  if (link.sample_bytes < kMinSampleBytes || when_ns <= link.sample_ns) return;
  scheduler_->record(link.rail, link.sample_bytes,
                     static_cast<double>(when_ns - link.sample_ns) * 1e-9);
  link.sample_bytes = 0;
  link.sample_ns = when_ns;
  link.link->rateChanged(scheduler_->gbps(link.rail));
}

void Messenger::onAckLocked(const FrameHeader& header) {
  if (header.link >= links_.size()) {
    failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                         " acknowledged link " + std::to_string(header.link) +
                                         " of " + std::to_string(links_.size()));
    return;
  }
  LinkState& link = at(header.link);
  // For the link's current incarnation only, whichever link carried it.
  if (!link.up() || header.generation != link.generation) return;
  const uint64_t consumed = header.message;
  if (consumed > link.next_seq) {
    failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                         " acknowledged " + std::to_string(consumed) +
                                         " frames on " + link.attributes().name + ", of " +
                                         std::to_string(link.next_seq) + " sent");
    return;
  }
  link.last_progress = now();
  uint64_t bytes = 0;
  while (!link.unacked.empty() && link.unacked.front()->seq < consumed) {
    OutFramePtr frame = std::move(link.unacked.front());
    link.unacked.pop_front();
    bytes += deliveredLocked(link, *frame);
  }
  sampleLocked(link, bytes, header.offset);
  maybeIdleLocked(link);
}

bool Messenger::stealForLocked(LinkState& idle) {
  // From the back of the queue that needs longest to drain, the share that makes both finish
  // together by their current rates. Only pieces not yet posted move: nothing on the wire
  // changes links.
  LinkState* donor = nullptr;
  double donor_seconds = 0;
  uint64_t donor_bytes = 0;
  for (auto& link : links_) {
    if (link.get() == &idle || !link->up() || !link->data()) continue;
    uint64_t bytes = 0;
    for (const auto& frame : link->queue) {
      if (kindOf(frame->header) == FrameKind::kData) bytes += frame->header.length;
    }
    const double seconds =
        static_cast<double>(bytes) / std::max(1e-9, scheduler_->gbps(link->rail));
    if (bytes > 0 && seconds > donor_seconds) {
      donor = link.get();
      donor_seconds = seconds;
      donor_bytes = bytes;
    }
  }
  if (donor == nullptr) return false;
  const double mine = scheduler_->gbps(idle.rail);
  const double theirs = scheduler_->gbps(donor->rail);
  uint64_t want = static_cast<uint64_t>(static_cast<double>(donor_bytes) * mine / (mine + theirs));
  if (want < kMinStealBytes) return false;
  const bool idle_reads_device = idle.attributes().device_memory;
  std::vector<OutFramePtr> taken;  // from the back, so in reverse order
  while (want > 0 && !donor->queue.empty()) {
    OutFrame& back = *donor->queue.back();
    if (kindOf(back.header) != FrameKind::kData || (back.device && !idle_reads_device)) break;
    const uint64_t length = back.header.length;
    if (length <= want && length <= idle.attributes().max_payload) {
      taken.push_back(std::move(donor->queue.back()));
      donor->queue.pop_back();
      want -= length;
      continue;
    }
    // The tail of it, in whole cache lines (whole elements), at most a frame of the idle link.
    const uint64_t tail = std::min(want, idle.attributes().max_payload) / 64 * 64;
    if (tail == 0 || tail >= length) break;
    auto piece = std::make_shared<OutFrame>();
    piece->header = back.header;
    piece->header.offset = back.header.offset + (length - tail);
    piece->header.length = tail;
    piece->device = back.device;
    if (!back.owned.empty()) {
      piece->owned = back.owned.substr(length - tail, tail);
      piece->data = reinterpret_cast<const uint8_t*>(piece->owned.data());
      back.owned.resize(length - tail);
      back.data = reinterpret_cast<const uint8_t*>(back.owned.data());
    } else {
      piece->data = back.data + (length - tail);
    }
    if (back.op) {
      piece->op = back.op;
      ++back.op->outstanding;
      ++back.op->unwritten;
    }
    back.header.length = length - tail;
    taken.push_back(std::move(piece));
    want = 0;
  }
  if (taken.empty()) return false;
  for (auto it = taken.rbegin(); it != taken.rend(); ++it) idle.queue.push_back(std::move(*it));
  markBusyLocked(idle);
  return true;
}

Messenger::LinkState* Messenger::controlLinkLocked() {
  // The fastest data link up (an acknowledgement queues behind data on the link it takes: a
  // slow link's backlog would delay it and make that link look slower than it is), unless only
  // waits move it (shared memory: a peer that computes would not read a ping there); else a
  // link that carries control only.
  if (dataLinkUpLocked()) {
    LinkState& fastest = at(link_of_rail_[static_cast<size_t>(scheduler_->fastest())]);
    if (!fastest.attributes().polled) return &fastest;
  }
  LinkState* polled = nullptr;
  for (auto& link : links_) {
    if (!link->up()) continue;
    if (!link->attributes().polled) return link.get();
    if (polled == nullptr) polled = link.get();
  }
  return polled;
}

void Messenger::sendControlLocked(FrameHeader header, const std::string& payload, LinkState* via) {
  if (via == nullptr) via = controlLinkLocked();
  if (via == nullptr || !via->up()) return;
  header.length = payload.size();
  via->link->postControl(header, payload);
}

void Messenger::traceRailLocked(LinkState& link, const OutFrame& frame, const char* name) {
  const int rank = group_.trace_rank != nullptr ? group_.trace_rank->load() : -1;
  if (rank < 0) return;
  const links::LinkAttributes& a = link.attributes();
  if (link.trace_track == 0) {
    link.trace_track =
        trace::track(rank, a.name + " to rank " + std::to_string(options_.peer), a.name);
  }
  trace::Event e;
  e.category = trace::Category::kRail;
  e.name = name;
  e.rank = rank;
  e.peer = options_.peer;
  e.track = link.trace_track;
  e.bytes = frame.header.length;
  e.begin_ns = frame.trace_ns;
  e.end_ns = trace::now();
  trace::record(e);
}

}  // namespace railshard::transport::messaging
