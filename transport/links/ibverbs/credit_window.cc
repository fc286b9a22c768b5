#include "transport/links/ibverbs/credit_window.h"

#include <string>

#include "base/error.h"

namespace railshard::transport::links::ibverbs {

SendWindow::SendWindow(uint32_t slots) : slots_(slots), credits_(slots), busy_(slots, false) {
  if (slots == 0) throw InvalidArgument("SendWindow: a ring needs at least one slot");
}

std::optional<uint32_t> SendWindow::acquire() {
  if (credits_ == 0) return std::nullopt;
  const auto slot = static_cast<uint32_t>(next_ % slots_);
  if (busy_[slot]) return std::nullopt;
  busy_[slot] = true;
  --credits_;
  ++in_flight_;
  ++next_;
  return slot;
}

void SendWindow::completed(uint32_t slot) {
  if (slot >= slots_ || !busy_[slot]) {
    throw ProtocolError("ibverbs: completion for staging slot " + std::to_string(slot) +
                        " that has no write in flight");
  }
  busy_[slot] = false;
  --in_flight_;
}

void SendWindow::grant(uint32_t count) {
  if (count > slots_ - credits_) {
    throw ProtocolError("ibverbs: the peer returned " + std::to_string(count) +
                        " slots but holds only " + std::to_string(slots_ - credits_));
  }
  credits_ += count;
}

ReceiveWindow::ReceiveWindow(uint32_t slots) : slots_(slots), state_(slots, 0) {
  if (slots == 0) throw InvalidArgument("ReceiveWindow: a ring needs at least one slot");
}

void ReceiveWindow::arrived(uint32_t slot) {
  const auto expected = static_cast<uint32_t>(head_ % slots_);
  if (slot != expected) {
    throw ProtocolError("ibverbs: a write landed in slot " + std::to_string(slot) +
                        " of the receive ring, expected slot " + std::to_string(expected));
  }
  if (head_ - tail_ >= slots_ || state_[slot] != 0) {
    throw ProtocolError("ibverbs: a write landed in occupied slot " + std::to_string(slot) +
                        " (the sender overran its credits)");
  }
  state_[slot] = 1;
  ++head_;
}

void ReceiveWindow::release(uint32_t slot) {
  if (slot >= slots_ || state_[slot] != 1) {
    throw ProtocolError("ibverbs: release of receive slot " + std::to_string(slot) +
                        " that holds no piece");
  }
  state_[slot] = 2;
  while (tail_ < head_ && state_[tail_ % slots_] == 2) {
    state_[tail_ % slots_] = 0;
    ++tail_;
    ++pending_;
  }
}

uint32_t ReceiveWindow::takeCredits(uint32_t batch, bool force) {
  if (pending_ == 0 || (!force && pending_ < batch)) return 0;
  const uint32_t count = pending_;
  pending_ = 0;
  return count;
}

}  // namespace railshard::transport::links::ibverbs
