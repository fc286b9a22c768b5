#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/clock.h"
#include "base/trace.h"
#include "base/types.h"
#include "transport/message_tag.h"
#include "transport/transport.h"

namespace railshard::collectives {

// Scratch memory reused across calls so the steady state allocates nothing.
class Workspace {
 public:
  uint8_t* get(size_t slot, size_t bytes) {
    if (buffers_.size() <= slot) buffers_.resize(slot + 1);
    if (buffers_[slot].size() < bytes) buffers_[slot].resize(bytes);
    return buffers_[slot].data();
  }

 private:
  std::vector<std::vector<uint8_t>> buffers_;
};

// Everything an algorithm needs for one collective call.
struct Context {
  transport::Transport& transport;
  int rank;
  int size;
  size_t chunk_bytes;
  Duration timeout;           // per wait
  transport::MessageTag tag;  // this collective's header; algorithms set .step
  Workspace& workspace;

  int next() const { return (rank + 1) % size; }
  int prev() const { return (rank + size - 1) % size; }
  transport::MessageTag tagAt(uint32_t step) const {
    transport::MessageTag t = tag;
    t.step = step;
    return t;
  }
  void wait(const transport::RequestPtr& request) const {
    trace::Span span(trace::Category::kWait, request->kind() == transport::Request::Kind::kSend
                                                 ? "wait_send"
                                                 : "wait_recv");
    if (span.active()) {
      span.event().peer = request->peer();
      span.event().bytes = request->bytes();
      span.event().seq = tag.sequence;
    }
    transport.wait(request, deadlineAfter(timeout));
  }
};

}  // namespace railshard::collectives
