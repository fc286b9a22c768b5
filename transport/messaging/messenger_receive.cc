// Receiving: what the links say arrived, checked and taken apart before a byte lands.
#include <cstring>

#include "base/logging.h"
#include "transport/cuda_driver.h"
#include "transport/messaging/messenger_internal.h"
#include "transport/messaging/rendezvous.h"

namespace railshard::transport::messaging {

namespace {

// Whether a posted receive is in GPU memory.
bool deviceReceive(const Incoming& entry) {
  return entry.request && static_cast<const RecvOp&>(*entry.request).device;
}

}  // namespace

Messenger::Landing Messenger::arrivingLocked(int index, const FrameHeader& header) {
  LinkState& link = at(index);
  heard_ = now();
  link.last_heard = heard_;
  Landing landing;
  // Whatever the peer wrote on a link re-made by records proves it connected on both sides.
  if (link.connect == Connect::kAccepted && link.state != State::kUp) {
    upLocked(link, link.generation);
  }
  if (failed()) {
    landing.discard = true;  // user memory is off limits after a failure
    return landing;
  }
  switch (kindOf(header)) {
    case FrameKind::kData: {
      MessageBook::Arrival arrival = book_.arrive(
          PieceInfo{header.message, header.tag, header.total, header.offset, header.length},
          [&](const MessageTag& theirs) -> std::optional<std::string> {
            if (group_.current == nullptr) return std::nullopt;
            return group_.current->unsolicited(options_.peer, theirs);
          });
      if (arrival.problem) {
        failLocked(arrival.problem->kind,
                   arrival.problem->kind == ErrorKind::kProtocol
                       ? arrival.problem->text + " (on " + link.attributes().name + ")"
                       : arrival.problem->text);
        landing.discard = true;
        return landing;
      }
      landing.entry = std::move(arrival.entry);
      Incoming& entry = *landing.entry;
      if (!entry.request) group_.wake->bump();  // an early message: a receive from any source
      if (!entry.staging && deviceReceive(entry) && header.length > 0) {
        landing.buffer.resize(header.length);  // GPU memory: landed here, then copied in
        landing.target = landing.buffer.data();
      } else {
        landing.target = entry.base() + header.offset;
      }
      return landing;
    }
    case FrameKind::kOffer:
    case FrameKind::kGrant:
    case FrameKind::kAbort:
    case FrameKind::kConnect:
    case FrameKind::kConnectAck:
    case FrameKind::kLinkDown:
      landing.buffer.resize(header.length);
      landing.target = landing.buffer.data();
      return landing;
    default:
      return landing;
  }
}

void Messenger::landedLocked(int index, const FrameHeader& header, Landing& landing) {
  LinkState& link = at(index);
  if (landing.discard || failed()) return;
  if (isSequenced(header)) {
    ++link.landed;
    link.ack_wanted = true;
    link.ack_bytes += header.length;
  }
  switch (kindOf(header)) {
    case FrameKind::kData:
      onDataLandedLocked(link, header, landing);
      break;
    case FrameKind::kOffer:
      onOfferLocked(link, header, landing);
      break;
    case FrameKind::kGrant:
      onGrantLocked(header, landing.buffer);
      break;
    case FrameKind::kReadDone:
    case FrameKind::kWritten:
      onEndLocked(header);
      break;
    case FrameKind::kBye:
      onByeLocked(link, header);
      break;
    case FrameKind::kAck:
      onAckLocked(header);
      break;
    case FrameKind::kPing:
      // Answered on the link it came on: that is its point.
      sendAckLocked(link, &link);
      break;
    case FrameKind::kLinkDown:
      onReportLocked(link, header, std::string(landing.buffer.begin(), landing.buffer.end()));
      break;
    case FrameKind::kAbort:
      onAbortLocked(header, std::string(landing.buffer.begin(), landing.buffer.end()));
      break;
    case FrameKind::kConnect:
    case FrameKind::kConnectAck: {
      if (header.link >= links_.size()) {
        failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                             " sent a connection record for link " +
                                             std::to_string(header.link) + " of " +
                                             std::to_string(links_.size()));
        break;
      }
      const std::string record(landing.buffer.begin(), landing.buffer.end());
      if (kindOf(header) == FrameKind::kConnect) {
        onConnectLocked(at(header.link), header, record);
      } else {
        onConnectAckLocked(at(header.link), header, record);
      }
      break;
    }
    case FrameKind::kConnected:
      break;  // its arrival made the link up (arrivingLocked)
  }
  if (isSequenced(header) && retains() && link.attributes().delivery == links::Delivery::kAck &&
      link.ack_bytes >= kAckEveryBytes) {
    sendAckLocked(link, nullptr);
  }
}

