#pragma once

// Scripted links for the messenger's unit tests (tests/messenger_test.cc): no I/O, no thread,
// no clock. What a messenger posts waits on the link's "wire" until the test delivers it to
// the other side; failures, completions and re-connections happen when the test says so.

#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/links/link.h"
#include "transport/messaging/messenger.h"

namespace railshard::test {

using transport::links::Delivery;
using transport::links::LinkAttributes;
using transport::links::LinkKind;
using transport::messaging::FrameHeader;
using transport::messaging::FrameKind;
using transport::messaging::Messenger;
using transport::messaging::OutFramePtr;

// The three kinds as they describe themselves: a socket (written = in its kernel, the
// messenger acknowledges), an RDMA lane (complete = in the peer's memory, slot-sized pieces,
// connected by records), a shared-memory channel (polled, 64 KiB entries).
inline LinkAttributes socketLike(const std::string& name, double gbps) {
  LinkAttributes a;
  a.kind = LinkKind::kTcp;
  a.name = name;
  a.gbps = gbps;
  a.delivery = Delivery::kAck;
  a.sees_peer_exit = true;
  a.redials = true;
  return a;
}
inline LinkAttributes laneLike(const std::string& name, double gbps) {
  LinkAttributes a;
  a.kind = LinkKind::kRdma;
  a.name = name;
  a.gbps = gbps;
  a.delivery = Delivery::kCompletion;
  a.max_payload = 8192;
  a.trace_name = "rdma_write";
  return a;
}
inline LinkAttributes channelLike(const std::string& name) {
  LinkAttributes a;
  a.kind = LinkKind::kShm;
  a.name = name;
  a.delivery = Delivery::kCompletion;
  a.max_payload = 64 << 10;
  a.polled = true;
  return a;
}

class FakeLink final : public transport::links::Link {
 public:
  explicit FakeLink(LinkAttributes attributes) : attributes_(std::move(attributes)) {}

  const LinkAttributes& attributes() const override { return attributes_; }
  bool canPost() const override { return !down && static_cast<int>(unfinished.size()) < room; }
  bool post(const OutFramePtr& frame) override {
    wire.push_back(Wire{frame->header, payloadOf(*frame)});
    ++posts;
    // A socket takes a frame whole into its kernel buffer: complete at once.
    if (attributes_.delivery == Delivery::kAck) return true;
    unfinished.push_back(frame);
    return false;
  }
  void postControl(const FrameHeader& header, const std::string& payload) override {
    if (!down) control.push_back(Wire{header, payload});
  }
  void shutdown() override {
    down = true;
    wire.clear();
    control.clear();
    unfinished.clear();
  }
  void detach() override { detached = true; }
  std::string connectRecord(uint32_t generation) override {
    return "record-" + attributes_.name + "-" + std::to_string(generation);
  }
  std::string acceptRecord(uint32_t generation, const std::string& record) override {
    accepted = record;
    down = false;
    return "answer-" + std::to_string(generation);
  }
  void completeRecord(uint32_t generation, const std::string& record) override {
    (void)generation;
    completed_with = record;
    down = false;
  }
  void redial(uint32_t generation) override { redials.push_back(generation); }
  uint64_t bytesTaken() const override { return taken; }

  struct Wire {
    FrameHeader header;
    std::string payload;
  };
  static std::string payloadOf(const transport::messaging::OutFrame& frame) {
    return std::string(reinterpret_cast<const char*>(frame.data), frame.header.length);
  }

  LinkAttributes attributes_;
  std::deque<Wire> wire;               // data frames posted, not yet delivered
  std::deque<Wire> control;            // control frames, not yet delivered
  std::deque<OutFramePtr> unfinished;  // posted, completion not yet reported (lanes)
  int room = INT_MAX;                  // frames it takes before it has no room
  uint64_t taken = 0;                  // bytesTaken(): what its "kernel" took, as the test says
  bool down = false;
  bool detached = false;
  int posts = 0;
  std::string accepted;
  std::string completed_with;
  std::vector<uint32_t> redials;
};

}  // namespace railshard::test
