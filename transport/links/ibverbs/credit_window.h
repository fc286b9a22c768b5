#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace railshard::transport::links::ibverbs {

// Flow control of one lane. The receiver owns a ring of `slots` equal slots; the sender
// writes piece k into slot k mod slots and may have at most `slots` pieces the receiver has
// not handed back. Both sides walk the ring in the same order, so a slot index in the
// immediate data is also a sequence check: a write that lands anywhere but the next expected
// slot is a protocol error, not silently mixed data.
//
// Sender side: a slot is usable when the receiver has returned its credit AND our own staging
// copy of the slot is free (its write's completion arrived; the credit for a slot can overtake
// the local completion of the write into it, since they travel on different queues).
class SendWindow {
 public:
  explicit SendWindow(uint32_t slots);

  // The next slot, or nullopt when out of credits or its staging buffer is still in flight.
  std::optional<uint32_t> acquire();
  // Whether acquire() would give a slot now.
  bool available() const { return credits_ > 0 && !busy_[next_ % slots_]; }
  // The write from staging slot `slot` completed locally. ProtocolError if it was not in flight.
  void completed(uint32_t slot);
  // The receiver returned `count` slots. ProtocolError when that is more than it holds.
  void grant(uint32_t count);

  uint32_t slots() const { return slots_; }
  uint32_t credits() const { return credits_; }
  uint32_t inFlight() const { return in_flight_; }  // written, local completion not yet seen
  uint64_t written() const { return next_; }

 private:
  uint32_t slots_;
  uint32_t credits_;
  uint32_t in_flight_ = 0;
  uint64_t next_ = 0;
  std::vector<bool> busy_;  // staging slot written, completion pending
};

// Receiver side: checks that writes land in ring order and hands slots back in ring order once
// the pieces in them were consumed. A slot held for a message whose receive is not posted yet
// holds back every slot after it: that is what bounds how far a fast sender can run ahead.
class ReceiveWindow {
 public:
  explicit ReceiveWindow(uint32_t slots);

  // A write landed in `slot`. ProtocolError naming the expected slot when out of order or
  // when the ring is full (the sender ignored its credits).
  void arrived(uint32_t slot);
  // The piece in `slot` was consumed. ProtocolError if it was not occupied.
  void release(uint32_t slot);
  // Credits to send back now: all the contiguous released slots when there are at least
  // `batch` of them (or any, when `force`), else 0. Counted as returned.
  uint32_t takeCredits(uint32_t batch, bool force = false);

  uint32_t occupied() const { return static_cast<uint32_t>(head_ - tail_); }
  uint32_t pendingCredits() const { return pending_; }

 private:
  uint32_t slots_;
  uint64_t head_ = 0;  // next write expected at head_ % slots_
  uint64_t tail_ = 0;  // oldest slot not yet released in order
  uint32_t pending_ = 0;
  std::vector<uint8_t> state_;  // 0 free, 1 occupied, 2 released out of order
};

}  // namespace railshard::transport::links::ibverbs
