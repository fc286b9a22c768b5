#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/clock.h"
#include "transport/messaging/frame.h"
#include "transport/request.h"

namespace railshard::transport::messaging {

struct Rendezvous;

// A send the user posted. It completes when every frame of it is released: delivered (or, on
// a link the messenger acknowledges, copied once written, so that the send completes before
// the acknowledgement); a rendezvous once its one-sided part is done too.
struct SendOp : Request {
  SendOp(int peer, const void* data_in, size_t bytes, const MessageTag& tag, uint64_t message_in)
      : Request(Kind::kSend, peer, bytes, tag),
        data(static_cast<const uint8_t*>(data_in)),
        message(message_in) {}
  const uint8_t* data;
  uint64_t message;
  // Guarded by the messenger's lock.
  int outstanding = 0;  // frames not yet released
  int unwritten = 0;    // frames not yet complete on their link
  bool waited = false;  // someone waits for it: once it is all written, what is kept is copied
  bool device = false;  // the buffer is GPU memory
  std::shared_ptr<Rendezvous> rendezvous;  // moved in place (messenger_rendezvous.cc)
};

// A receive the user posted; in GPU memory, pieces land in a host bounce and are copied in.
struct RecvOp : Request {
  RecvOp(int peer, size_t bytes, const MessageTag& tag) : Request(Kind::kRecv, peer, bytes, tag) {}
  bool device = false;
};

// One frame a messenger hands a link: queued, then posted, then (on a link it acknowledges, or
// several links to fail over between) kept until the peer has it.
struct OutFrame {
  FrameHeader header;
  const uint8_t* data = nullptr;  // header.length payload bytes: user memory, or `owned`
  std::string owned;
  std::shared_ptr<SendOp> op;  // the send it counts towards; null once released (or control)
  uint64_t seq = 0;            // its number among its link's sequenced frames
  bool device = false;         // `data` is GPU memory
  Clock::time_point posted{};  // handed to its link
  int64_t trace_ns = 0;        // trace clock when posted; 0 when tracing was off

  bool sequenced() const { return isSequenced(header); }
  // The payload from now on from a private copy (host memory only).
  void own() {
    if (data != reinterpret_cast<const uint8_t*>(owned.data()) || owned.size() != header.length) {
      owned.assign(reinterpret_cast<const char*>(data), header.length);
    }
    data = reinterpret_cast<const uint8_t*>(owned.data());
  }
};
using OutFramePtr = std::shared_ptr<OutFrame>;

}  // namespace railshard::transport::messaging
