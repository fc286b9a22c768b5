#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "base/trace.h"
#include "transport/message_tag.h"

namespace railshard::transport {

// One posted send or receive. Completed by the transport's progress engine; waited on through
// Transport::wait(). Shared between the poster and the engine, hence shared_ptr.
class Request {
 public:
  enum class Kind : uint8_t { kSend, kRecv };
  Request(Kind kind, int peer, size_t bytes, const MessageTag& tag)
      : kind_(kind),
        peer_(peer),
        bytes_(bytes),
        tag_(tag),
        posted_ns_(trace::enabled() ? trace::now() : 0) {}
  virtual ~Request() = default;

  Kind kind() const { return kind_; }
  int peer() const { return peer_; }
  size_t bytes() const { return bytes_; }
  const MessageTag& tag() const { return tag_; }
  // When it was posted (steady clock, ns), for its trace event; 0 when tracing was off.
  int64_t postedNs() const { return posted_ns_; }
  bool done() const { return done_.load(std::memory_order_acquire); }
  // A receive's bytes, once done(): bytes() unless it took a smaller message (a chosen
  // receive, messaging::MessageBook::postChosen). Written before markDone(), read after done().
  size_t received() const { return received_; }
  void setReceived(size_t bytes) { received_ = bytes; }
  // seq_cst, not release: the completer then reads the waiter count, and a release store may
  // be reordered after that load (x86 store buffer), losing the wake-up.
  void markDone() { done_.store(true, std::memory_order_seq_cst); }

 private:
  Kind kind_;
  int peer_;
  size_t bytes_;
  MessageTag tag_;
  int64_t posted_ns_;
  size_t received_ = bytes_;
  std::atomic<bool> done_{false};
};

using RequestPtr = std::shared_ptr<Request>;

}  // namespace railshard::transport