void Messenger::onDataLandedLocked(LinkState& link, const FrameHeader& header, Landing& landing) {
  (void)link;
  Incoming& entry = *landing.entry;
  if (!landing.buffer.empty() && !entry.staging) {
    // A receive in GPU memory: this piece goes in now.
    std::string why;
    if (group_.cuda == nullptr ||
        !group_.cuda->copyToDevice(entry.user + header.offset, landing.buffer.data(), header.length,
                                   why)) {
      failLocked(ErrorKind::kGeneric, "rank " + std::to_string(group_.rank) +
                                          ": copying a piece into GPU memory failed: " + why);
      return;
    }
  }
  IncomingPtr done = book_.landed(header.message, entry, header.length);
  if (done) completeIncomingLocked(*done, done->staging ? done->staged.data() : nullptr);
}

void Messenger::completeIncomingLocked(Incoming& entry, const uint8_t* source) {
  if (source != nullptr && entry.total > 0) {
    // Staged (it arrived before its receive), or moved into a bounce: one copy into the
    // receive's buffer.
    if (deviceReceive(entry)) {
      std::string why;
      if (group_.cuda == nullptr ||
          !group_.cuda->copyToDevice(entry.user, source, entry.total, why)) {
        failLocked(ErrorKind::kGeneric, "rank " + std::to_string(group_.rank) +
                                            ": copying a message into GPU memory failed: " + why);
        return;
      }
    } else {
      std::memcpy(entry.user, source, entry.total);
    }
  }
  entry.request->setReceived(entry.total);
  completeLocked(*entry.request);
}

void Messenger::protocolErrorLocked(int index, const std::string& what) {
  failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                       " broke the protocol on " + at(index).attributes().name +
                                       ": " + what);
}

void Messenger::idleLocked(int index) {
  LinkState& link = at(index);
  // Acknowledged at a frame boundary once the link has run dry (the sender then releases what
  // it kept for re-sending, and times the link).
  if (link.ack_wanted && retains() && link.attributes().delivery == links::Delivery::kAck) {
    sendAckLocked(link, nullptr);
  }
}

void Messenger::sendAckLocked(LinkState& link, LinkState* via) {
  FrameHeader ack;
  ack.kind = static_cast<uint8_t>(FrameKind::kAck);
  ack.link = static_cast<uint16_t>(link.index);
  ack.generation = link.generation;
  ack.message = link.landed;
  // When it was sent, on this rank's clock: the peer times the link by the receiving side's
  // clock, free of the acknowledgement's own delay on the way back.
  ack.offset = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now().time_since_epoch()).count());
  sendControlLocked(ack, {}, via);
  link.ack_sent = link.landed;
  link.ack_bytes = 0;
  link.ack_wanted = false;
}

void Messenger::onByeLocked(LinkState& link, const FrameHeader& header) {
  link.bye = true;
  if (!bye_received_) {
    bye_received_ = true;
    bye_messages_ = header.message;
  }
  // Receives the peer will never send to (those it did send may still be arriving on other
  // links).
  if (book_.awaitsFrom(bye_messages_) && !group_.failure->closing()) {
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                         " closed its communicator while this rank still waited "
                                         "for data from it");
  }
}

void Messenger::onAbortLocked(const FrameHeader& header, const std::string& text) {
  // Passed on (tell_peers): a rank that fails sends its abort before anything else of its
  // ends, so every peer reads an abort before it sees that rank's links close.
  const bool tagged = text.find("[reported by rank") != std::string::npos;
  if (header.message > 0) {
    group_.failure->recordLost(
        static_cast<int>(header.message - 1),
        "reported lost by rank " + std::to_string(options_.peer) + ": " + text);
  }
  failLocked(static_cast<ErrorKind>(header.error_kind),
             tagged ? text : text + " [reported by rank " + std::to_string(options_.peer) + "]");
}

}  // namespace railshard::transport::messaging
