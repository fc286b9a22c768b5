// The zero-copy rendezvous over one-sided links (placeholder until the RDMA lanes move here).
#include "transport/messaging/messenger_internal.h"
#include "transport/messaging/rendezvous.h"

namespace railshard::transport::messaging {

bool Messenger::offerLocked(const std::shared_ptr<SendOp>& op) {
  (void)op;
  return false;
}

void Messenger::onOfferLocked(LinkState& link, const FrameHeader& header, Landing& landing) {
  (void)header;
  (void)landing;
  failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                       " offered a message in place on " +
                                       link.attributes().name + ", which cannot move it so");
}

void Messenger::onGrantLocked(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  (void)header;
  (void)payload;
  failLocked(ErrorKind::kProtocol,
             "rank " + std::to_string(group_.rank) + ": " + peerName() + " sent an unasked grant");
}

void Messenger::onEndLocked(const FrameHeader& header) {
  (void)header;
}

void Messenger::pumpOneSidedLocked() {}

void Messenger::oneSidedDoneLocked(int link, uint64_t cookie) {
  (void)link;
  (void)cookie;
}

void Messenger::oneSidedFinishedLocked(const std::shared_ptr<Rendezvous>& move) {
  (void)move;
}

void Messenger::failOverOneSidedLocked(LinkState& link) {
  (void)link;
}

void Messenger::dropRegistrationsLocked() {}

}  // namespace railshard::transport::messaging
